"""Peak resident memory of one recipe row through `logitcomp run`, as a single model and composed, with the
composition scored in position chunks (today) and in one forward of every row (`scoring_budget = None`, what
scoring did before issue 28), each in its own process; prints them side by side and whether the metrics agree.

    HF_ALLOW_CODE_EVAL=1 python experiments/benchmarks/recipe_rss.py recipes/gemma3-math-code.yaml --tasks smol_text   # the recipe opts into code tasks

The recipe's base, experts, task folder, batch size and `compose:` block are used as they are; the rows are
`base` (single) and `composed` (every expert at weight 1). Each run writes into its own folder under --workdir.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

import yaml

from merging.tools.bench_child import child_args, emit, run_setups

SETUPS = {"single": ("base", True), "composed": ("composed", True), "composed-whole": ("composed", False)}


def child(args) -> None:
    import logitcomp.model
    from merging.recipe_file import load_recipe
    from merging.runner import run_recipe

    row, chunked = SETUPS[args.child]
    if not chunked:
        logitcomp.model.SCORING_BUDGET = None  # one forward of every row, as before the chunks
    recipe, paths = load_recipe(args.recipe)
    data = recipe.model_dump(mode="json", exclude_none=True)
    data.update(base=str(paths.base), experts={n: str(p) for n, p in paths.experts.items()}, variants=[row],
                output=str(Path(args.workdir).resolve() / args.child), name=f"rss-{args.child}")
    data["evaluate"].update(include_path=[str(p) for p in paths.include_paths], tasks=args.tasks or data["evaluate"]["tasks"])
    if args.limit is not None:
        data["evaluate"]["limit"] = args.limit
    data["evaluate"].pop("select_on", None)
    path = Path(args.workdir).resolve() / f"{args.child}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    results = run_recipe(path, force=True, echo=lambda *_: None)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    emit({"peak_gib": peak, "metrics": results[row]})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe")
    p.add_argument("--tasks", type=lambda s: s.split(","), help="comma-separated tasks (default: the recipe's)")
    p.add_argument("--limit", type=int, help="documents per task (default: the recipe's)")
    p.add_argument("--setups", default=",".join(SETUPS))
    p.add_argument("--workdir", type=Path)
    args = p.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="recipe-rss-"))
    results = run_setups([sys.executable, __file__], args, args.setups.split(","), workdir)
    single = results.get("single", {}).get("peak_gib")
    print(f"{'setup':<16} {'peak RSS GiB':>12} {'x single':>9}")
    for setup, r in results.items():
        print(f"{setup:<16} {r['peak_gib']:>12.2f} {r['peak_gib'] / single if single else float('nan'):>9.2f}")
    if {"composed", "composed-whole"} <= results.keys():
        a, b = results["composed"]["metrics"], results["composed-whole"]["metrics"]
        worst = max((abs(a[t][k] - b[t][k]) for t in a for k in a[t] if isinstance(a[t][k], float) and isinstance(b[t].get(k), float)),
                    default=0.0)
        print(f"composed chunked vs whole: metrics {'identical' if a == b else f'differ by at most {worst:.2e}'}")
    print(json.dumps({s: r["metrics"] for s, r in results.items()}))


if __name__ == "__main__":
    child(child_args(sys.argv[1:])) if "--child" in sys.argv else main()

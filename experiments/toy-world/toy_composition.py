"""Composition and merge of the toy experts over seeds: mean, min and max exact match per variant.

    python experiments/toy-world/toy_composition.py --worlds runs/toy-worlds --seeds 0 1 2 --out runs/toy-seeds

Builds (or reuses) one toy world per variant and seed under --worlds, then scores with greedy
exact match on the shipped 200-string evaluation sets of the pair (a2b_c2d) and triple
(a2b_c2d_e2f) tasks: each expert alone, the composition of the task's experts (weights 1) and
their task-arithmetic merge (weights 1, as one exact LoRA adapter: `bridge.merge_as_lora`).
Writes OUT/seeds.json and OUT/seeds.md and prints the Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from bridge import merge_as_lora
from logitcomp import ComposedModelForCausalLM
from logitcomp.io import atomic_write_bytes
from merging.worlds.toy import TASKS, ToyBuildError, ToyConfig, ToyWorld, make_eval_set
from merging.worlds.toy.build import world_at
from merging.worlds.toy.evaluate import exact_match

EVAL_TASKS = {"pair": ("a2b", "c2d"), "triple": ("a2b", "c2d", "e2f")}  # task -> the experts it needs


def _models(world: ToyWorld, experts: tuple[str, ...], merged_dir: Path) -> dict:
    """label -> model: the composition and the task-arithmetic merge of `experts`."""
    base = lambda: AutoModelForCausalLM.from_pretrained(world.base)  # noqa: E731
    paths = {n: world.expert(n) for n in experts}
    merged = PeftModel.from_pretrained(base(), merge_as_lora(world.base, paths, merged_dir)).eval()
    return {"composed": ComposedModelForCausalLM.from_experts(world.base, paths), "merged": merged}


def score_world(world: ToyWorld, size: int = 200) -> dict[str, dict[str, float]]:
    """model -> task (pair, triple) -> exact match: each expert alone, `composed` and `merged`."""
    tokenizer = AutoTokenizer.from_pretrained(world.base)
    tasks = {t.name: t for t in TASKS}
    docs = {label: make_eval_set(tasks["_".join(rules)], size=size) for label, rules in EVAL_TASKS.items()}
    scores: dict[str, dict[str, float]] = {}
    for name in world.config.experts:
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(world.base), world.expert(name)).eval()
        scores[name] = {label: exact_match(model, tokenizer, d) for label, d in docs.items()}
    with tempfile.TemporaryDirectory() as tmp:
        for label, rules in EVAL_TASKS.items():
            for kind, model in _models(world, rules, Path(tmp) / label).items():
                scores.setdefault(kind, {})[label] = exact_match(model, tokenizer, docs[label])
    return scores


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(runs: list[dict]) -> dict:
    """variant -> model -> task -> {mean, min, max, n}, with 'best expert' the best single expert per seed."""
    table: dict = {}
    for run in runs:
        scores = dict(run["scores"])
        experts = [n for n in scores if n not in ("composed", "merged")]
        scores["best expert"] = {t: max(scores[e][t] for e in experts) for t in EVAL_TASKS}
        for model in ("composed", "merged", "best expert"):
            for task in EVAL_TASKS:
                table.setdefault(run["variant"], {}).setdefault(model, {}).setdefault(task, []).append(scores[model][task])
    return {v: {m: {t: _spread(x) for t, x in ts.items()} for m, ts in ms.items()} for v, ms in table.items()}


def markdown(runs: list[dict], summary: dict) -> str:
    """The seed table (mean [min, max]) and one line per built world."""
    lines = ["| world | model | pair a2b_c2d | triple a2b_c2d_e2f |", "|---|---|---|---|"]
    for variant, models in summary.items():
        for model, tasks in models.items():
            cells = [f"{s['mean']:.1%} [{s['min']:.1%}, {s['max']:.1%}]" for s in tasks.values()]
            lines.append(f"| {variant} | {model} | {' | '.join(cells)} |")
    lines += ["", "| world | seed | build s | steps (base, experts) | own-task exact match (min) | checksum |", "|---|---|---|---|---|---|"]
    for run in runs:
        steps = ", ".join(str(f["steps"]) for f in run["training"].values())
        lines.append(f"| {run['variant']} | {run['seed']} | {run['build_seconds']:.0f} | {steps} | "
                     f"{min(run['accuracy'].values()):.1%} | {run['checksum'][:16]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=Path, default=Path("runs/toy-worlds"), help="where worlds are built or reused")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=["factorised", "entangled"])
    parser.add_argument("--out", type=Path, default=Path("runs/toy-seeds"))
    args = parser.parse_args()
    runs, failed = [], []
    for variant in args.variants:
        for seed in args.seeds:
            try:
                world = world_at(args.worlds.resolve(), ToyConfig(variant=variant, seed=seed))
            except ToyBuildError as exc:  # a world below its bar is a result too: listed, not averaged
                failed.append(f"{variant} seed {seed}: {exc}")
                print(failed[-1], flush=True)
                continue
            runs.append({"variant": variant, "seed": seed, "build_seconds": world.build_seconds,
                         "training": world.extra.get("training", {}), "accuracy": world.accuracy,
                         "checksum": world.checksums["world"], "scores": score_world(world)})
            print(f"{variant} seed {seed}: {json.dumps(runs[-1]['scores'])}", flush=True)
    summary = summarise(runs)
    text = markdown(runs, summary) + "".join(f"\nbuild failed: {f}\n" for f in failed)
    atomic_write_bytes(args.out / "seeds.json", (json.dumps({"summary": summary, "runs": runs, "failed": failed}, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "seeds.md", text.encode())
    print(text)


if __name__ == "__main__":
    main()

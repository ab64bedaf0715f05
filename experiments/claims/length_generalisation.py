"""Length generalisation: exact match by string length in a world that length-generalises and one that does not.

    python experiments/claims/length_generalisation.py --worlds runs/toy-worlds --seeds 0 --out runs/length

The paper's claim: when base and experts length-generalise, so does their composition. Two
factorised toy worlds are built (or reused) under --worlds, trained on lengths 1-16 only:
`copy` (x>y: the answer letter j is len(x) + 1 tokens after its source, a distance never seen
beyond 16) and `padded` (x padded with '.' to 32 letters: every answer letter is 33 tokens after
its source and EOS follows the first '.' after a letter, a fixed local rule; in training x sits at a
random offset in the field, so beyond 16 only the number of letters is new). Each is scored on 50 strings per
length bucket (1-16 trained; 17-20 ... 29-32 never seen) with greedy exact match (`free`) and with
the target's length forced (`oracle`: EOS barred before it, generation cut after it, letters
compared), which separates wrong letters from wrong stopping. Rows: the base on identity, each
expert on its own task, and the composition and the merges (task arithmetic, TIES) of a2b and c2d
on the pair task. With several --seeds the tables show the mean of the seeds (each seed's table is in
the JSON). Writes OUT/length.{json,md,png} and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from peft import PeftModel  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import bridge  # noqa: E402
from logitcomp import ComposedModelForCausalLM  # noqa: E402
from logitcomp.io import atomic_write_bytes  # noqa: E402
from merging.figures import figure_png  # noqa: E402
from merging.worlds.toy import ToyConfig, ToyWorld, make_eval_set  # noqa: E402
from merging.worlds.toy.build import world_at  # noqa: E402
from merging.worlds.toy.data import ToyTask  # noqa: E402
from merging.worlds.toy.evaluate import greedy_correct  # noqa: E402

BUCKETS = ((1, 16), (17, 20), (21, 24), (25, 28), (29, 32))
PER_BUCKET = 50
EXPERTS = ("a2b", "c2d")
MODES = ("free", "oracle")


def bucket_docs(rules: tuple[str, ...]) -> dict[str, list[dict]]:
    """bucket label -> seeded strings of that bucket's lengths holding every rule's letter."""
    name = "_".join(rules) or "identity"
    return {f"{lo}-{hi}": make_eval_set(ToyTask(f"{name}@{lo}-{hi}", rules, (lo, hi)), PER_BUCKET) for lo, hi in BUCKETS}


def models(world: ToyWorld, tmp: Path) -> dict[str, tuple[object, tuple[str, ...]]]:
    """row label -> (model, the rules of the task it is scored on)."""
    load = lambda: AutoModelForCausalLM.from_pretrained(world.base)  # noqa: E731
    paths = {n: world.expert(n) for n in EXPERTS}
    rows = {"base": (load().eval(), ())}
    for name in EXPERTS:
        rows[name] = (PeftModel.from_pretrained(load(), paths[name]).eval(), (name,))
    rows["composed"] = (ComposedModelForCausalLM.from_experts(world.base, paths), EXPERTS)
    rows["task arithmetic"] = (AutoModelForCausalLM.from_pretrained(bridge.task_arithmetic(world.base, paths, tmp / "ta")).eval(), EXPERTS)
    ties = bridge.task_arithmetic(world.base, paths, tmp / "ties", method="ties", parameters={"density": 0.5})
    rows["TIES (density 0.5)"] = (AutoModelForCausalLM.from_pretrained(ties).eval(), EXPERTS)
    return rows


def score_world(world: ToyWorld) -> dict[str, dict]:
    """row -> {task, free: {bucket: share}, oracle: {bucket: share}}."""
    tokenizer = AutoTokenizer.from_pretrained(world.base)
    docs: dict[tuple[str, ...], dict[str, list[dict]]] = {}
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (model, rules) in models(world, Path(tmp)).items():
            buckets = docs.setdefault(rules, bucket_docs(rules))
            row = {"task": "_".join(rules) or "identity"}
            for mode in MODES:
                row[mode] = {b: sum(greedy_correct(model, tokenizer, d, world.config.layout, mode == "oracle")) / len(d)
                             for b, d in buckets.items()}
            table[label] = row
    return table


def mean_rows(tables: list[dict]) -> dict:
    """The rows of several seeds' tables averaged cell by cell."""
    return {label: {"task": row["task"], **{m: {b: statistics.fmean(t[label][m][b] for t in tables) for b in row[m]}
                                             for m in MODES}} for label, row in tables[0].items()}


def markdown(results: dict) -> str:
    heads = [f"{lo}-{hi}" + (" (trained)" if hi <= 16 else "") for lo, hi in BUCKETS]
    lines = []
    for layout, r in results.items():
        seeds = ", ".join(str(s) for s in r["seeds"])
        builds = ", ".join(f"{w['build_seconds']:.0f}" for w in r["seeds"].values())
        lines += [f"\n{layout} world (factorised; seeds {seeds}, mean; build {builds} s): exact match free / oracle length",
                  "", "| model | task | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
        for label, row in r["mean"].items():
            cells = [f"{row['free'][b]:.0%} / {row['oracle'][b]:.0%}" for b in row["free"]]
            lines.append(f"| {label} | {row['task']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), sharey=True, squeeze=False)
    x = [(lo + hi) / 2 for lo, hi in BUCKETS]
    for ax, (layout, r) in zip(axes[0], results.items()):
        for i, (label, row) in enumerate(r["mean"].items()):
            color = f"C{i}"
            ax.plot(x, list(row["free"].values()), "-o", color=color, label=f"{label} ({row['task']})")
            ax.plot(x, list(row["oracle"].values()), "--", color=color, alpha=0.6)
        ax.axvspan(0, 16.5, color="0.9", zorder=0)
        ax.set(title=f"{layout} world (dashed: oracle length)", xlabel="string length (bucket centre; grey: trained)",
               ylabel="exact match", ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
    atomic_write_bytes(path, figure_png(fig))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=Path, default=Path("runs/toy-worlds"), help="where worlds are built or reused")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path("runs/length"))
    args = parser.parse_args()
    start, results = time.perf_counter(), {}
    for layout in ("padded", "copy"):
        worlds = {}
        for seed in args.seeds:
            world = world_at(args.worlds.resolve(), ToyConfig(layout=layout, seed=seed))
            worlds[seed] = {"build_seconds": world.build_seconds, "checksum": world.checksums["world"], "rows": score_world(world)}
            print(f"{layout} seed {seed}: scored", flush=True)
        results[layout] = {"seeds": worlds, "mean": mean_rows([w["rows"] for w in worlds.values()])}
    text = markdown(results)
    results["seconds"] = round(time.perf_counter() - start, 1)
    atomic_write_bytes(args.out / "length.json", (json.dumps(results, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "length.md", text.encode())
    plot({k: v for k, v in results.items() if k != "seconds"}, args.out / "length.png")
    print(text + f"\n{results['seconds']:.0f} s in all; {args.out / 'length.png'}")


if __name__ == "__main__":
    main()

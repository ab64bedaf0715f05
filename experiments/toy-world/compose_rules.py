"""Composition rules on the toy world: parameters chosen on validation strings, scored on the test set.

    python experiments/toy-world/compose_rules.py --worlds runs/toy-worlds --variant entangled --seeds 0 1 2 --out runs/toy-rules

For each seed's world (built or reused as in experiments/toy-world/toy_composition.py) and each rule with each
candidate parameter (GRID), greedy exact match of the composition of the task's experts on the pair
(a2b_c2d) and triple (a2b_c2d_e2f) tasks: on the validation strings (toy.make_validation_set: seed 4321,
100 per task, none of them a test string; the shipped toy_*_val tasks) for every
candidate, then on the shipped test strings (seed 1234, 200 per task) for the one candidate per
rule with the best mean validation score over both tasks and every seed (ties: the first in GRID).
The test strings never choose anything. Writes OUT/rules.json and OUT/rules.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from transformers import AutoTokenizer

from logitcomp import ComposedModelForCausalLM, CompositionConfig
from logitcomp.io import atomic_write_bytes
from merging.worlds.toy import TASKS, ToyConfig, make_eval_set, make_validation_set
from merging.worlds.toy.build import world_at
from merging.worlds.toy.evaluate import exact_match
from toy_composition import EVAL_TASKS

GRID: dict[str, list[dict]] = {
    "product": [{}],
    "tempered": [{"scale": s} for s in (0.5, 0.75)],
    "activity": [{"gamma": g} for g in (0.5, 1.0, 2.0, 4.0)],
    "confident": [{"gamma": g} for g in (1.0, 4.0, 16.0)],
    "union": [{}],
    "plausible": [{"alpha": a} for a in (0.01, 0.1, 0.3)],
}


def score(world, rule: str, params: dict, docs: dict[str, list[dict]]) -> dict[str, float]:
    """task (pair, triple) -> exact match of the composition of that task's experts under `rule`."""
    tokenizer = AutoTokenizer.from_pretrained(world.base)
    config = CompositionConfig(rule=rule, rule_params=params)
    out = {}
    for label, rules in EVAL_TASKS.items():
        composed = ComposedModelForCausalLM.from_experts(world.base, {n: world.expert(n) for n in rules}, config=config)
        out[label] = exact_match(composed, tokenizer, docs[label])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=Path, default=Path("runs/toy-worlds"))
    parser.add_argument("--variant", default="entangled", choices=["factorised", "entangled"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/toy-rules"))
    parser.add_argument("--rules", nargs="+", default=list(GRID), help="a subset of the rules in GRID")
    args = parser.parse_args()
    tasks = {t.name: t for t in TASKS}
    val = {label: make_validation_set(tasks["_".join(r)]) for label, r in EVAL_TASKS.items()}
    test = {label: make_eval_set(tasks["_".join(r)]) for label, r in EVAL_TASKS.items()}
    worlds = {seed: world_at(args.worlds.resolve(), ToyConfig(variant=args.variant, seed=seed)) for seed in args.seeds}
    validation, chosen, results = {}, {}, {}
    for rule, candidates in ((r, GRID[r]) for r in args.rules):
        means = []
        for params in candidates:
            runs = {seed: score(w, rule, params, val) for seed, w in worlds.items()}
            validation.setdefault(rule, []).append({"params": params, "scores": runs})
            means.append(statistics.fmean(s for r in runs.values() for s in r.values()))
            print(f"validation {rule} {params}: {means[-1]:.3f}", flush=True)
        chosen[rule] = candidates[max(range(len(means)), key=lambda i: (means[i], -i))]
        results[rule] = {seed: score(w, rule, chosen[rule], test) for seed, w in worlds.items()}
        print(f"test {rule} {chosen[rule]}: {json.dumps(results[rule])}", flush=True)
    lines = [f"toy {args.variant} world, seeds {args.seeds}: greedy exact match on the test strings, mean [min, max] over seeds",
             "", "| rule | parameters (chosen on validation) | pair a2b_c2d | triple a2b_c2d_e2f |", "|---|---|---|---|"]
    for rule, runs in results.items():
        cells = []
        for task in EVAL_TASKS:
            values = [r[task] for r in runs.values()]
            cells.append(f"{statistics.fmean(values):.1%} [{min(values):.1%}, {max(values):.1%}]")
        lines.append(f"| {rule} | {chosen[rule] or '-'} | {' | '.join(cells)} |")
    text = "\n".join(lines) + "\n"
    record = {"variant": args.variant, "seeds": args.seeds, "grid": GRID, "validation": validation, "chosen": chosen, "test": results}
    atomic_write_bytes(args.out / "rules.json", (json.dumps(record, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "rules.md", text.encode())
    print(text)


if __name__ == "__main__":
    main()

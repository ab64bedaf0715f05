"""Routing accuracy of hidden-state routing (`logitcomp.routing`) on a world's validation prompts.

    python scripts/routing_accuracy.py smol_world --experts math,code,shout \
        --tasks smol_math_val=math,smol_code_val=code,smol_shout_val=shout,smol_math_shout_val=math+shout

Centroids come from each expert's `prompts.jsonl` (its training prompts, as a recipe's `route:` reads them);
each task's prompts are lm-eval's own contexts of its validation documents. For a task with one expert,
`top` is the share of prompts whose top-posterior expert (at the prompt's last token) is that expert; for a
task that needs several (`a+b`), `both` is the share where every one of them keeps a gate ≥ 0.3 (the
threshold a routed row composes them at) and `extra` the mean gate of the others. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp.routing import Router, fit_centroids, prompt_means
from merging.pool import read_prompts

TASKS = Path(__file__).resolve().parents[1] / "recipes" / "tasks"
BOTH = 0.3


def task_prompts(task: str) -> list[str]:
    """The contexts lm-eval gives a model for the task's evaluation documents (validation split first)."""
    from lm_eval.tasks import TaskManager, get_task_dict

    t = get_task_dict([task], TaskManager(include_path=str(TASKS), include_defaults=False))[task]
    docs = t.validation_docs() if t.has_validation_docs() else t.test_docs()
    return [t.doc_to_text(d) for d in docs]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("world", type=Path)
    parser.add_argument("--experts", required=True)
    parser.add_argument("--tasks", required=True, help="TASK=EXPERT[+EXPERT],...")
    parser.add_argument("--tau", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    args = parser.parse_args(argv)
    experts = args.experts.split(",")
    tok = AutoTokenizer.from_pretrained(args.world / "base")
    base = AutoModelForCausalLM.from_pretrained(args.world / "base").eval()
    prompts = {e: read_prompts(f"experts.{e}", args.world / "experts" / e / "prompts.jsonl", 200) for e in experts}
    with torch.no_grad():
        centroids = fit_centroids(base, tok, prompts)
        centroids = torch.tensor([centroids[e] for e in experts])  # (k, d)
        means = {task: prompt_means(base, tok, task_prompts(task)) for task in (t.split("=")[0] for t in args.tasks.split(","))}
    rows = []
    for tau in args.tau:
        router = Router(centroids, tau, 0.0)
        for item in args.tasks.split(","):
            task, wanted = item.split("=")
            wanted = [experts.index(e) for e in wanted.split("+")]
            gates = router.gates(means[task])  # (n, k)
            if len(wanted) == 1:
                share = (gates.argmax(-1) == wanted[0]).float().mean().item()
                rows.append((tau, task, "top", share, gates.mean(0).tolist()))
            else:
                share = (gates[:, wanted] >= BOTH).all(-1).float().mean().item()
                rows.append((tau, task, "both", share, gates.mean(0).tolist()))
    print(f"| τ | task | measure | share | mean gate ({', '.join(experts)}) |\n|---|---|---|---|---|")
    for tau, task, measure, share, mean in rows:
        print(f"| {tau:g} | {task} | {measure} | {share:.2f} | {', '.join(f'{g:.2f}' for g in mean)} |")
    print(json.dumps({"experts": experts, "rows": rows}))


if __name__ == "__main__":
    main()

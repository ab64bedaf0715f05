"""Routing accuracy of hidden-state routing (`logitcomp.routing`) on a world's validation prompts.

    python scripts/routing_accuracy.py smol_world --experts math,code,shout \
        --tasks smol_math_val=math,smol_code_val=code,smol_shout_val=shout,smol_math_shout_val=math+shout
    python scripts/routing_accuracy.py smol_world --experts math,code,shout,xml --tasks ... \
        --score discriminant --shrinkage 0.1 1 --threshold 0.5 0.7

Centroids (and with `--score discriminant` the detectors) come from each expert's `prompts.jsonl` (its
training prompts, as a recipe's `route:` reads them); each task's prompts are lm-eval's own contexts of its
validation documents. Per task, at the prompt's last token: `top` is the share of prompts whose top-gated
expert is the task's expert (one-expert tasks), `exact` the share whose composed experts (gate > 0 at the
threshold θ) are exactly the task's experts (`a+b`: both kept, no other). Prints a markdown table and JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp.config import ROUTING_SCORES
from logitcomp.routing import Router, expert_prompt_means, prompt_means, routing_config
from merging.pool import read_prompts

TASKS = Path(__file__).resolve().parents[1] / "recipes" / "tasks"


def task_prompts(task: str) -> list[str]:
    """The contexts lm-eval gives a model for the task's evaluation documents (validation split first)."""
    from lm_eval.tasks import TaskManager, get_task_dict

    t = get_task_dict([task], TaskManager(include_path=str(TASKS), include_defaults=False))[task]
    docs = t.validation_docs() if t.has_validation_docs() else t.test_docs()
    return [t.doc_to_text(d) for d in docs]


def settings(args) -> list[tuple[str, dict]]:
    """(label, routing_config keywords) of every τ (cosine) or λ (discriminant) at every θ."""
    values = args.tau if args.score == "cosine" else args.shrinkage
    key = "tau" if args.score == "cosine" else "shrinkage"
    return [(f"{'τ' if key == 'tau' else 'λ'} {v:g}, θ {t:g}", {key: v, "threshold": t}) for v in values for t in args.threshold]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("world", type=Path)
    parser.add_argument("--experts", required=True)
    parser.add_argument("--tasks", required=True, help="TASK=EXPERT[+EXPERT],...")
    parser.add_argument("--score", choices=ROUTING_SCORES, default="cosine")
    parser.add_argument("--tau", type=float, nargs="+", default=[0.05, 0.1, 0.2], help="cosine posteriors' temperatures")
    parser.add_argument("--shrinkage", type=float, nargs="+", default=[1.0], help="the discriminant's covariance shrinkage λ")
    parser.add_argument("--threshold", type=float, nargs="+", default=[0.3], help="θ: gates below θ · the top one's are 0")
    args = parser.parse_args(argv)
    experts = args.experts.split(",")
    tasks = [(t.split("=")[0], [experts.index(e) for e in t.split("=")[1].split("+")]) for t in args.tasks.split(",")]
    tok = AutoTokenizer.from_pretrained(args.world / "base")
    base = AutoModelForCausalLM.from_pretrained(args.world / "base").eval()
    prompts = {e: read_prompts(f"experts.{e}", args.world / "experts" / e / "prompts.jsonl", 200) for e in experts}
    with torch.no_grad():
        train = expert_prompt_means(base, tok, prompts)
        means = {task: prompt_means(base, tok, task_prompts(task)) for task, _ in tasks}
    rows = []
    for label, keywords in settings(args):
        router = Router.from_config(routing_config(train, score=args.score, **keywords), experts)
        for task, wanted in tasks:
            gates = router.gates(means[task])  # (n, k)
            top = (gates.argmax(-1) == wanted[0]).float().mean().item() if len(wanted) == 1 else None
            chosen = torch.zeros(len(experts), dtype=torch.bool)
            chosen[wanted] = True
            exact = ((gates > 0) == chosen).all(-1).float().mean().item()
            rows.append((label, task, top, exact, gates.mean(0).tolist()))
    print(f"| {args.score} | task | top | exact | mean gate ({', '.join(experts)}) |\n|---|---|---|---|---|")
    for label, task, top, exact, mean in rows:
        print(f"| {label} | {task} | {'-' if top is None else f'{top:.2f}'} | {exact:.2f} | {', '.join(f'{g:.2f}' for g in mean)} |")
    print(json.dumps({"experts": experts, "score": args.score, "rows": rows}))


if __name__ == "__main__":
    main()

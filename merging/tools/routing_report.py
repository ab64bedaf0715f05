"""Routing accuracy of hidden-state routing (`logitcomp.routing`) on a world's validation prompts.

    logitcomp routing-report smol_world --experts math,code,shout \
        --tasks smol_math_val=math,smol_code_val=code,smol_shout_val=shout,smol_math_shout_val=math+shout
    logitcomp routing-report smol_world --experts math,code,shout,xml --tasks ... \
        --score discriminant --shrinkage 0.1 1 --threshold 0.5 0.7

Centroids (and with `--score discriminant` the detectors) come from each expert's `prompts.jsonl` (its
training prompts, as a recipe's `route:` reads them); each task's prompts are lm-eval's own contexts of its
validation documents. Per task, at the prompt's last token: `top` is the share of prompts whose top-gated
expert is the task's expert (one-expert tasks), `exact` the share whose composed experts (gate > 0 at the
threshold θ) are exactly the task's experts (`a+b`: both kept, no other). Prints a markdown table and JSON.

`--fit-floors` (with `--score discriminant`) chooses each expert's floor on these tasks' prompts, which must be
validation prompts (`logitcomp.routing_fit.fit_floors`, what a `routed` row of a recipe fits in its run); it
prints the floors and the table with them.

`--evidence` (with `--score discriminant`) prints instead each expert's detector score z_i (before the clamp
at 0; 1 on average over its own training prompts, 0 over the other experts') on each task's prompts: mean
[min, max], what decides which experts a threshold can keep. `--pool` (with `--score discriminant`): `mean`
(the default) and `max` are routing's own poolings (`route: {pool: max}`: token-level detectors, each one's
maximum over the prompt's tokens, `logitcomp.routing.peak_detectors`); `last` probes the hidden state of the
prompt's last token instead of the mean over its tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp.prompts import read_prompts
from logitcomp.routing import Router, expert_prompt_states, prompt_means, prompt_tokens, routing_config, threshold_gates
from logitcomp.routing_fit import fit_floors, prompt_scores
from merging.harness.evaluate import task_prompts

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"  # the shipped tasks (a source checkout)


def pooled_scores(train: dict[str, list[torch.Tensor]], tasks: dict[str, list[torch.Tensor]], pool: str,
                  shrinkage: float) -> dict[str, torch.Tensor]:
    """Task -> the detectors' scores z (n, k) of its prompts, from each prompt's token states (T_i, d) pooled
    by `pool` (the module's docstring); the experts in `train`'s order."""
    experts = list(train)
    if pool in ("mean", "last"):
        reduce = (lambda h: h.mean(0)) if pool == "mean" else (lambda h: h[-1])  # noqa: E731
        feats = {e: torch.stack([reduce(h) for h in hs]) for e, hs in train.items()}  # (n_e, d)
        router = Router.from_config(routing_config(feats, score="discriminant", shrinkage=shrinkage), experts)
        return {t: router.scores(torch.stack([reduce(h) for h in hs])) for t, hs in tasks.items()}
    routing = routing_config(train, score="discriminant", shrinkage=shrinkage, pool="max")
    return {t: prompt_scores(routing, experts, hs) for t, hs in tasks.items()}  # (n, k): each detector's max, as routing_fit scores


def print_evidence(scores: dict[float, dict[str, torch.Tensor]], experts: list[str]) -> None:
    """Per λ: each task's detector scores z (n, k) as `mean [min, max]` per expert, a markdown table and JSON."""
    rows = []
    for value, by_task in scores.items():
        for task, z in by_task.items():
            rows.append((value, task, z.mean(0).tolist(), z.amin(0).tolist(), z.amax(0).tolist()))
    print(f"| λ | task | {' | '.join(f'z {e}' for e in experts)} |\n|---|---|{'---|' * len(experts)}")
    for value, task, mean, low, high in rows:
        print(f"| {value:g} | {task} | " + " | ".join(f"{a:.2f} [{b:.2f}, {c:.2f}]" for a, b, c in zip(mean, low, high)) + " |")
    print(json.dumps({"experts": experts, "evidence": rows}))


def settings(args) -> list[tuple[str, dict]]:
    """(label, routing_config keywords) of every τ (cosine) or λ (discriminant) at every θ."""
    values = args.tau if args.score == "cosine" else args.shrinkage
    key = "tau" if args.score == "cosine" else "shrinkage"
    return [(f"{'τ' if key == 'tau' else 'λ'} {v:g}, θ {t:g}", {key: v, "threshold": t}) for v in values for t in args.threshold]


def run(args) -> int:
    """`logitcomp routing-report WORLD --experts ... --tasks ...`: the table (and JSON) of the module's docstring."""
    if (args.evidence or args.fit_floors or args.pool != "mean") and args.score != "discriminant":
        raise ValueError("--evidence, --fit-floors and --pool last/max: the detectors' scores need --score discriminant")
    experts = args.experts.split(",")
    tasks = [(t.split("=")[0], [experts.index(e) for e in t.split("=")[1].split("+")]) for t in args.tasks.split(",")]
    tok = AutoTokenizer.from_pretrained(args.world / "base")
    base = AutoModelForCausalLM.from_pretrained(args.world / "base").eval()
    prompts = {e: read_prompts(f"experts.{e}", args.world / "experts" / e / "prompts.jsonl", 200) for e in experts}
    with torch.no_grad():
        if args.score == "cosine":
            train = expert_prompt_states(base, tok, prompts)
            means = {task: prompt_means(base, tok, task_prompts(task, [args.include_path or TASKS])) for task, _ in tasks}
        else:
            states = expert_prompt_states(base, tok, prompts, pool="max")  # every token: each pooling below reads them
            task_states = {task: prompt_tokens(base, tok, task_prompts(task, [args.include_path or TASKS])) for task, _ in tasks}
            scores = {v: pooled_scores(states, task_states, args.pool, v) for v in args.shrinkage}
    if args.evidence:
        print_evidence(scores, experts)
        return 0
    floors = {v: fit_floors(by_task, dict(tasks), experts) for v, by_task in scores.items()} if args.fit_floors else {}
    for value, chosen in floors.items():
        print(f"floors at λ {value:g}: {json.dumps(chosen)}")
    rows = []
    for label, keywords in settings(args):
        if args.score == "cosine":
            router = Router.from_config(routing_config(train, score=args.score, **keywords), experts)
        for task, wanted in tasks:
            if args.score == "cosine":
                gates = router.gates(means[task])  # (n, k)
            else:
                floor = torch.tensor([floors.get(keywords["shrinkage"], {}).get(e, 0.0) for e in experts])  # (k,): 0 without --fit-floors
                gates = threshold_gates((scores[keywords["shrinkage"]][task] - floor).clamp(min=0), keywords["threshold"])
            top = (gates.argmax(-1) == wanted[0]).float().mean().item() if len(wanted) == 1 else None
            chosen = torch.zeros(len(experts), dtype=torch.bool)
            chosen[wanted] = True
            exact = ((gates > 0) == chosen).all(-1).float().mean().item()
            rows.append((label, task, top, exact, gates.mean(0).tolist()))
    print(f"| {args.score} | task | top | exact | mean gate ({', '.join(experts)}) |\n|---|---|---|---|---|")
    for label, task, top, exact, mean in rows:
        print(f"| {label} | {task} | {'-' if top is None else f'{top:.2f}'} | {exact:.2f} | {', '.join(f'{g:.2f}' for g in mean)} |")
    print(json.dumps({"experts": experts, "score": args.score, "floors": floors, "rows": rows}))
    return 0

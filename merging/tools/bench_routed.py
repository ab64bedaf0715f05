"""The routed setups of the benchmarks (`logitcomp bench decode|memory --routed K,K`): K LoRA experts installed, each
prompt keeping one of them (prompt b keeps expert b mod K, a batch of mixed prompts), held from the prompt as the
shipped routed rows hold them, beside the 1-expert composition; `-dense`: every expert computed for every input."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def routed_ks(args) -> list[int]:
    """The numbers of installed experts of the routed setups (`--routed`)."""
    return [int(k) for k in args.routed.split(",")] if args.routed else []


def designed_routing(means: torch.Tensor, keep: torch.Tensor, names: list[str]) -> dict:
    """A routing (discriminant detectors, pool mean, binary gates held from the prompt) under which the prompt whose
    mean hidden state is means[b] (B, d) keeps exactly the experts keep[b] (B, k) names: each detector solved by least
    squares to score +1 on the prompts that keep it and -1 on the others (exact for B <= d; centroids random)."""
    means = means.double()
    centroids = torch.randn(len(names), means.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # (k, d)
    design = torch.cat([means - centroids.mean(0), -torch.ones(len(means), 1, dtype=torch.float64)], 1)  # (B, d + 1)
    solved = torch.linalg.lstsq(design, keep.double() * 2 - 1).solution  # (d + 1, k): each detector's [v; o]
    return {"centroids": {n: centroids[i].tolist() for i, n in enumerate(names)},
            "detectors": {n: {"direction": solved[:-1, i].tolist(), "offset": float(solved[-1, i])} for i, n in enumerate(names)},
            "tau": 0.1, "threshold": 0.0, "gates": "binary", "update": False, "pool": "mean"}


@torch.no_grad()
def routed_model(setup: str, base: Path, root: Path, ids: torch.Tensor, dtype, device):
    """`composed-k1` (one expert, fixed weight) or `routed-kK[-dense]`: the experts e0 .. e(K-1) under `root`, routed
    so that prompt b of `ids` (B, T) keeps expert b mod K alone (a batch of mixed prompts); `-dense`: every expert
    computed for every input (the composition before issue 55, `skip_unused_experts = False`). Prints each prompt's
    kept set (to stderr)."""
    from logitcomp import ComposedModelForCausalLM

    k = int(setup.removeprefix("routed-k").removeprefix("composed-k").removesuffix("-dense"))
    names = [f"e{i}" for i in range(k)]
    model = ComposedModelForCausalLM.from_experts(base, {n: root / n for n in names}, dtype=dtype, device=device)
    if setup.startswith("routed"):
        with model.model.disable_adapter():  # the base alone
            means = model.model(input_ids=ids, output_hidden_states=True, logits_to_keep=1).hidden_states[-1].mean(1).cpu()  # (B, d)
        keep = torch.zeros(len(ids), k, dtype=torch.bool)
        keep[torch.arange(len(ids)), torch.arange(len(ids)) % k] = True  # (B, k)
        model.composition = model.composition.with_routing(designed_routing(means, keep, names))
        got = model(ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1).cache.layout.keep  # (B, k)
        print(f"{setup}: kept sets {[[names[j] for j in range(k) if row[j]] for row in got.tolist()]}", file=sys.stderr)
        model.skip_unused_experts = not setup.endswith("-dense")
    return model


def report_routed(args, results: dict) -> None:
    """The routed setups (one expert kept per prompt) against the 1-expert composition and the single model."""
    one, single = results.get("composed-k1"), results.get("single")
    if not one:
        return
    for name in [n for n in results if n.startswith("routed-k")]:
        r = results[name]
        versus = f", {r['steps_per_s'] / single['steps_per_s']:.2f}x single" if single else ""
        print(f"{name} (one expert kept per prompt): {r['steps_per_s'] / one['steps_per_s']:.2f}x the steps/s of the 1-expert "
              f"composition{versus}")

"""Independent references: separately loaded (merged) HF models and the rule applied by hand."""

from __future__ import annotations

from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def merged_expert(base_dir: Path, expert_dir: Path):
    """A plain HF model for one expert: LoRA merged into a fresh copy of the base, or the full model."""
    if (Path(expert_dir) / "adapter_config.json").exists():
        return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), expert_dir).merge_and_unload().eval()
    return AutoModelForCausalLM.from_pretrained(expert_dir).eval()


@torch.no_grad()
def row_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of one unpadded row, in float64: (T, V)."""
    return torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)


def hand_compose(base: torch.Tensor, experts: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """log_softmax(log p_b + Σ w_i (log p_i − log p_b)), written out on its own."""
    total = base.clone()
    for e, w in zip(experts, weights):
        total = total + w * (e - base)
    return total - torch.logsumexp(total, -1, keepdim=True)

"""Greedy exact-match accuracy with plain transformers/peft generation."""

from __future__ import annotations

from collections import defaultdict

import torch
from transformers import PreTrainedTokenizerBase

from .data import prompt_of


@torch.no_grad()
def exact_match(model, tokenizer: PreTrainedTokenizerBase, docs: list[dict]) -> float:
    """Share of docs whose greedy continuation is exactly the target followed by EOS.

    Prompts are grouped by length so that no batch needs padding.
    """
    groups: dict[int, list[dict]] = defaultdict(list)
    for d in docs:
        groups[len(d["input"])].append(d)
    correct = 0
    for length, group in groups.items():
        ids = tokenizer([prompt_of(d["input"]) for d in group], return_tensors="pt").input_ids  # (B, T)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=length + 2,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )  # (B, T + new)
        for d, row in zip(group, out[:, ids.shape[1] :].tolist()):
            expected = tokenizer(d["target"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
            correct += row[: len(expected)] == expected
    return correct / len(docs)


@torch.no_grad()
def teacher_forced_exact(model, inputs: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of rows whose every scored label is the argmax, the inputs fed as given (e.g. corrupted).

    Args:
        inputs (B, T), labels (B, T) with -100 where unscored, mask (B, T): a `make_batch` batch.
    """
    predicted = model(input_ids=inputs, attention_mask=mask).logits.argmax(-1)  # (B, T)
    scored = labels != -100  # (B, T)
    return ((predicted == labels) | ~scored).all(-1).float().mean().item()

"""Greedy exact-match accuracy with plain transformers/peft generation."""

from __future__ import annotations

from collections import defaultdict

import torch
from transformers import PreTrainedTokenizerBase

from .data import prompt_of


@torch.no_grad()
def greedy_correct(model, tokenizer: PreTrainedTokenizerBase, docs: list[dict], layout: str = "copy",
                   oracle_length: bool = False) -> list[bool]:
    """Whether each doc's greedy continuation is exactly its target followed by EOS, in docs' order.

    Prompts are grouped by length so that no batch needs padding.

    Args:
        oracle_length: force the target's length (EOS barred before it, generation cut after it) and
            compare the letters only: separates wrong letters from wrong stopping.
    """
    groups: dict[int, list[int]] = defaultdict(list)
    for i, d in enumerate(docs):
        groups[len(d["input"])].append(i)
    correct = [False] * len(docs)
    for length, group in groups.items():
        ids = tokenizer([prompt_of(docs[i]["input"], layout) for i in group], return_tensors="pt").input_ids  # (B, T)
        n_new = dict(min_new_tokens=length, max_new_tokens=length) if oracle_length else dict(max_new_tokens=length + 2)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **n_new,
        )  # (B, T + new)
        for i, row in zip(group, out[:, ids.shape[1] :].tolist()):
            expected = tokenizer(docs[i]["target"], add_special_tokens=False).input_ids
            if not oracle_length:
                expected += [tokenizer.eos_token_id]
            correct[i] = row[: len(expected)] == expected
    return correct


def exact_match(model, tokenizer: PreTrainedTokenizerBase, docs: list[dict], layout: str = "copy") -> float:
    """Share of docs whose greedy continuation is exactly the target followed by EOS."""
    return sum(greedy_correct(model, tokenizer, docs, layout)) / len(docs)


@torch.no_grad()
def teacher_forced_exact(model, inputs: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of rows whose every scored label is the argmax, the inputs fed as given (e.g. corrupted).

    Args:
        inputs (B, T), labels (B, T) with -100 where unscored, mask (B, T): a `make_batch` batch.
    """
    predicted = model(input_ids=inputs, attention_mask=mask).logits.argmax(-1)  # (B, T)
    scored = labels != -100  # (B, T)
    return ((predicted == labels) | ~scored).all(-1).float().mean().item()

"""The composition-vs-merge diagnostic (`bridge.compare`) on a toy task's answer positions."""

from __future__ import annotations

from bridge import compare
from bridge.diagnostics import Comparison

from .data import prompt_of


def answer_batch(tokenizer, docs: list[dict], layout: str = "copy"):
    """Left-padded prompt + target + EOS of every doc, and the (B, T) bool of the positions that predict the
    answer letters and EOS (from the separator to the last letter)."""
    texts = [prompt_of(d["input"], layout) + d["target"] + tokenizer.eos_token for d in docs]
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    sep = tokenizer.convert_tokens_to_ids(">")
    after_sep = (batch.input_ids == sep).long().cumsum(-1) > 0  # (B, T)
    return batch, after_sep & (batch.input_ids != tokenizer.eos_token_id)


def compare_on_docs(composed, merged, tokenizer, docs: list[dict], layout: str = "copy",
                    threshold: float = 0.1) -> tuple[Comparison, object]:
    """`bridge.compare` of `composed` and `merged` on the docs' answer positions. Returns (comparison, batch)."""
    batch, score = answer_batch(tokenizer, docs, layout)
    return compare(composed, merged, batch, threshold=threshold, score=score), batch

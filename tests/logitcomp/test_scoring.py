"""Scoring every position in chunks (issue 28.1): a forward that returns every position's composed
log-probs runs `chunk` positions at a time through a KV cache, so that the k + 1 models' full-vocabulary
logits of only one chunk exist at once. In float64 it equals one forward (what it replaced) to 1e-6:
log-probs, loss, trace and gradients, with left padding, LoRA and full-model experts, and on Gemma 3's
sliding-window layers."""

from __future__ import annotations

import pytest
import torch

from logitcomp import ComposedModelForCausalLM
from logitcomp.scoring import scoring_chunk

from test_gemma3_architecture import VOCAB as GEMMA_VOCAB, make_tiny_gemma3


def _batch(vocab: int, lengths=(13, 11, 6)):
    """Left-padded rows (B, T) and their mask."""
    gen = torch.Generator().manual_seed(5)
    width = max(lengths)
    ids = torch.randint(4, vocab, (len(lengths), width), generator=gen)
    mask = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
    ids[0, 0], ids[1, 0] = 1, 1
    return ids.masked_fill(mask == 0, 0), mask


def _chunked(composed, batch: int, chunk: int) -> None:
    """Set the scoring budget to exactly `chunk` positions per forward."""
    vocab = composed.config.get_text_config().vocab_size
    composed.scoring_budget = chunk * batch * (1 + len(composed.experts)) * vocab
    assert scoring_chunk(composed, batch, 1000) == chunk


def _compare(composed, ids, mask, chunks) -> float:
    real = mask.bool()
    composed.scoring_budget = None
    whole = composed(ids, attention_mask=mask, labels=ids.masked_fill(~real, -100), output_trace=True)
    worst = 0.0
    for chunk in chunks:
        _chunked(composed, ids.shape[0], chunk)
        part = composed(ids, attention_mask=mask, labels=ids.masked_fill(~real, -100), output_trace=True)
        assert part.logits.shape == whole.logits.shape
        worst = max(worst, (part.logits[real] - whole.logits[real]).abs().max().item(),
                    abs(part.loss.item() - whole.loss.item()),
                    (part.trace.kl[real] - whole.trace.kl[real]).abs().max().item(),
                    (part.trace.entropy[real] - whole.trace.entropy[real]).abs().max().item())
    return worst


@torch.no_grad()
def test_chunked_scoring_equals_one_forward_in_float64(tiny):
    experts = {"a": tiny.adapters["a"], "b": tiny.adapters["b"], "full": tiny.full_expert}
    composed = ComposedModelForCausalLM.from_experts(tiny.base, experts, dtype=torch.float64)
    ids, mask = _batch(composed.config.vocab_size)
    worst = _compare(composed, ids, mask, chunks=(1, 3, 5, 12))
    print(f"max |chunked − one forward| = {worst:.2e}")
    assert worst <= 1e-6


@torch.no_grad()
def test_chunked_scoring_on_gemma3_sliding_window_equals_one_forward(tmp_path):
    from common import make_tiny_lora

    base = tmp_path / "base"
    make_tiny_gemma3(base)  # sliding window 4, shorter than the rows and than some chunks
    experts = {"a": make_tiny_lora(base, tmp_path / "a", seed=1, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
               "b": make_tiny_lora(base, tmp_path / "b", seed=2, r=4, lora_alpha=2, target_modules=["k_proj", "down_proj"])}
    composed = ComposedModelForCausalLM.from_experts(base, experts, dtype=torch.float64)
    ids, mask = _batch(200, lengths=(9, 7))
    assert _compare(composed, ids, mask, chunks=(2, 3, 6)) <= 1e-6
    assert composed.config.vocab_size == GEMMA_VOCAB


def test_chunked_scoring_keeps_gradients(tiny):
    """With autograd recording (training through the composition) the chunks are concatenated, not written
    in place, and the gradients equal one forward's."""
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "full": tiny.full_expert}, dtype=torch.float64)
    ids, mask = _batch(composed.config.vocab_size)
    weights = [p for n, p in composed.full_experts.named_parameters() if "proj" in n]  # the full expert's (trainable) weights
    for p in weights:
        p.requires_grad_(True)
    grads = []
    for chunk in (None, 4):
        if chunk is None:
            composed.scoring_budget = None
        else:
            _chunked(composed, ids.shape[0], chunk)
        composed.zero_grad()
        composed(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in weights]))
    assert grads[0].abs().max() > 0 and (grads[0] - grads[1]).abs().max() <= 1e-9


@pytest.mark.parametrize("logits_to_keep", [1, 3])
@torch.no_grad()
def test_a_forward_that_keeps_some_positions_or_continues_a_cache_is_not_chunked(tiny, logits_to_keep):
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"]}, dtype=torch.float64)
    ids, mask = _batch(composed.config.vocab_size)
    _chunked(composed, ids.shape[0], 2)
    calls = []
    real = composed._step
    composed._step = lambda *a, **k: calls.append(a[0].shape[1]) or real(*a, **k)
    composed(ids, attention_mask=mask, logits_to_keep=logits_to_keep)
    assert calls == [ids.shape[1]]
    calls.clear()
    composed(ids, attention_mask=mask)
    assert calls == [2] * (ids.shape[1] // 2) + ([ids.shape[1] % 2] if ids.shape[1] % 2 else [])


def test_an_empty_input_is_one_clear_error(tiny):
    """Issue 30.12: input_ids of shape (1, 0) failed deep inside transformers with a reshape error."""
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"]})
    with pytest.raises(ValueError, match=r"^input_ids: expected at least one token per row, got shape \(1, 0\)$"):
        composed(torch.zeros(1, 0, dtype=torch.long))

"""The LM head's decoding layout (logitcomp/head.py, issue 28.2): the same logits as F.linear, used only
inside a composed forward, on a large head, on an AMD CPU, for 2 to 16 rows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from logitcomp.head import MAX_ROWS, MIN_VOCAB, _forward, fast_head


@pytest.mark.parametrize("bias", [False, True])
def test_the_transposed_layout_gives_f_linear_logits(bias, monkeypatch):
    import logitcomp.head

    monkeypatch.setattr(logitcomp.head, "TRANSPOSED_ON_CPU", True)  # the layout of AMD CPUs, whatever this one is
    head = torch.nn.Linear(48, MIN_VOCAB, bias=bias)
    for rows in (1, 2, 3, 7, MAX_ROWS, MAX_ROWS + 1):
        x = torch.randn(rows, 1, 48)  # (M, 1, H): a decoding step's rows
        got, want = _forward(head, x), F.linear(x, head.weight, head.bias)
        assert got.shape == want.shape == (rows, 1, MIN_VOCAB)
        assert (got - want).abs().max() <= 1e-5, rows


def test_fast_head_applies_inside_the_block_only_and_to_large_plain_heads():
    class Model(torch.nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.lm_head = torch.nn.Linear(8, vocab)

        def get_output_embeddings(self):
            return self.lm_head

    large, small = Model(MIN_VOCAB), Model(MIN_VOCAB - 1)
    with fast_head(large), fast_head(small):
        assert "forward" in large.lm_head.__dict__ and "forward" not in small.lm_head.__dict__
        x = torch.randn(3, 8)
        assert (large.lm_head(x) - F.linear(x, large.lm_head.weight, large.lm_head.bias)).abs().max() <= 1e-5
    assert "forward" not in large.lm_head.__dict__  # restored


@torch.no_grad()
def test_greedy_decoding_at_gemma3s_vocabulary_is_unchanged_by_the_layout(tmp_path, monkeypatch):
    from common import make_tiny_lora
    from logitcomp import ComposedModelForCausalLM
    from test_gemma3_architecture import make_tiny_gemma3

    base = tmp_path / "base"
    make_tiny_gemma3(base)
    experts = {"a": make_tiny_lora(base, tmp_path / "a", seed=1, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])}
    composed = ComposedModelForCausalLM.from_experts(base, experts)
    ids = torch.tensor([[1, 40, 41, 42, 43]])
    calls = []
    import logitcomp.head

    real = logitcomp.head._forward
    monkeypatch.setattr(logitcomp.head, "TRANSPOSED_ON_CPU", True)  # the layout of AMD CPUs, whatever this one is
    monkeypatch.setattr(logitcomp.head, "_forward", lambda h, x: calls.append(x.numel() // x.shape[-1]) or real(h, x))
    fast = composed.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert 2 in calls  # the decoding steps' two rows (base, expert) went through the layout
    monkeypatch.setattr(logitcomp.head, "MIN_VOCAB", 10**9)  # off: F.linear everywhere
    plain = composed.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    assert torch.equal(fast.sequences, plain.sequences)
    assert max((a - b).abs().max().item() for a, b in zip(fast.logits, plain.logits)) <= 1e-4

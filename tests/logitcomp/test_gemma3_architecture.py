"""Exactness on Gemma 3's architecture (issue 18.4): a random Gemma3ForCausalLM with the real 262,144-token
vocabulary, sliding-window and full attention layers, QK-norm, tied and scaled embeddings; two LoRA experts
composed on a left-padded batch against separately merged models and the formula by hand, over the whole
vocabulary."""

from __future__ import annotations

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from common import make_tiny_lora, make_tokenizer
from logitcomp import ComposedModelForCausalLM
from tests.reference import hand_compose, merged_expert, row_logprobs

VOCAB = 262_144  # Gemma 3 270M's vocabulary


def make_tiny_gemma3(out_dir) -> None:
    tokenizer = make_tokenizer()
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=4,  # shorter than the rows
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config)
    with torch.no_grad():  # the default init makes every distribution near-uniform
        for p in model.parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.uniform_(-0.5, 0.5)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


@torch.no_grad()
def test_composition_on_gemma3_equals_the_reference_over_the_full_vocabulary(tmp_path):
    base = tmp_path / "base"
    make_tiny_gemma3(base)
    experts = {
        "a": make_tiny_lora(base, tmp_path / "a", seed=1, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"]),
        "b": make_tiny_lora(base, tmp_path / "b", seed=2, r=4, lora_alpha=2, target_modules=["k_proj", "o_proj", "gate_proj"]),
    }
    composed = ComposedModelForCausalLM.from_experts(base, experts)
    rows = [[1, 40, 41, 42, 43, 44, 45, 46, 47], [1, 50, 51, 52]]  # the second is left-padded by 5
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # (B, T)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])  # (B, T)
    out = composed(ids, attention_mask=mask).logits  # (B, T, V): log p̂
    assert out.shape == (2, width, VOCAB)

    reference = Gemma3ForCausalLM.from_pretrained(base).eval()
    merged = [merged_expert(base, experts[n]) for n in ("a", "b")]
    worst = 0.0
    for i, r in enumerate(rows):
        lb = row_logprobs(reference, r)  # (T_i, V), float64
        want = hand_compose(lb, [row_logprobs(m, r) for m in merged], [1.0, 1.0])
        got = out[i, width - len(r):].double()
        assert (want - lb).abs().max() > 0.1  # the experts move the distribution
        worst = max(worst, (got - want).abs().max().item())
    print(f"max |log p̂ − reference| = {worst:.2e} over {VOCAB} tokens")
    assert worst < 1e-4, worst

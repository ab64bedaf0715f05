"""Exact composition through a saved folder opened by `AutoModelForCausalLM`, per architecture (issue 29):
Llama, Mistral, Qwen2, Phi3 (fused qkv), Gemma2 (softcapping, sliding window) and GPT-2 (Conv1D,
fan_in_fan_out), each a tiny random model with two random LoRA experts, against the experts merged into
separately loaded copies of the base by peft and the rule applied by hand (float64 reference)."""

from __future__ import annotations

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, GPT2Config, LlamaConfig, MistralConfig, Phi3Config,
                          Qwen2Config)

import logitcomp  # noqa: F401  (registers composition folders with the Auto classes)
from common import make_tiny_lora, make_tokenizer, save_random_model
from logitcomp import ComposedModelForCausalLM
from reference import hand_compose, merged_expert, row_logprobs

TOL = 1e-4
IDS = [1, 40, 41, 42, 45, 41, 40, 50, 60, 33]
SHAPE = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             max_position_embeddings=64)
ARCHITECTURES = {
    "llama": (LlamaConfig, SHAPE, (["q_proj", "v_proj"], ["o_proj", "down_proj"])),
    "mistral": (MistralConfig, SHAPE, (["q_proj", "k_proj"], ["up_proj"])),
    "qwen2": (Qwen2Config, SHAPE, (["q_proj", "v_proj"], ["gate_proj", "o_proj"])),
    "phi3": (Phi3Config, {**SHAPE, "pad_token_id": 0}, (["qkv_proj"], ["gate_up_proj", "o_proj"])),
    "gemma2": (Gemma2Config, {**SHAPE, "head_dim": 8, "sliding_window": 4, "final_logit_softcapping": 5.0,
                              "attn_logit_softcapping": 20.0}, (["q_proj", "v_proj"], ["down_proj"])),
    "gpt2": (GPT2Config, dict(n_embd=16, n_layer=2, n_head=2, n_positions=64), (["c_attn"], ["c_proj", "c_fc"])),
}


def _world(root, arch):
    config_class, shape, targets = ARCHITECTURES[arch]
    tok = make_tokenizer()
    torch.manual_seed(0)
    save_random_model(AutoModelForCausalLM.from_config(config_class(vocab_size=len(tok), bos_token_id=1, eos_token_id=2, **shape)),
                      tok, root / "base", std=0.3)
    experts = {f"e{i}": make_tiny_lora(root / "base", root / f"e{i}", seed=i + 1, r=2, lora_alpha=4, target_modules=modules,
                                       fan_in_fan_out=arch == "gpt2") for i, modules in enumerate(targets)}
    return root / "base", experts


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
@torch.no_grad()
def test_a_saved_composition_opened_by_auto_classes_is_exact(arch, tmp_path):
    base, experts = _world(tmp_path, arch)
    weights = {"e0": 1.0, "e1": 0.6}
    folder = ComposedModelForCausalLM.from_experts(base, experts, weights).save_pretrained(tmp_path / "comp")
    model = AutoModelForCausalLM.from_pretrained(folder)
    reference = hand_compose(row_logprobs(AutoModelForCausalLM.from_pretrained(base).eval(), IDS),
                             [row_logprobs(merged_expert(base, experts[n]), IDS) for n in weights], list(weights.values()))
    worst = (model(torch.tensor([IDS])).logits[0].double() - reference).abs().max().item()
    print(f"{arch}: max |composed - reference| = {worst:.2e}")
    assert worst <= TOL

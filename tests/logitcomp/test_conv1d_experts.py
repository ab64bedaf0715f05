"""GPT-2-style LoRA experts (Conv1D layers, `fan_in_fan_out=True`) through every folder path (issue 29.4):
from_experts, a saved folder, merge-as-LoRA and mergekit's task arithmetic, each against models merged
separately by peft (`merge_and_unload`) and the rule applied by hand."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

import bridge
from common import make_tiny_lora, make_tokenizer, save_random_model
from logitcomp import ComposedModelForCausalLM
from reference import hand_compose, merged_expert, row_logprobs

IDS = [1, 40, 41, 42, 45, 41, 40, 50]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt2")
    tok = make_tokenizer()
    torch.manual_seed(0)
    save_random_model(GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=16, n_layer=2, n_head=2,
                                                 bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)), tok, root / "base")
    experts = {f"e{i}": make_tiny_lora(root / "base", root / f"e{i}", seed=i + 1, r=2, lora_alpha=4, target_modules=targets,
                                       fan_in_fan_out=True) for i, targets in enumerate((["c_attn"], ["c_proj", "c_fc"]))}
    return root / "base", experts


@torch.no_grad()
def test_conv1d_experts_compose_save_and_merge_exactly(gpt2, tmp_path):
    base, experts = gpt2
    composed = ComposedModelForCausalLM.from_experts(base, experts, {"e0": 1.0, "e1": 0.5})
    ref = hand_compose(row_logprobs(AutoModelForCausalLM.from_pretrained(base).eval(), IDS),
                       [row_logprobs(merged_expert(base, experts[n]), IDS) for n in ("e0", "e1")], [1.0, 0.5])
    x = torch.tensor([IDS])
    assert (composed(x).logits[0].double() - ref).abs().max() <= 1e-4
    reloaded = ComposedModelForCausalLM.from_pretrained(composed.save_pretrained(tmp_path / "comp"))
    assert torch.equal(reloaded(x).logits, composed(x).logits)
    # task arithmetic with weights 1: both deltas added to the base, by peft, one after the other
    both = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), experts["e0"]).merge_and_unload()
    both = PeftModel.from_pretrained(both, experts["e1"]).merge_and_unload().eval()
    want = row_logprobs(both, IDS)
    lora = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), bridge.merge_as_lora(base, experts, tmp_path / "lora")).eval()
    assert (row_logprobs(lora, IDS) - want).abs().max() <= 1e-4
    merged = AutoModelForCausalLM.from_pretrained(bridge.task_arithmetic(base, experts, tmp_path / "ta")).eval()
    assert (row_logprobs(merged, IDS) - want).abs().max() <= 1e-4


def test_conv1d_experts_run_through_a_recipe_and_lm_eval(gpt2, tmp_path):
    """The recipe path (checks, pool, lm-eval's `logitcomp` model, merge-as-LoRA) on the same experts."""
    import math

    import yaml
    from transformers import AutoTokenizer

    from common import TASKS, bits_per_byte
    from merging.runner import run_recipe

    base, experts = gpt2
    recipe = {"name": "gpt2", "base": str(base), "experts": {n: str(p) for n, p in experts.items()},
              "evaluate": {"tasks": ["smol_text"], "include_path": str(TASKS), "limit": 4, "batch_size": 4},
              "variants": ["composed", "merged_lora"], "output": "out"}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    results = run_recipe(tmp_path / "recipe.yaml", echo=lambda *_: None)
    tok = AutoTokenizer.from_pretrained(base)
    lora = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), bridge.merge_as_lora(base, experts, tmp_path / "ref_lora"))
    for row, model in (("composed", ComposedModelForCausalLM.from_experts(base, experts)), ("merged_lora", lora)):
        assert math.isclose(results[row]["smol_text"]["bits_per_byte,none"], bits_per_byte(model, tok), rel_tol=1e-5), row

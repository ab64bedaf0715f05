"""The tiny random fixtures are what other tests assume: small, reloadable, non-trivial adapters."""

from __future__ import annotations

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from common import TINY_ADAPTERS


def test_tiny_base_is_a_few_thousand_parameters(tiny):
    model = AutoModelForCausalLM.from_pretrained(tiny.base)
    assert 1_000 < sum(p.numel() for p in model.parameters()) < 20_000
    tok = AutoTokenizer.from_pretrained(tiny.base)
    assert tok.decode(tok("AB>C").input_ids, skip_special_tokens=True) == "AB>C"


def test_tiny_adapters_differ_and_change_the_output(tiny):
    ids = AutoTokenizer.from_pretrained(tiny.base)("ABCDE>ABC", return_tensors="pt").input_ids  # (1, T)
    base_logits = AutoModelForCausalLM.from_pretrained(tiny.base)(ids).logits  # (1, T, V)
    seen = []
    for name, path in tiny.adapters.items():
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), path)
        cfg = model.peft_config["default"]
        assert cfg.r == TINY_ADAPTERS[name]["r"]
        assert set(cfg.target_modules) == set(TINY_ADAPTERS[name]["target_modules"])
        assert all(p.abs().min() > 0 for n, p in model.named_parameters() if "lora_B" in n)
        logits = model(ids).logits
        assert (logits - base_logits).abs().max() > 1e-2, f"adapter {name} leaves the output unchanged"
        seen.append(logits)
    assert (seen[0] - seen[1]).abs().max() > 1e-2


def test_tiny_full_expert_shares_the_vocabulary(tiny):
    base = AutoModelForCausalLM.from_pretrained(tiny.base)
    full = AutoModelForCausalLM.from_pretrained(tiny.full_expert)
    assert full.config.vocab_size == base.config.vocab_size
    diffs = [(a - b).abs().max() for a, b in zip(base.parameters(), full.parameters())]
    assert min(diffs) > 0
    text = "PONM>MNOP"
    assert AutoTokenizer.from_pretrained(tiny.full_expert)(text).input_ids == AutoTokenizer.from_pretrained(tiny.base)(text).input_ids

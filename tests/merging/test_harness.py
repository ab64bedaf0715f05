"""The `logitcomp` lm-eval model: loglikelihood and rolling loglikelihood through the composition,
against lm-eval's own HFLM on separately loaded models that the composition must reproduce."""

from __future__ import annotations

import subprocess
import sys

import pytest
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp import ComposedModelForCausalLM
from merging.harness.model import LogitcompLM, parse_pairs
from reference import merged_expert

REQUESTS = [("AB>", "BA"), ("CAFE>", "DBFE"), ("P>", "P"), ("ABCDEFG>", "ABCDEFG")]
TEXTS = ["ABCDEFGH", "PONM", "CAFEBABE"]


def _scores(lm):
    ll = lm.loglikelihood([Instance("loglikelihood", {}, req, i) for i, req in enumerate(REQUESTS)])
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(TEXTS)])
    return [v for v, _ in ll], rolling


@pytest.mark.parametrize(("weights", "reference"), [({"a": 0.0, "b": 0.0}, "base"), ({"a": 1.0, "b": 0.0}, "a")])
def test_loglikelihoods_match_hflm_on_the_equivalent_plain_model(tiny, tmp_path, weights, reference):
    tok = AutoTokenizer.from_pretrained(tiny.base)
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": tiny.adapters["b"]}, weights)
    saved = composed.save_pretrained(tmp_path / "comp")
    ours = LogitcompLM(pretrained=str(saved), batch_size=3)
    plain = merged_expert(tiny.base, tiny.adapters["a"]) if reference == "a" else AutoModelForCausalLM.from_pretrained(tiny.base)
    ref = HFLM(pretrained=plain, tokenizer=tok, batch_size=3)
    (ll, rolling), (ll_ref, rolling_ref) = _scores(ours), _scores(ref)
    assert max(abs(a - b) for a, b in zip(ll, ll_ref)) <= 1e-4
    assert max(abs(a - b) for a, b in zip(rolling, rolling_ref)) <= 1e-4
    assert min(ll) < -0.1  # non-trivial scores


def test_inline_model_args_and_their_errors(tiny):
    args = f"a:{tiny.adapters['a']}|b:{tiny.adapters['b']}"
    lm = LogitcompLM(base=str(tiny.base), experts=args, weights="a:0.5|b:2", eos_policy="any", batch_size=2)
    assert lm.model.composition.weights == {"a": 0.5, "b": 2.0} and lm.model.composition.eos_policy == "any"
    lm = LogitcompLM(base=str(tiny.base), experts=args, rule="activity", rule_params="gamma:2.5", batch_size=2)
    assert lm.model.composition.rule == "activity" and lm.model.composition.rule_params == {"gamma": 2.5}
    with pytest.raises(ValueError, match=r"experts: expected name:value items"):
        parse_pairs("experts", "a=1")
    with pytest.raises(ValueError, match=r"weights: duplicate name 'a'"):
        parse_pairs("weights", "a:1|a:2")
    with pytest.raises(ValueError, match=r"model_args: expected pretrained="):
        LogitcompLM(batch_size=1)


def test_plain_lm_eval_finds_the_model_through_the_installed_hook():
    # A fresh interpreter that never imports this project: the .pth installed with the package must
    # make lm-eval 0.4.13 (no entry points) resolve `logitcomp`, lazily, without hiding its own models.
    code = ("import sys, lm_eval.models; from lm_eval.api.registry import get_model, model_registry; "
            "assert model_registry._objs['logitcomp'] == 'merging.harness.model:LogitcompLM'; "
            "assert 'merging.harness.model' not in sys.modules; "
            "print(get_model('logitcomp').__module__, get_model('hf').__name__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["merging.harness.model", "HFLM"]

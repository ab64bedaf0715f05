"""Issue 55: an expert whose weight, or held gate, is 0 for an input is not computed for it (logitcomp/layout.py,
logitcomp/gated.py), and the log-probs are those of every expert computed (`skip_unused_experts = False`, the path
every composition ran before): in float64, to 1e-9 relative, through forward, `generate`, chunked scoring and lm-eval.

The routing here is designed, not fitted (`bench_routed.designed_routing`: detectors solved by least squares, exact
at 8 prompts in 16 dimensions, so that each prompt's mean hidden state scores +1 on the experts it is meant to keep
and -1 on the others), so the kept sets are known in advance (every one of the 8 subsets of 3 experts in one batch)."""

from __future__ import annotations

import itertools

import pytest
import torch
from lm_eval.api.instance import Instance
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

import logitcomp.grouped_lora as grouped_lora
from logitcomp import ComposedModelForCausalLM, CompositionConfig, compose
from merging.harness.model import LogitcompLM
from merging.tools.bench_routed import designed_routing

EXPERTS = ("a", "b", "c")
WEIGHTS = {"a": 1.0, "b": 0.8, "c": 1.2}
PROMPTS = ["ABCAB>", "Hello there, world>", "x>", "CCBA>", "the quick brown fox>", "ABABAB>", "z y x w>", "1+2=3>"]
SUBSETS = [s for k in range(4) for s in itertools.combinations(range(3), k)]  # all 8 subsets of the 3 experts


def _keep(sets) -> torch.Tensor:
    """(B, 3) bool of kept sets given as index tuples."""
    return torch.tensor([[j in s for j in range(3)] for s in sets])


@torch.no_grad()
def _designed(tiny, tok, keep: torch.Tensor, **routing) -> ComposedModelForCausalLM:
    """The 3-expert composition in float64, routed by detectors under which prompt b's mean hidden state scores +1
    on the experts keep[b] names and -1 on the others (binary gates, held from the prompt unless routing says)."""
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {n: tiny.adapters[n] for n in EXPERTS}, WEIGHTS, dtype=torch.float64)
    base = AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float64)
    means = torch.stack([base(torch.tensor([tok(p).input_ids]), output_hidden_states=True).hidden_states[-1][0].mean(0)
                         for p in PROMPTS[:len(keep)]])  # (B, d): each prompt's mean hidden state, no padding
    composed.composition = composed.composition.with_routing({**designed_routing(means, keep, list(EXPERTS)), **routing})
    return composed


def _same(got: torch.Tensor, want: torch.Tensor, real: torch.Tensor | None = None) -> None:
    """Equal to 1e-9 relative at the real positions (the composed log-probs of both paths)."""
    if real is not None:
        got, want = got[real], want[real]
    worst = ((got.double() - want.double()).abs() / want.double().abs().clamp(min=1.0)).max().item()
    assert worst <= 1e-9, f"max relative difference {worst:.2e}"


class Spy:
    """Rows of every forward of the base model and rows each expert's LoRA update multiplies (summed over layers)."""

    def __init__(self, monkeypatch, composed):
        self.forwards, self.lora = [], dict.fromkeys(EXPERTS, 0)
        composed._hf_model.get_input_embeddings().register_forward_pre_hook(lambda m, args: self.forwards.append(args[0].shape[0]))
        inner = grouped_lora._add_updates

        def counted(layer, args, output, *, updates, layout):
            start, end, counts = layout().span(updates.first - 1, updates.a.shape[0])
            for j, count in enumerate(counts):
                self.lora[composed.lora_experts[updates.first - 1 + j]] += count
            return inner(layer, args, output, updates=updates, layout=layout)
        monkeypatch.setattr(grouped_lora, "_add_updates", counted)


def _generate(composed, batch, tok, new=5):
    out = composed.generate(**batch, max_new_tokens=new, do_sample=False, output_logits=True, return_dict_in_generate=True,
                            pad_token_id=tok.pad_token_id, eos_token_id=None)
    return out.sequences, torch.stack(out.logits, 1)  # (B, T + new), (B, new, V)


def _both(composed, call):
    """call() with the gated-out experts skipped, then with every expert computed."""
    composed.skip_unused_experts = True
    sparse = call()
    composed.skip_unused_experts = False
    dense = call()
    composed.skip_unused_experts = True
    return sparse, dense


def test_every_input_keeping_a_different_set_decodes_and_scores_as_every_expert_computed(tiny, monkeypatch):
    tok = AutoTokenizer.from_pretrained(tiny.base)
    keep = _keep(SUBSETS)
    composed = _designed(tiny, tok, keep)
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        prefill = composed(**batch, use_cache=True, logits_to_keep=1)
    assert torch.equal(prefill.cache.layout.keep, keep)  # the designed kept sets, one per input
    spy = Spy(monkeypatch, composed)
    seq, steps = _generate(composed, batch, tok)
    kept = int(keep.sum())  # 12 expert rows of 8 inputs
    assert spy.forwards == [8, kept] + [8 + kept] * 4  # the base's rows, the kept experts' rows, then 4 steps of both
    spy.forwards.clear()
    composed.skip_unused_experts = False
    seq_dense, steps_dense = _generate(composed, batch, tok)
    composed.skip_unused_experts = True
    assert spy.forwards == [8 * 4] * 5  # every expert for every input
    assert torch.equal(seq, seq_dense)
    _same(steps, steps_dense)
    mask = torch.cat([batch.attention_mask, torch.ones(8, 5, dtype=torch.long)], 1)
    real = mask.bool()
    for use_cache in (False, True):  # lm-eval scores with the config's use_cache (True): a cache of the kept rows is made
        sparse, dense = _both(composed, lambda: composed(seq, attention_mask=mask, use_cache=use_cache).logits)
        _same(sparse, dense, real)
    whole = sparse
    composed.scoring_budget = 2 * 4 * 8 * whole.shape[-1]  # two positions per forward: chunked scoring
    sparse, dense = _both(composed, lambda: composed(seq, attention_mask=mask).logits)
    _same(sparse, whole, real)
    _same(dense, whole, real)


def test_an_expert_no_input_keeps_is_never_computed(tiny, monkeypatch):
    tok = AutoTokenizer.from_pretrained(tiny.base)
    sets = [(0,), (1,), (0, 1), (), (0,), (1,), (0, 1), ()]  # no input keeps c
    composed = _designed(tiny, tok, _keep(sets))
    spy = Spy(monkeypatch, composed)
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    seq, steps = _generate(composed, batch, tok, new=3)
    assert spy.lora["c"] == 0  # c's LoRA factors multiplied no row
    assert spy.lora["a"] > 0 and spy.lora["b"] > 0
    assert spy.forwards == [8, 8, 16, 16]  # 8 inputs, 8 kept expert rows
    spy.forwards.clear()
    with torch.no_grad():
        composed(seq, attention_mask=torch.ones_like(seq), use_cache=False)  # scoring: every position routed by its prefix
    assert spy.forwards[0] == 8 and spy.forwards[1] <= 16  # c only where some prefix keeps it


def test_updating_gates_and_non_sparse_rules_compute_every_expert(tiny, monkeypatch):
    """Gates that follow every token (update: true) decode with every expert (any of them can come back); rules and
    EOS policies that read an expert of weight 0 (union, the `all` policy) compute every expert too."""
    tok = AutoTokenizer.from_pretrained(tiny.base)
    batch = tok(PROMPTS[:4], return_tensors="pt", padding=True, padding_side="left")
    for routing, compose_options in (({"update": True}, {}), ({}, {"rule": "union"}), ({}, {"eos_policy": "all"})):
        composed = _designed(tiny, tok, _keep(SUBSETS[:4]), **routing)
        if compose_options:
            composed.composition = CompositionConfig(weights=WEIGHTS, routing=composed.composition.routing, **compose_options)
        spy = Spy(monkeypatch, composed)
        (_, steps), (_, dense) = _both(composed, lambda: _generate(composed, batch, tok, new=2))
        assert spy.forwards == [16] * 4, (routing, compose_options)
        _same(steps, dense)


def test_fixed_weight_zero_and_a_subset_of_the_adapters_run_only_the_experts_in_use(tiny, monkeypatch):
    tok = AutoTokenizer.from_pretrained(tiny.base)
    batch = tok(PROMPTS[:3], return_tensors="pt", padding=True, padding_side="left")
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {n: tiny.adapters[n] for n in EXPERTS}, {"a": 1.0, "b": 0.0, "c": 1.2},
                                                     dtype=torch.float64)
    spy = Spy(monkeypatch, composed)
    seq, steps = _generate(composed, batch, tok, new=3)
    assert spy.forwards == [9, 9, 9] and spy.lora["b"] == 0  # b (weight 0) skipped
    composed.skip_unused_experts = False
    seq_dense, dense = _generate(composed, batch, tok, new=3)
    composed.skip_unused_experts = True
    assert spy.forwards[3:] == [12, 12, 12] and spy.lora["b"] > 0
    assert torch.equal(seq, seq_dense)
    _same(steps, dense)
    mask = torch.cat([batch.attention_mask, torch.ones(3, 3, dtype=torch.long)], 1)
    composed.scoring_budget = 2 * 4 * 3 * steps.shape[-1]  # chunked
    sparse, whole = _both(composed, lambda: composed(seq, attention_mask=mask).logits)
    _same(sparse, whole, mask.bool())
    # a row naming a subset of the adapters a peft model holds (a recipe's oracle-like row): only those run
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), tiny.adapters["a"], adapter_name="a")
    for name in ("b", "c"):
        peft.load_adapter(tiny.adapters[name], adapter_name=name)
    subset = compose(peft, ["c"])
    spy = Spy(monkeypatch, subset)
    _generate(subset, batch, tok, new=2)
    assert spy.forwards == [6, 6] and spy.lora["a"] == spy.lora["b"] == 0


def test_lm_eval_scores_and_generations_equal_every_expert_computed(tiny):
    tok = AutoTokenizer.from_pretrained(tiny.base)
    composed = _designed(tiny, tok, _keep(SUBSETS))
    lm = LogitcompLM(pretrained=composed, tokenizer=tok, batch_size=4)
    contexts = [(p, " ok") for p in PROMPTS] + [(p, "ABC") for p in PROMPTS[:3]]
    generations = [(p, {"until": ["\n"], "max_gen_toks": 4, "do_sample": False}) for p in PROMPTS]

    def run():
        ll = lm.loglikelihood([Instance("loglikelihood", {}, req, i) for i, req in enumerate(contexts)])
        rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (p,), i) for i, p in enumerate(PROMPTS)])
        texts = lm.generate_until([Instance("generate_until", {}, req, i) for i, req in enumerate(generations)])
        return [v for v, _ in ll], rolling, texts

    (ll, rolling, texts), (ll_dense, rolling_dense, texts_dense) = _both(composed, run)
    for got, want in ((ll, ll_dense), (rolling, rolling_dense)):
        _same(torch.tensor(got), torch.tensor(want))
    assert texts == texts_dense
    assert min(ll) < -0.1

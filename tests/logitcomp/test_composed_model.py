"""ComposedModelForCausalLM against separately loaded, merged HF models and the rule applied by hand."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from torch.overrides import TorchFunctionMode
from transformers import AutoModelForCausalLM, AutoTokenizer

from common import make_tiny_llama, make_tiny_lora
from logitcomp import ComposedModelForCausalLM, CompositionConfig, compose
from reference import hand_compose, merged_expert, row_logprobs

TOL = 1e-4
PROMPTS = ["ABCDEFGHAB>", "PAC>", "CAFE>AB", "B>"]


@pytest.fixture(scope="module")
def tok(tiny):
    return AutoTokenizer.from_pretrained(tiny.base)


@pytest.fixture(scope="module")
def refs(tiny):
    """Plain HF models: the base, each LoRA expert merged into its own copy, the full expert."""
    models = {"base": AutoModelForCausalLM.from_pretrained(tiny.base).eval(), "full": merged_expert(tiny.base, tiny.full_expert)}
    models.update({name: merged_expert(tiny.base, path) for name, path in tiny.adapters.items()})
    return models


def _paths(tiny, names):
    return {n: tiny.full_expert if n == "full" else tiny.adapters[n] for n in names}


def _reference(refs, ids, names, weights):
    return hand_compose(row_logprobs(refs["base"], ids), [row_logprobs(refs[n], ids) for n in names], weights)


def _left_padded(tok, prompts):
    return tok(prompts, return_tensors="pt", padding=True, padding_side="left")


@pytest.mark.parametrize(
    ("names", "weights"),
    [(["a", "b"], [1.0, 1.0]), (["a", "b", "c"], [0.5, -0.7, 1.3]), (["a", "full"], [1.0, 1.0]), (["full", "c", "b"], [1.0, 2.0, 1.0])],
)
def test_forward_on_left_padded_batch_matches_reference(tiny, refs, tok, names, weights):
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names), dict(zip(names, weights)))
    batch = _left_padded(tok, PROMPTS)
    with torch.no_grad():
        logits = composed(**batch).logits  # (B, T, V)
    worst = 0.0
    for row, mask in zip(range(len(PROMPTS)), batch.attention_mask):
        ids = batch.input_ids[row][mask.bool()].tolist()
        ref = _reference(refs, ids, names, weights)
        worst = max(worst, (logits[row, -len(ids):].double() - ref).abs().max().item())
    assert worst <= TOL, f"max abs diff {worst:.2e}"


def test_weight_zero_is_the_base_and_one_expert_is_that_expert(tiny, refs, tok):
    ids = tok("ABCAB>CC").input_ids
    x = torch.tensor([ids])
    for names, weights, want in ((["a", "b"], [0.0, 0.0], "base"), (["b"], [1.0], "b"), (["full"], [1.0], "full")):
        composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names), dict(zip(names, weights)))
        with torch.no_grad():
            got = composed(x).logits[0].double()
        assert (got - row_logprobs(refs[want], ids)).abs().max() <= TOL, want


def test_cached_decoding_matches_full_recomputation(tiny, tok):
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "c", "full"]))
    batch = _left_padded(tok, ["ABCDEFG>AB", "PO>"])
    extra = torch.tensor([[7, 8, 9, 10], [11, 12, 5, 6]])  # tokens appended one by one
    with torch.no_grad():
        out = composed(**batch, use_cache=True)
        steps, mask = [], batch.attention_mask
        for t in range(extra.shape[1]):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
            out = composed(extra[:, t : t + 1], attention_mask=mask, cache=out.cache, use_cache=True)
            steps.append(out.logits[:, -1])
        full = composed(torch.cat([batch.input_ids, extra], 1), attention_mask=mask, use_cache=False).logits
    diff = (torch.stack(steps, 1) - full[:, -extra.shape[1]:]).abs().max().item()
    assert diff <= TOL, f"cached vs full: {diff:.2e}"


def _hand_greedy(refs, ids, names, weights, steps, eos):
    ids = list(ids)
    for _ in range(steps):
        nxt = int(_reference(refs, ids, names, weights)[-1].argmax())
        ids.append(nxt)
        if nxt == eos:
            break
    return ids


def _assert_hand_greedy(out, batch, refs, names, tok, steps):
    """Each row of `generate`'s output is the hand loop's greedy continuation (weights 1)."""
    for row, mask in enumerate(batch.attention_mask):
        ids = batch.input_ids[row][mask.bool()].tolist()
        want = _hand_greedy(refs, ids, names, [1.0] * len(names), steps, tok.eos_token_id)
        got = out[row, batch.input_ids.shape[1] - len(ids):].tolist()[: len(want)]  # left padding dropped
        assert got == want, f"row {row}"


def test_greedy_generate_matches_hand_loop(tiny, refs, tok):
    names = ["a", "b", "full"]
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names))
    batch = _left_padded(tok, PROMPTS)
    out = composed.generate(**batch, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    _assert_hand_greedy(out, batch, refs, names, tok, 12)


def test_static_cache_and_compiled_decoding_match_the_hand_loop(tiny, refs, tok):
    """Issue 17.3: a static cache, eager and compiled (`compile=True`; dynamo's eager backend here: the graph capture,
    guards and LoRA hooks without inductor's C++ build), gives the hand loop's tokens; a second call reuses the
    compiled step; an adapter edit between calls is seen by the compiled step."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    names = ["a", "b", "full"]
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names))
    batch = _left_padded(tok, PROMPTS)
    greedy = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    _assert_hand_greedy(composed.generate(**batch, **greedy, cache_implementation="static"), batch, refs, names, tok, 12)
    _assert_hand_greedy(composed.generate(**batch, **greedy, cache_implementation="dynamic"), batch, refs, names, tok, 12)
    with pytest.raises(ValueError, match="cache_implementation: a composed model supports 'static' or 'dynamic', got 'offloaded'"):
        composed.generate(**batch, **greedy, cache_implementation="offloaded")
    compiled = dict(greedy, compile=True, compile_config=CompileConfig(backend="eager", mode=None))
    counters.clear()
    _assert_hand_greedy(composed.generate(**batch, **compiled), batch, refs, names, tok, 12)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs > 0 and hasattr(composed, "_compiled_call")  # the decoding step went through torch.compile
    again = composed.generate(**batch, **compiled)
    assert counters["stats"]["unique_graphs"] == graphs  # reused, not recompiled
    layer = next(m for m in composed.model.modules() if hasattr(m, "lora_B") and "a" in m.lora_B)
    with torch.no_grad():
        layer.lora_B["a"].weight.mul_(-4.0)
    edited = composed.generate(**batch, **greedy)  # the eager dynamic path, checked against the hand loop above
    assert not torch.equal(edited, again) and torch.equal(composed.generate(**batch, **compiled), edited)


def _assert_in_nucleus(composed, batch, sampled, top_p, temperature, eos):
    """Every sampled token lies in the top-p set of the composed distribution at temperature (recomputed without a cache)."""
    prompt = batch.input_ids.shape[1]
    mask = torch.cat([batch.attention_mask, torch.ones_like(sampled[:, prompt:])], -1)  # (B, T)
    logp = composed(sampled, attention_mask=mask, use_cache=False).logits  # (B, T, V)
    for row in range(sampled.shape[0]):
        for t in range(prompt, sampled.shape[1]):
            probs = torch.softmax(logp[row, t - 1] / temperature, -1)  # (V,)
            ranked, order = probs.sort(descending=True)
            nucleus = order[(ranked.cumsum(-1) - ranked) < top_p]  # the smallest set reaching top_p
            assert sampled[row, t] in nucleus, (row, t)
            if sampled[row, t] == eos:
                break  # later positions are padding


def test_sampling_stop_strings_and_lengths(tiny, tok):
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "b"]))
    batch = _left_padded(tok, PROMPTS[:2])
    greedy = composed.generate(**batch, max_new_tokens=8, do_sample=False)
    torch.manual_seed(0)
    top1 = composed.generate(**batch, max_new_tokens=8, do_sample=True, top_k=1, temperature=0.7)
    assert torch.equal(greedy, top1)
    torch.manual_seed(0)
    sampled = composed.generate(**batch, max_new_tokens=8, do_sample=True, top_p=0.9, temperature=1.5)
    _assert_in_nucleus(composed, batch, sampled, top_p=0.9, temperature=1.5, eos=tok.eos_token_id)
    long = composed.generate(**batch, min_new_tokens=6, max_new_tokens=6, do_sample=False)
    assert long.shape[1] == batch.input_ids.shape[1] + 6 and (long[:, -6:] != tok.eos_token_id).all()
    text = tok.decode(greedy[0, batch.input_ids.shape[1]:], skip_special_tokens=True)
    stop = text[1]  # a character greedy decoding produces second
    stopped = composed.generate(**batch, max_new_tokens=8, do_sample=False, stop_strings=[stop], tokenizer=tok)
    assert tok.decode(stopped[0, batch.input_ids.shape[1]:], skip_special_tokens=True).endswith(stop)
    with pytest.raises(ValueError, match="num_beams: beam search is not supported"):
        composed.generate(**batch, num_beams=2, max_new_tokens=3)


def test_compose_from_peft_model_leaves_it_untouched(tiny, refs, tok):
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), tiny.adapters["a"], adapter_name="a")
    peft_model.load_adapter(tiny.adapters["b"], adapter_name="b")
    peft_model.set_adapter("a")
    ids = tok("ABCAB>CC").input_ids
    x = torch.tensor([ids])
    with torch.no_grad():
        before = peft_model(x).logits
        got = compose(peft_model, {"a": 1.0, "b": 0.5})(x).logits[0].double()
        after = peft_model(x).logits
    assert (got - _reference(refs, ids, ["a", "b"], [1.0, 0.5])).abs().max() <= TOL
    assert torch.equal(before, after)
    with pytest.raises(ValueError, match=r"expert 'zz': the peft model holds no such adapter; it holds \['a', 'b'\]"):
        compose(peft_model, ["a", "zz"])


@pytest.mark.parametrize("change", ["merge_and_unload", "unload"])
def test_a_peft_model_whose_lora_layers_left_after_composing_is_refused_at_the_next_forward(tiny, tok, change):
    """Issue 29.5: merge_and_unload()/unload() on the composed PeftModel replaced its LoRA layers by plain ones and
    the composition silently became the base with one adapter merged (or none)."""
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), tiny.adapters["a"], adapter_name="a")
    peft_model.load_adapter(tiny.adapters["b"], adapter_name="b")
    composed = compose(peft_model, ["a", "b"])
    x = torch.tensor([tok("ABCAB>CC").input_ids])
    with torch.no_grad():
        composed(x)
        getattr(peft_model, change)()
        with pytest.raises(ValueError, match=r"^module base_model\.model\.model\.layers\.0\.self_attn\.q_proj: the peft model's LoRA "
                                             r"layers were replaced after composing \(merge_and_unload, unload"):
            composed(x)
        with pytest.raises(ValueError, match=r"LoRA layers were replaced after composing"):
            composed.generate(x, max_new_tokens=2)


def test_masks_apply_each_ratio_on_its_tokens_only(tiny, refs, tok):
    mask_ids = [5, 6, 7, 8]
    config = CompositionConfig(masks={"a": mask_ids})
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "b"]), config=config)
    ids = tok("ABCAB>CC").input_ids
    lb, la, lbb = (row_logprobs(refs[n], ids) for n in ("base", "a", "b"))
    m = torch.zeros(lb.shape[-1], dtype=torch.float64)
    m[mask_ids] = 1.0
    want = torch.log_softmax(lb + m * (la - lb) + (lbb - lb), -1)
    with torch.no_grad():
        got = composed(torch.tensor([ids])).logits[0].double()
    assert (got - want).abs().max() <= TOL


@pytest.mark.parametrize("policy", ["compose", "base", "any", "all", "all_experts"])
def test_eos_policy_against_hand_computation(tiny, refs, tok, policy):
    """The EOS token is the one where the base is most often the least likely model (generation_config names it), so
    that every policy's pick differs from every other's: `all` from `all_experts` above all."""
    names = ["a", "b", "c"]
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names), config=CompositionConfig(eos_policy=policy))
    ids = tok("ABCAB>CC").input_ids
    lb, experts = row_logprobs(refs["base"], ids), [row_logprobs(refs[n], ids) for n in names]
    plain = hand_compose(lb, experts, [1.0] * 3)
    lowest = torch.stack(experts).min(0).values - lb  # (T, V): > 0 where the base is below every expert
    eos = int((lowest > 0).sum(0).argmax())
    composed.generation_config.eos_token_id = eos
    col = torch.stack([m[:, eos] for m in (lb, *experts)])
    picks = [plain[:, eos], col[0], col.max(0).values, col.min(0).values, col[1:].min(0).values]
    assert all((x - y).abs().max() > 1e-3 for i, x in enumerate(picks) for y in picks[i + 1:])  # the policies differ here
    want_eos = dict(zip(["compose", "base", "any", "all", "all_experts"], picks))[policy]
    with torch.no_grad():
        got = composed(torch.tensor([ids])).logits[0].double()
    assert (got[:, eos] - want_eos).abs().max() <= TOL
    others = [i for i in range(lb.shape[-1]) if i != eos]
    rest = torch.log1p(-want_eos.exp()).unsqueeze(-1) + torch.log_softmax(plain[:, others], -1)
    assert (got[:, others] - rest).abs().max() <= TOL


def test_trace_is_kl_of_each_expert_and_composed_entropy(tiny, refs, tok):
    names = ["a", "full"]
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names))
    ids = tok("ABCAB>CC").input_ids
    trace = composed.trace(torch.tensor([ids]))
    lb = row_logprobs(refs["base"], ids)
    for i, n in enumerate(names):
        le = row_logprobs(refs[n], ids)
        assert (trace.kl[0, :, i].double() - (le.exp() * (le - lb)).sum(-1)).abs().max() <= TOL
    lc = _reference(refs, ids, names, [1.0, 1.0])
    assert (trace.entropy[0].double() + (lc.exp() * lc).sum(-1)).abs().max() <= TOL
    assert trace.experts == names and json.dumps(trace.to_dict())
    with torch.no_grad():
        assert composed(torch.tensor([ids])).trace is None  # off unless asked: nothing kept between calls


def test_save_and_load_round_trip(tiny, tok, tmp_path):
    config = CompositionConfig(weights={"a": 0.5}, floor=-1e3, eos_policy="any", masks={"b": [5, 6]})
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "b", "full"]), config=config)
    saved = composed.save_pretrained(tmp_path / "comp")
    meta = json.loads((saved / "composition.json").read_text())
    # the base relative to the folder (a folder moved with its base opens) and absolute (one moved alone opens)
    assert (saved / meta["base"]).resolve() == tiny.base.resolve() and not Path(meta["base"]).is_absolute()
    assert meta["base_absolute"] == str(tiny.base.resolve())
    assert meta["experts"]["a"] == {"kind": "lora", "path": "experts/a"}
    assert meta["experts"]["full"] == {"kind": "full", "path": str(tiny.full_expert.resolve())}
    assert meta["composition"] == config.to_dict()
    assert (saved / "experts" / "b" / "adapter_model.safetensors").exists()
    loaded = ComposedModelForCausalLM.from_pretrained(saved)
    batch = _left_padded(tok, PROMPTS)
    with torch.no_grad():
        assert torch.equal(composed(**batch).logits, loaded(**batch).logits)
    assert loaded.composition == config


def test_bad_input_names_the_culprit(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"weight of expert 'a': expected a finite number, got nan"):
        ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a"]), {"a": float("nan")})
    with pytest.raises(ValueError, match=r"weights: unknown expert 'zz'"):
        ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a"]), {"zz": 1.0})
    other_base = make_tiny_llama(tmp_path / "other_base", seed=11)
    stray = make_tiny_lora(other_base, tmp_path / "stray", seed=3, r=2, lora_alpha=2, target_modules=["q_proj"])
    with pytest.raises(ValueError, match=r"expert 'stray': .* is an adapter of .*other_base, not of the base"):
        ComposedModelForCausalLM.from_experts(tiny.base, {"stray": stray})
    wide = AutoModelForCausalLM.from_pretrained(tiny.base)
    wide.resize_token_embeddings(wide.config.vocab_size + 8)
    wide.save_pretrained(tmp_path / "wide")
    with pytest.raises(ValueError, match=r"expert 'wide': .* has a vocabulary of 107 tokens, the base 99"):
        ComposedModelForCausalLM.from_experts(tiny.base, {"wide": tmp_path / "wide"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"expert 'e': .*empty is neither a peft adapter"):
        ComposedModelForCausalLM.from_experts(tiny.base, {"e": tmp_path / "empty"})
    with pytest.raises(ValueError, match="eos_policy: expected one of"):
        CompositionConfig(eos_policy="first")


def test_pickled_weights_need_opt_in(tiny, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny.full_expert)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    model.config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"expert 'p': .* has only pickled weights \(pytorch_model.bin\); .*allow_pickle"):
        ComposedModelForCausalLM.from_experts(tiny.base, {"p": tmp_path})
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"p": tmp_path}, allow_pickle=True)
    same = ComposedModelForCausalLM.from_experts(tiny.base, {"p": tiny.full_expert})  # the same weights, safetensors
    x = torch.randint(4, 99, (2, 7))
    assert torch.equal(composed(x).logits, same(x).logits)


def test_custom_stopping_criteria(tiny, tok):
    from transformers import StoppingCriteria, StoppingCriteriaList

    class AfterThree(StoppingCriteria):
        def __init__(self, start):
            self.start = start

        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] - self.start >= 3, dtype=torch.bool)

    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "b"]))
    batch = _left_padded(tok, PROMPTS[:2])
    start = batch.input_ids.shape[1]
    out = composed.generate(**batch, max_new_tokens=10, min_new_tokens=10, stopping_criteria=StoppingCriteriaList([AfterThree(start)]))
    assert out.shape[1] == start + 3


def test_dora_adapters_are_refused(tiny, tmp_path):
    dora = make_tiny_lora(tiny.base, tmp_path / "dora", seed=5, r=2, lora_alpha=2, target_modules=["q_proj"], use_dora=True)
    with pytest.raises(ValueError, match=r"expert 'd', module .*q_proj: DoRA and other LoRA variants are not supported"):
        ComposedModelForCausalLM.from_experts(tiny.base, {"d": dora})


def test_unknown_keyword_arguments_are_refused_by_name(tiny, tmp_path):
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a"]))
    x = torch.randint(4, 99, (1, 5))
    with pytest.raises(TypeError, match=r"forward: unsupported argument 'colour'"):
        composed(x, colour="blue")
    with pytest.raises(ValueError, match=r"output_hidden_states: not available from a composed model"):
        composed(x, output_hidden_states=True)
    with pytest.raises(TypeError, match=r"save_pretrained: unsupported argument 'colour'"):
        composed.save_pretrained(tmp_path / "c", colour="blue")
    assert not (tmp_path / "c").exists()
    composed.save_pretrained(tmp_path / "c")
    with pytest.raises(TypeError, match=r"from_pretrained: unsupported argument 'colour'"):
        ComposedModelForCausalLM.from_pretrained(tmp_path / "c", colour="blue")


def test_save_writes_beside_existing_files_and_deletes_nothing_it_did_not_write(tiny, tok, tmp_path):
    import shutil

    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "full"]))
    x = tok(PROMPTS[:1], return_tensors="pt").input_ids  # (1, T)
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    composed.save_pretrained(target)
    composed.save_pretrained(target)  # again: replaces only its own files
    written = {p.name for p in target.iterdir()} - {"keep.txt"}
    tokenizer = {n for n in written if n.startswith(("tokenizer", "special_tokens"))}
    assert written - tokenizer == {"composition.json", "config.json", "experts", "generation_config.json"} and tokenizer
    assert (target / "keep.txt").read_text() == "mine"
    assert torch.equal(ComposedModelForCausalLM.from_pretrained(target)(x).logits, composed(x).logits)
    base_copy = Path(shutil.copytree(tiny.base, tmp_path / "base_copy"))  # a model folder is refused, untouched
    before = {p.name: p.read_bytes() for p in base_copy.iterdir()}
    with pytest.raises(ValueError, match=r"config\.json: the config\.json of another model \('llama'\); choose another folder"):
        composed.save_pretrained(base_copy)
    assert {p.name: p.read_bytes() for p in base_copy.iterdir()} == before
    world = tmp_path / "world"  # an experts/ folder no composition wrote (a toy world) is refused, untouched
    (world / "experts" / "a2b").mkdir(parents=True)
    (world / "experts" / "a2b" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds an experts/ folder that no composition wrote"):
        composed.save_pretrained(world)
    assert sorted(str(p.relative_to(world)) for p in world.rglob("*")) == ["experts", "experts/a2b", "experts/a2b/adapter_config.json"]


@pytest.mark.parametrize(("lora", "message"), [
    (dict(target_modules=["q_proj"], modules_to_save=["lm_head"]), r"expert 'm': modules_to_save=.*lm_head.* cannot be composed row by row"),
    (dict(target_modules=["q_proj", "embed_tokens"]), r"expert 'm', module .*embed_tokens: only LoRA on Linear layers can be composed"),
])
def test_adapter_features_that_cannot_be_composed_exactly_are_refused(tiny, tmp_path, lora, message):
    adapter = make_tiny_lora(tiny.base, tmp_path / "m", seed=5, r=2, lora_alpha=4, **lora)
    with pytest.raises(ValueError, match=message):
        ComposedModelForCausalLM.from_experts(tiny.base, {"m": adapter})


def test_transformers_keywords_labels_embeddings_and_torch_dtype(tiny, refs, tok):
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "b"]))
    ids = tok(PROMPTS[:1]).input_ids[0]
    x = torch.tensor([ids])  # (1, T)
    labels = x.clone()
    labels[0, 1] = -100  # ignored, as in transformers
    ref = _reference(refs, ids, ["a", "b"], [1.0, 1.0])  # (T, V) float64
    kept = [t for t in range(1, len(ids)) if t != 1]
    want = -torch.stack([ref[t - 1, ids[t]] for t in kept]).mean()
    assert abs(composed(x, labels=labels).loss.item() - want.item()) <= 1e-5
    assert composed.get_input_embeddings() is composed._hf_model.get_input_embeddings()
    half = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a"]), torch_dtype=torch.bfloat16)
    assert half._hf_model.dtype == torch.bfloat16


def test_stacked_adapters_follow_edits_reloads_and_to(tiny, tok):
    """Issue 12.8: the stacked LoRA factors were a snapshot; later adapter edits and `.to()` were ignored."""
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), tiny.adapters["a"], adapter_name="a")
    model.load_adapter(tiny.adapters["b"], adapter_name="b")
    composed = compose(model, ["a", "b"])
    x = torch.tensor([tok("ABCAB>CC").input_ids])

    def reference(dtype=torch.float32):  # a fresh composition of the peft model as it is now
        return compose(model, ["a", "b"])(x).logits.to(dtype)

    with torch.no_grad():
        before = composed(x).logits
        layer = next(m for m in model.modules() if hasattr(m, "lora_B") and "a" in m.lora_B)
        layer.lora_B["a"].weight.mul_(3.0)  # an in-place edit (bumps the version counter)
        edited = composed(x).logits
        assert (edited - before).abs().max() > 1e-3
        assert (edited - reference()).abs().max() <= 1e-6
        model.load_adapter(tiny.adapters["c"], adapter_name="b")  # another adapter's weights under the same name
        assert (composed(x).logits - reference()).abs().max() <= 1e-6
        composed.to(torch.float64)  # the stacks follow the model's dtype: exact to float64 precision
        got = composed(x).logits.double()
        assert (got - reference(torch.float64)).abs().max() <= 1e-12
    model.delete_adapter("b")
    with pytest.raises(ValueError, match="'b'"):
        composed(x)


def test_generate_checks_the_stacks_once_per_call_and_sees_edits_between_calls(tiny, tok, monkeypatch):
    """A `generate` call enters the grouped-LoRA routing once: the adapters are compared with the stacks
    on entry, not at each step (issue 17.2); an edit made between two calls is seen by the second."""
    from logitcomp.grouped_lora import LoraStack

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), tiny.adapters["a"], adapter_name="a")
    model.load_adapter(tiny.adapters["b"], adapter_name="b")
    composed = compose(model, ["a", "b"])
    x = torch.tensor([tok("ABCAB>").input_ids])
    checks, real = [], LoraStack._current_state
    monkeypatch.setattr(LoraStack, "_current_state", lambda self: checks.append(1) or real(self))
    greedy = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
    with torch.no_grad():
        first = composed.generate(x, **greedy)
        assert len(checks) == 1
        layer = next(m for m in model.modules() if hasattr(m, "lora_B") and "a" in m.lora_B)
        layer.lora_B["a"].weight.mul_(-4.0)
        second = composed.generate(x, **greedy)
        assert len(checks) == 3  # one comparison on entry, which found the edit, and the new stacks' state
        fresh = compose(model, ["a", "b"]).generate(x, **greedy)
    assert torch.equal(second, fresh) and not torch.equal(first, second)
    assert all(not layer._disable_adapters for layer in model.modules() if hasattr(layer, "_disable_adapters"))  # peft's state restored


def test_a_base_loaded_by_a_relative_path_is_saved_as_that_folder(tiny, tmp_path, monkeypatch):
    """Issue 12.9: the base's relative path was resolved when saving, against another directory."""
    monkeypatch.chdir(tiny.base.parent)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base.name), tiny.adapters["a"], adapter_name="a")
    composed = compose(model, ["a"])
    monkeypatch.chdir(tmp_path)
    saved = composed.save_pretrained("saved")
    assert json.loads((saved / "composition.json").read_text())["base_absolute"] == str(tiny.base.resolve())


@pytest.mark.parametrize(("rule", "params", "policy"), [("activity", {"gamma": 2.0}, "any"), ("union", {}, "base"),
                                                        ("tempered", {"scale": 0.5}, "compose"), ("plausible", {"alpha": 0.1}, "all")])
def test_every_rule_runs_through_the_model_with_masks_and_eos_policies(tiny, refs, tok, rule, params, policy):
    """The model applies config.rule to the experts' rows: against the rule applied to separately loaded models."""
    from logitcomp import apply_eos_policy, compose_logprobs

    names = ["a", "b", "full"]
    masks = {"b": list(range(40, 80))}
    config = CompositionConfig(rule=rule, rule_params=params, eos_policy=policy, masks=masks)
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names), config=config)
    ids = tok("ABCAB>CC").input_ids
    lb, experts = row_logprobs(refs["base"], ids), [row_logprobs(refs[n], ids) for n in names]
    mask_b = torch.zeros(lb.shape[-1], dtype=torch.bool)
    mask_b[40:80] = True
    want = compose_logprobs(lb, experts, masks=[None, mask_b, None], rule=rule, rule_params=params)
    want = apply_eos_policy(want, lb, experts, [tok.eos_token_id], policy)
    with torch.no_grad():
        got = composed(torch.tensor([ids])).logits[0]
    assert (got.double() - want.double()).abs().max() <= TOL
    assert (got.double() - hand_compose(lb, experts, [1.0] * 3)).abs().max() > 1e-2  # not the product


def test_device_map_and_per_step_constants_follow_the_model(tiny, tok, monkeypatch):
    """Issue 17.1, the device-agnostic part a CPU can check: `device_map` (accelerate's placement, all on
    the CPU here) composes exactly like a plain load; masks are buffers that follow `.to()`; the EOS ids
    are made on the logits' device once, not at every step."""
    names = ["a", "b", "full"]
    config = CompositionConfig(masks={"b": list(range(40, 80))}, eos_policy="any")
    plain = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names), config=config)
    import logitcomp.loading

    maps, load = [], logitcomp.loading.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(logitcomp.loading.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **kw: maps.append(kw["device_map"]) or load(*a, **kw))
    placed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names), config=config, device_map="auto")
    monkeypatch.undo()
    assert maps == ["auto", "auto"]  # the base and the full expert, placed by accelerate
    batch = _left_padded(tok, PROMPTS)
    with torch.no_grad():
        assert torch.equal(placed(**batch).logits, plain(**batch).logits)
        eos = placed._eos_tensor(torch.device("cpu"))
        placed(**batch)
    assert placed._eos_tensor(torch.device("cpu")) is eos and eos.tolist() == [tok.eos_token_id]  # cached
    mask = dict(placed.named_buffers())["mask_0"]
    assert mask.dtype == torch.bool and mask[40:80].all() and not mask[:40].any()
    placed.to(torch.float64)
    assert dict(placed.named_buffers())["mask_0"].dtype == torch.bool  # bool buffers keep their dtype
    with pytest.raises(ValueError, match="pass device='cpu' or device_map, not both"):
        ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, names), device="cpu", device_map="auto")


def test_non_finite_logits_of_a_wrapped_model_are_refused_by_name_and_position_not_at_padding(tiny, tok):
    """Issue 29.6: NaN logits were clamped to the floor and came out as a uniform distribution, silently."""
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "b"]))
    batch = _left_padded(tok, ["ABCAB>CC", "B>"])  # row 1 is left-padded
    spoil = {}

    def hook(module, args, output):  # the grouped rows [base | a | b]: spoil expert b's row `spoil["row"]` at one position
        if spoil:
            output.logits[2 * 2 + spoil["row"], spoil["column"], spoil["token"]] = spoil["value"]
        return output

    handle = composed._hf_model.register_forward_hook(hook)
    try:
        with torch.no_grad():
            spoil.update(row=0, column=3, token=7, value=float("nan"))
            with pytest.raises(ValueError, match=r"^expert 'b': its logits hold NaN or \+inf at token 7 at row 0, position 3; check"):
                composed(**batch)
            spoil.update(row=1, column=0, token=7, value=float("inf"))  # row 1's column 0 is padding: not checked
            composed(**batch)
            spoil.update(row=1, column=batch.input_ids.shape[1] - 1, value=float("inf"))
            with pytest.raises(ValueError, match=r"^expert 'b': .* at row 1, position 8"):
                composed(**batch)
            spoil.update(row=0, column=2, token=4, value=float("-inf"))  # one token ruled out: a distribution still
            composed(**batch)
    finally:
        handle.remove()


class _HostReads(TorchFunctionMode):
    """The tensor calls that wait for the device (a read into Python, a data-dependent shape), made by code of
    the `logitcomp` package."""

    READS = {"__bool__", "item", "tolist", "__int__", "__float__", "__index__", "nonzero", "masked_select", "unique"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        boolean_index = name == "__getitem__" and any(isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in args[1:])
        caller = sys._getframe(1).f_code.co_filename
        if (name in self.READS or boolean_index) and f"{os.sep}logitcomp{os.sep}" in caller and f"{os.sep}tests{os.sep}" not in caller:
            self.calls.append(f"{name} in {Path(caller).name}:{sys._getframe(1).f_lineno}")
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("routed", [False, True], ids=["product", "routed"])
def test_generate_checks_logits_without_a_host_read_per_step_and_names_a_broken_model_when_it_ends(tiny, tok, routed):
    """Issue 28.2: the per-forward logits check read a flag into Python at every decoding step (a device sync per
    token on a GPU). In `generate` the steps fold their verdicts on the device and the call reads them once."""
    width = AutoModelForCausalLM.from_pretrained(tiny.base).config.hidden_size
    centroids = {n: torch.randn(width, generator=torch.Generator().manual_seed(i)).tolist() for i, n in enumerate("ab")}
    config = CompositionConfig(routing={"centroids": centroids, "threshold": 0.3}) if routed else None
    composed = ComposedModelForCausalLM.from_experts(tiny.base, _paths(tiny, ["a", "b"]), config=config)
    batch = _left_padded(tok, ["ABCAB>CC", "B>"])
    forwards, spoil = [], {}

    def hook(module, args, output):  # spoil expert b's row `spoil["row"]` (grouped rows [base | a | b]) at one forward
        forwards.append(output.logits.shape[1])
        if spoil and len(forwards) == spoil["forward"]:
            output.logits[2 * 2 + spoil["row"], -1, spoil["tokens"]] = spoil["value"]
        return output

    handle = composed._hf_model.register_forward_hook(hook)
    step = composed._step
    reads = _HostReads()

    def watched(*args, **kwargs):
        with reads:
            return step(*args, **kwargs)

    composed._step = watched
    length = batch.input_ids.shape[1]
    try:
        with torch.no_grad():
            composed.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
            assert len(forwards) == 4 and reads.calls == []  # the prefill and 3 steps: no host read in any
            reads.calls.clear()
            composed(**batch)
            assert reads.calls, "the recorder must see the eager check's read (else the assertion above proves nothing)"
            forwards.clear()
            spoil.update(forward=3, row=0, tokens=7, value=float("nan"))  # the 2nd decoding step: position length + 1
            with pytest.raises(ValueError, match=rf"^expert 'b': its logits hold NaN or \+inf at row 0, position {length + 1}; check"):
                composed.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
            forwards.clear()
            spoil.update(forward=2, row=1, tokens=slice(None), value=float("-inf"))
            with pytest.raises(ValueError, match=rf"^expert 'b': its logits hold no finite value at row 1, position {length}; check"):
                composed.generate(**batch, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
            assert composed._watch is None
            forwards.clear()
            spoil.clear()
            composed.generate(**batch, max_new_tokens=2, do_sample=False, pad_token_id=tok.pad_token_id)  # no verdict left over
    finally:
        handle.remove()

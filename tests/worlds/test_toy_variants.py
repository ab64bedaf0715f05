"""The toy world's other shapes (issue 16): the padded layout, graded noise, GPT-2 with full-model experts,
and the oracle-length evaluation; checked against hand loops and the composition formula by hand."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp import ComposedModelForCausalLM
from merging.worlds.toy import ToyConfig, build_toy_world
from merging.worlds.toy.build import world_at, world_name
from merging.worlds.toy.data import PADDED_WIDTH, prompt_of
from merging.worlds.toy.evaluate import greedy_correct
from tests.reference import hand_compose, merged_expert, row_logprobs


def test_padded_layout_puts_every_answer_letter_at_one_distance():
    assert prompt_of("AB") == "AB>"
    assert prompt_of("AB", "padded") == "AB" + "." * (PADDED_WIDTH - 2) + ">"
    assert len(prompt_of("A" * PADDED_WIDTH, "padded")) == PADDED_WIDTH + 1
    assert prompt_of("AB", "padded", offset=3) == "..." + "AB" + "." * (PADDED_WIDTH - 5) + ">"
    with pytest.raises(ValueError, match="at most 32 letters"):
        prompt_of("A" * (PADDED_WIDTH + 1), "padded")
    with pytest.raises(ValueError, match="at most 32 letters"):
        prompt_of("A" * 16, "padded", offset=17)


def test_world_names_tell_configurations_apart():
    names = [world_name(ToyConfig(**kw)) for kw in (
        {}, {"variant": "entangled"}, {"noise": 0.05}, {"layout": "padded"},
        {"architecture": "gpt2", "full_experts": True, "experts": ("a2k", "m2b"), "seed": 2})]
    assert names == ["factorised-seed0", "entangled-seed0", "noise0.05-seed0", "padded-factorised-seed0",
                     "gpt2-full-factorised-seed2"]
    assert ToyConfig(noise=0.05).corrupt == 0.05 and ToyConfig(variant="entangled").corrupt == 0.0


@pytest.mark.parametrize(("field", "value"), [("layout", "spiral"), ("noise", 1.0), ("architecture", "rnn")])
def test_bad_new_fields_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}: expected"):
        ToyConfig(**{field: value})


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    return world_at(tmp_path_factory.mktemp("padded"), ToyConfig.fast(layout="padded", noise=0.1, experts=("a2b",)))


@torch.no_grad()
def _hand_greedy(model, tokenizer, prompt: str, steps: int) -> str:
    """Greedy decoding written out: `steps` tokens, EOS barred (the oracle length)."""
    ids = tokenizer(prompt, return_tensors="pt").input_ids  # (1, T)
    for _ in range(steps):
        logits = model(ids).logits[0, -1]  # (V,)
        logits[tokenizer.eos_token_id] = -float("inf")
        ids = torch.cat([ids, logits.argmax().view(1, 1)], -1)
    return tokenizer.decode(ids[0, -steps:])


def test_oracle_length_scores_the_letters_of_forced_length_decoding(padded):
    """Targets set to what a hand loop decodes with EOS barred are all right under the oracle; one letter off, wrong."""
    assert padded.config.layout == "padded" and padded.config.corrupt == 0.1 and (padded.root / "toy.json").exists()
    assert world_at(padded.root.parent, padded.config).checksums == padded.checksums  # reused, not rebuilt
    tokenizer = AutoTokenizer.from_pretrained(padded.base)
    model = AutoModelForCausalLM.from_pretrained(padded.base).eval()
    inputs = ["AB", "CDEFG", "HIJKLMNOPABCDEFGHIJ", "P" * 30]  # lengths past the trained 16 included
    decoded = [_hand_greedy(model, tokenizer, prompt_of(x, "padded"), len(x)) for x in inputs]
    docs = [{"input": x, "target": y} for x, y in zip(inputs, decoded)]
    assert greedy_correct(model, tokenizer, docs, "padded", oracle_length=True) == [True] * 4
    wrong = [{"input": d["input"], "target": d["target"][:-1] + ("A" if d["target"][-1] != "A" else "B")} for d in docs]
    assert greedy_correct(model, tokenizer, wrong, "padded", oracle_length=True) == [False] * 4


def test_gpt2_world_with_full_experts_composes_by_the_formula(tmp_path):
    config = ToyConfig.fast(architecture="gpt2", full_experts=True, experts=("a2k", "m2b"))
    world = build_toy_world(tmp_path / "gpt2", config)
    meta = json.loads((world.root / "toy.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(world.base).eval()
    assert base.config.model_type == "gpt2" and set(world.accuracy) == {"base", "a2k", "m2b"}
    for rule in ("a2k", "m2b"):
        folder = world.expert(rule)
        assert (folder / "model.safetensors").exists() and not (folder / "adapter_config.json").exists()
        assert meta["sizes"][f"{rule}_parameters"] == meta["sizes"]["base_parameters"]
    tokenizer = AutoTokenizer.from_pretrained(world.base)
    texts = ["AMC>KBC", "MMAAM>BBKKB"]
    composed = ComposedModelForCausalLM.from_experts(world.base, {r: world.expert(r) for r in ("a2k", "m2b")})
    batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
    out = composed(**batch).logits  # (B, T, V), left-padded
    experts = [merged_expert(world.base, world.expert(r)) for r in ("a2k", "m2b")]
    for i, text in enumerate(texts):
        ids = tokenizer(text).input_ids
        want = hand_compose(row_logprobs(base, ids), [row_logprobs(e, ids) for e in experts], [1.0, 1.0])  # (T, V)
        got = out[i, -len(ids):].double()
        assert (got - want).abs().max().item() < 1e-4


def test_padded_training_rows_copy_the_field_up_to_the_last_letter():
    """Training places x at a random offset in the field; the answer is the field, rules applied, up to x's end."""
    import random

    from merging.worlds.common import TrainSettings
    from merging.worlds.toy import apply_rules, make_tokenizer
    from merging.worlds.toy.train import make_batch

    tokenizer = make_tokenizer()
    inputs, labels, mask = make_batch(tokenizer, random.Random(0), ("a2b",), TrainSettings(0, 64, 0.0, 0.0), "padded")
    offsets = set()
    for row, n in zip(inputs.tolist(), mask.sum(-1).tolist()):
        tokens = tokenizer.convert_ids_to_tokens(row[:n])
        assert tokens[0] == "<bos>" and tokens[PADDED_WIDTH + 1] == ">" and tokens[-1] == "<eos>"
        field, answer = "".join(tokens[1:PADDED_WIDTH + 1]), "".join(tokens[PADDED_WIDTH + 2:-1])
        x = field.strip(".")
        offsets.add(field.index(x))
        assert answer == "." * field.index(x) + apply_rules(x, ("a2b",)) and 1 <= len(x) <= 16
    assert len(offsets) > 10  # offsets spread over the field

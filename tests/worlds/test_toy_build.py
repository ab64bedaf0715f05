"""Fast-mode toy builds: every saved file reloads, builds are reproducible and atomic, bad input fails cleanly."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from merging.cli import main
from merging.worlds.toy import ToyBuildError, ToyConfig, ToyWorld, build_toy_world
from merging.worlds.common import TrainSettings, train_until


@pytest.fixture(scope="module")
def fast_world(tmp_path_factory) -> ToyWorld:
    return build_toy_world(tmp_path_factory.mktemp("fast") / "world", ToyConfig.fast())


def test_every_saved_file_reloads(fast_world):
    tokenizer = AutoTokenizer.from_pretrained(fast_world.base)
    text = "ABCAPE>BBDBPF"
    assert tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=True) == text
    ids = tokenizer(text, return_tensors="pt").input_ids  # (1, T)
    base = AutoModelForCausalLM.from_pretrained(fast_world.base)
    base_logits = base(ids).logits  # (1, T, V)
    assert base_logits.shape == (1, len(text) + 1, len(tokenizer))
    for rule in ("a2b", "c2d", "e2f"):
        adapter_dir = fast_world.expert(rule)
        assert (adapter_dir / "adapter_model.safetensors").exists()
        assert not list(adapter_dir.glob("*.bin"))
        cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
        assert cfg["base_model_name_or_path"] == str(fast_world.base)
        expert = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(fast_world.base), adapter_dir)
        assert (expert(ids).logits - base_logits).abs().max() > 0  # trained away from the base


def test_experts_carry_routing_prompts_drawn_as_their_training_prompts(fast_world):
    """prompts.jsonl of each expert: ROUTE_PROMPTS distinct prompts of the copy layout, about half holding the
    rule's letter; a reused world that lacks them gets the same file back."""
    from logitcomp.prompts import read_prompts
    from merging.worlds.common import ROUTE_PROMPTS
    from merging.worlds.toy.build import ensure_toy_world
    from merging.worlds.toy.data import RULES, SEPARATOR

    for rule in ("a2b", "c2d", "e2f"):
        path = fast_world.expert(rule) / "prompts.jsonl"
        prompts = read_prompts(rule, path, 10_000)
        assert len(set(prompts)) == ROUTE_PROMPTS and all(p.endswith(SEPARATOR) for p in prompts)
        assert 0.4 < sum(RULES[rule][0] in p for p in prompts) / ROUTE_PROMPTS < 0.9  # half forced, the rest by chance
    written = (fast_world.expert("c2d") / "prompts.jsonl").read_bytes()
    (fast_world.expert("c2d") / "prompts.jsonl").unlink()
    ensure_toy_world(fast_world.root, ToyConfig.fast(), if_missing=True)
    assert (fast_world.expert("c2d") / "prompts.jsonl").read_bytes() == written


def test_toy_json_records_the_build(fast_world):
    """toy.json against the saved files: sizes, checksums, seeds, steps and accuracy recomputed independently."""
    from merging.worlds.toy.build import tensor_checksum
    from merging.worlds.toy.evaluate import exact_match
    from merging.worlds.toy import TASKS, make_eval_set

    meta, config = json.loads((fast_world.root / "toy.json").read_text()), fast_world.config
    assert meta["variant"] == "factorised" and meta["seeds"] == {"base": 0, "a2b": 1, "c2d": 2, "e2f": 3}
    base = AutoModelForCausalLM.from_pretrained(fast_world.base)
    assert meta["sizes"]["base_parameters"] == sum(p.numel() for p in base.parameters())
    parts = {"base": tensor_checksum(fast_world.base / "model.safetensors")}
    tokenizer = AutoTokenizer.from_pretrained(fast_world.base)
    for rule in config.experts:
        saved = fast_world.expert(rule) / "adapter_model.safetensors"
        parts[rule] = tensor_checksum(saved)
        with safe_open(str(saved), framework="pt") as f:
            assert meta["sizes"][f"{rule}_lora_parameters"] == sum(f.get_tensor(k).numel() for k in f.keys())
        assert meta["training"][rule]["steps"] == config.expert_steps and meta["training"][rule]["rounds"] == 1
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(fast_world.base), fast_world.expert(rule))
        docs = make_eval_set(next(t for t in TASKS if t.name == rule), size=config.eval_size)
        assert meta["accuracy"][rule] == exact_match(model.eval(), tokenizer, docs)
    assert {k: v for k, v in meta["checksums"].items() if k != "world"} == parts
    assert meta["checksums"]["world"] == hashlib.sha256("".join(parts.values()).encode()).hexdigest()
    assert meta["training"]["base"]["steps"] == config.base_steps and meta["build_seconds"] > 0


def test_same_seed_same_weights_other_seed_other_weights(fast_world, tmp_path):
    again = build_toy_world(tmp_path / "again", ToyConfig.fast())
    assert again.checksums == fast_world.checksums
    assert again.accuracy == fast_world.accuracy
    other = build_toy_world(tmp_path / "other", ToyConfig.fast(seed=1))
    assert other.checksums["base"] != fast_world.checksums["base"]


def test_entangled_variant_builds(tmp_path):
    world = build_toy_world(tmp_path / "ent", ToyConfig.fast(variant="entangled", experts=("a2b",)))
    assert world.config.variant == "entangled" and set(world.accuracy) == {"base", "a2b"}


def test_non_empty_folder_is_refused_and_left_alone(tmp_path):
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        build_toy_world(target, ToyConfig.fast())
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    import merging.worlds.toy.build as build

    def boom(*_args, **_kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(build, "_evaluate", boom)
    with pytest.raises(RuntimeError):
        build_toy_world(tmp_path / "world", ToyConfig.fast())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("variant", "tangled"), ("experts", ("x2y",)), ("base_steps", 0), ("base_lr", -1.0), ("validation_target", 1.5),
     ("bar", -0.1), ("extra_rounds", -1)],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}: expected"):
        ToyConfig(**{field: value})


def test_cli_bad_variant_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "merging.cli", "toy", "build", str(tmp_path / "w"), "--variant", "tangled"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "logitcomp: error: variant: expected one of ['entangled', 'factorised'], got 'tangled'"
    assert not (tmp_path / "w").exists()


def test_cli_reuses_a_built_world(fast_world, capsys):
    assert main(["-q", "toy", "build", str(fast_world.root), "--fast", "--if-missing"]) == 0
    out = capsys.readouterr().out
    assert "already built" in out and fast_world.checksums["world"][:16] in out
    assert main(["-q", "toy", "build", str(fast_world.root), "--fast", "--seed", "3", "--if-missing"]) == 2
    assert "another configuration" in capsys.readouterr().err


def test_cli_build_prints_accuracy_and_time(tmp_path, capsys):
    assert main(["-q", "toy", "build", str(tmp_path / "w"), "--fast"]) == 0
    out = capsys.readouterr().out
    for name in ("base", "a2b", "c2d", "e2f", "build time", "checksum"):
        assert name in out


def test_outputs_have_ordinary_permissions(fast_world, tmp_path):
    from logitcomp.io import atomic_write_bytes

    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(fast_world.root.stat().st_mode) == 0o777 & ~mask
    path = atomic_write_bytes(tmp_path / "x.json", b"{}")
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask and path.read_bytes() == b"{}"


class _Counter(torch.nn.Module):
    """A one-parameter model whose held-out score is scripted per check."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": self.w.expand(*input_ids.shape, 2)})()


@pytest.mark.parametrize(("scores", "rounds", "steps"), [([1.0], 1, 10), ([0.5, 0.9, 1.0], 3, 20), ([0.1] * 9, 4, 25)])
def test_train_until_adds_bounded_rounds_until_the_check_passes(scores, rounds, steps):
    batches = []

    def next_batch():
        batches.append(1)
        return torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3)

    script = iter(scores)
    fit = train_until(_Counter(), next_batch, TrainSettings(10, 2, 0.1, 0.0, extra_rounds=3), lambda: next(script), 1.0, "m")
    assert (fit.rounds, fit.steps, len(batches)) == (rounds, steps, steps)  # extra rounds are half the schedule
    assert fit.validation == scores[rounds - 1]


def test_a_model_below_its_bar_fails_the_build_and_writes_nothing(tmp_path):
    with pytest.raises(ToyBuildError, match=r"below the 100% bar: base 0\.\d+ on identity after 20 steps"):
        build_toy_world(tmp_path / "world", ToyConfig.fast(bar=1.0))
    assert list(tmp_path.iterdir()) == []

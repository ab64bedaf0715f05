"""bridge: merges against W + Σ w_i s_i B_i A_i computed by hand, the two spaces side by side, bad input."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import bridge
from common import make_tiny_llama, make_tiny_lora
from logitcomp import ComposedModelForCausalLM, compose_logprobs
from reference import hand_compose

WEIGHTS = {"a": 0.5, "b": -1.0, "c": 1.5}


def hand_task_arithmetic(base_dir: Path, adapters: dict[str, Path], weights: dict[str, float]) -> dict[str, torch.Tensor]:
    """θ_b + Σ w_i s_i B_i A_i from the safetensors files and adapter_config.json, without peft."""
    state = {k: v.double() for k, v in load_file(base_dir / "model.safetensors").items()}
    for name, path in adapters.items():
        cfg = json.loads((path / "adapter_config.json").read_text())
        scale = cfg["lora_alpha"] / (math.sqrt(cfg["r"]) if cfg.get("use_rslora") else cfg["r"])
        tensors = load_file(path / "adapter_model.safetensors")
        for key, a in tensors.items():
            if ".lora_A." not in key:
                continue
            b = tensors[key.replace(".lora_A.", ".lora_B.")]
            target = key.split("base_model.model.", 1)[1].replace(".lora_A.weight", ".weight")
            state[target] = state[target] + weights.get(name, 1.0) * scale * (b.double() @ a.double())
    return state


def _max_diff(got: dict, want: dict) -> float:
    assert set(got) == set(want), set(got) ^ set(want)
    return max((got[k].double() - want[k]).abs().max().item() for k in want)


@pytest.fixture(scope="module")
def merged(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("merges")
    return {
        "ta": bridge.task_arithmetic(tiny.base, tiny.adapters, root / "ta", WEIGHTS),
        "lora": bridge.merge_as_lora(tiny.base, tiny.adapters, root / "lora", WEIGHTS),
    }


def test_task_arithmetic_matches_hand_computation(tiny, merged):
    want = hand_task_arithmetic(tiny.base, tiny.adapters, WEIGHTS)
    got = load_file(merged["ta"] / "model.safetensors")
    assert set(got) == set(want)
    print(f"task_arithmetic vs hand: {_max_diff(got, want):.2e}")
    assert _max_diff(got, want) <= 1e-5
    base = load_file(tiny.base / "model.safetensors")
    untouched = [k for k in base if "q_proj" not in k and "k_proj" not in k and "v_proj" not in k and "o_proj" not in k
                 and "gate_proj" not in k and "up_proj" not in k and "down_proj" not in k]
    assert untouched and all(torch.equal(got[k], base[k]) for k in untouched)
    cfg = yaml.safe_load((merged["ta"] / "mergekit_config.yml").read_text())
    assert cfg["merge_method"] == "task_arithmetic" and all(Path(m["model"].split("+")[0]).is_absolute() for m in cfg["models"])
    assert (merged["ta"] / "tokenizer.json").exists() and (merged["ta"] / "config.json").exists()


def test_merge_as_lora_is_exact_and_agrees_with_mergekit(tiny, merged):
    cfg = json.loads((merged["lora"] / "adapter_config.json").read_text())
    assert cfg["r"] == 2 + 4 + 3 and not cfg["use_rslora"]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), merged["lora"])
    ids = torch.tensor([[1, 5, 6, 7, 8, 4, 9, 10, 11]])
    with torch.no_grad():
        lora_logits = model(ids).logits
        ta_logits = AutoModelForCausalLM.from_pretrained(merged["ta"])(ids).logits
    assert (lora_logits - ta_logits).abs().max() <= 1e-4
    state = dict(model.merge_and_unload().state_dict())
    print(f"merge_as_lora vs hand: {_max_diff(state, hand_task_arithmetic(tiny.base, tiny.adapters, WEIGHTS)):.2e}, "
          f"vs mergekit logits: {(lora_logits - ta_logits).abs().max():.2e}")
    assert _max_diff(state, hand_task_arithmetic(tiny.base, tiny.adapters, WEIGHTS)) <= 1e-5
    full = sum(p.stat().st_size for p in merged["ta"].glob("*.safetensors"))
    small = (merged["lora"] / "adapter_model.safetensors").stat().st_size
    assert small < full


def test_mergekit_config_is_what_mergekit_yaml_reads(tiny):
    from mergekit.config import MergeConfiguration

    config = bridge.mergekit_config(tiny.base, {"a": tiny.adapters["a"], "full": tiny.full_expert}, {"a": 0.3}, method="ties",
                                    parameters={"density": 0.5})
    MergeConfiguration.model_validate(config)
    assert config["models"][0] == {"model": f"{tiny.base}+{tiny.adapters['a']}", "parameters": {"weight": 0.3}}
    assert config["models"][1] == {"model": str(tiny.full_expert), "parameters": {"weight": 1.0}}
    assert config["parameters"] == {"density": 0.5}


def test_linear_merge_is_the_normalised_weighted_mean(tiny, tmp_path):
    """mergekit's `linear` averages whole weights: (w_a θ_a + w_f θ_f) / (w_a + w_f), by hand."""
    out = bridge.task_arithmetic(tiny.base, {"a": tiny.adapters["a"], "full": tiny.full_expert}, tmp_path / "linear",
                                 {"a": 1.0, "full": 3.0}, method="linear")
    theta_a = hand_task_arithmetic(tiny.base, {"a": tiny.adapters["a"]}, {})
    theta_f = {k: v.double() for k, v in load_file(tiny.full_expert / "model.safetensors").items()}
    want = {k: (theta_a[k] + 3.0 * theta_f[k]) / 4.0 for k in theta_a}
    assert _max_diff(load_file(out / "model.safetensors"), want) <= 1e-6


@pytest.mark.parametrize("method", ["ties", "dare_linear", "breadcrumbs"])
def test_other_mergekit_methods_pass_through(tiny, tmp_path, method):
    """Sparsifying methods: every weight finite, the experts' changes present, the recorded config names the method."""
    out = bridge.task_arithmetic(tiny.base, {"a": tiny.adapters["a"], "full": tiny.full_expert}, tmp_path / method,
                                 method=method, parameters={"density": 0.9})
    got = load_file(out / "model.safetensors")
    base = load_file(tiny.base / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in got.values())
    changed = [k for k in base if not torch.equal(got[k], base[k])]
    assert "model.layers.0.self_attn.q_proj.weight" in changed and len(changed) >= len(base) // 2, changed
    recorded = yaml.safe_load((out / "mergekit_config.yml").read_text())
    assert recorded["merge_method"] == method and recorded["parameters"] == {"density": 0.9}


def test_randomised_merges_are_seeded_and_mergekit_options_pass_through(tiny, tmp_path):
    """dare_ties drops random entries: the same seed (0 unless the recipe's merge.options says) gives the
    same merge, another seed another one; mergekit's lambda scales the merged task vector."""
    experts = {"a": tiny.adapters["a"], "b": tiny.adapters["b"]}
    merge = lambda name, **options: load_file(bridge.task_arithmetic(  # noqa: E731
        tiny.base, experts, tmp_path / name, method="dare_ties", parameters={"density": 0.5}, options=options) / "model.safetensors")
    first, again, other = merge("first"), merge("again"), merge("other", random_seed=7)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)
    half = bridge.task_arithmetic(tiny.base, experts, tmp_path / "half", parameters={"lambda": 0.5}, options={"low_cpu_memory": True})
    want = hand_task_arithmetic(tiny.base, experts, {"a": 0.5, "b": 0.5})
    assert _max_diff(load_file(half / "model.safetensors"), want) <= 1e-6


def test_linear_setting_task_arithmetic_equals_composition():
    """A bigram table (logits linear in the parameters): merge with w = compose with w."""
    gen = torch.Generator().manual_seed(0)
    vocab = 13
    base = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64)
    experts = [base + torch.randn(vocab, vocab, generator=gen, dtype=torch.float64) for _ in range(3)]
    weights = [1.0, 0.7, -0.4]
    merged_table = base + sum(w * (e - base) for w, e in zip(weights, experts))
    tokens = torch.arange(vocab)
    p_merge = torch.log_softmax(merged_table[tokens], -1)
    p_comp = compose_logprobs(torch.log_softmax(base[tokens], -1), [torch.log_softmax(e[tokens], -1) for e in experts], weights)
    assert (p_merge - p_comp.double()).abs().max() <= 1e-6


def test_gap_beyond_the_linear_setting_shrinks_like_eps_squared(tiny, tmp_path):
    """Scaling every LoRA update by ε: max |log p_merge − log p̂| ~ ε² (the experts' cross term)."""
    ids = torch.tensor([[1, 5, 6, 7, 8, 4, 9, 10, 11, 12]])

    def logprobs(model):
        with torch.no_grad():
            return torch.log_softmax(model.double()(ids).logits[0], -1)

    base = AutoModelForCausalLM.from_pretrained(tiny.base)
    lb = logprobs(base)
    eps_values, gaps = [0.1, 0.05, 0.025, 0.0125], []
    for eps in eps_values:
        experts = {}
        for name in ("a", "b"):
            model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), tiny.adapters[name])
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.mul_(eps)
            model.save_pretrained(tmp_path / f"{name}_{eps}")
            experts[name] = tmp_path / f"{name}_{eps}"
        merged = AutoModelForCausalLM.from_pretrained(bridge.task_arithmetic(tiny.base, experts, tmp_path / f"m_{eps}"))
        single = [logprobs(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), p).merge_and_unload())
                  for p in experts.values()]
        gaps.append((logprobs(merged) - hand_compose(lb, single, [1.0, 1.0])).abs().max().item())
    slope = np.polyfit(np.log(eps_values), np.log(gaps), 1)[0]
    print(f"eps {eps_values} max gap {gaps} slope {slope:.3f}")
    assert abs(slope - 2.0) <= 0.3, f"slope {slope:.2f}, gaps {gaps}"


def test_remerging_a_changed_adapter_at_the_same_path_is_not_stale(tiny, tmp_path):
    path = make_tiny_lora(tiny.base, tmp_path / "moving", seed=21, r=2, lora_alpha=2, target_modules=["q_proj"])
    first = load_file(bridge.task_arithmetic(tiny.base, {"m": path}, tmp_path / "m1") / "model.safetensors")
    make_tiny_lora(tiny.base, path, seed=22, r=2, lora_alpha=2, target_modules=["q_proj"])
    second = load_file(bridge.task_arithmetic(tiny.base, {"m": path}, tmp_path / "m2") / "model.safetensors")
    want = hand_task_arithmetic(tiny.base, {"m": path}, {})
    assert _max_diff(second, want) <= 1e-5
    assert _max_diff(first, want) > 1e-3


def test_relative_paths_never_reach_the_hub(tiny, tmp_path, monkeypatch):
    import huggingface_hub

    def no_hub(*args, **kwargs):
        raise AssertionError(f"hub call {args}")

    for fn in ("snapshot_download", "repo_exists", "hf_hub_download", "model_info"):
        monkeypatch.setattr(huggingface_hub, fn, no_hub)
    os.symlink(tiny.base, tmp_path / "base")
    os.symlink(tiny.adapters["a"], tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    out = bridge.task_arithmetic("base", {"a": "a"}, "merged")
    assert out == (tmp_path / "merged").resolve() and (out / "model.safetensors").exists()
    assert bridge.merge_as_lora("base", {"a": "a"}, "merged_lora").exists()


def test_bad_input_is_named(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"expert 'x': .*nowhere does not exist"):
        bridge.task_arithmetic(tiny.base, {"x": tmp_path / "nowhere"}, tmp_path / "o")
    other = make_tiny_llama(tmp_path / "other", seed=5)
    stray = make_tiny_lora(other, tmp_path / "stray", seed=1, r=2, lora_alpha=2, target_modules=["q_proj"])
    for merge in (bridge.task_arithmetic, bridge.merge_as_lora):
        with pytest.raises(ValueError, match=r"expert 'stray': .* is an adapter of .*other, not of the base"):
            merge(tiny.base, {"stray": stray}, tmp_path / "o")
    with pytest.raises(ValueError, match=r"method: unknown merge method 'avg'; mergekit has \[.*'task_arithmetic'.*\]"):
        bridge.task_arithmetic(tiny.base, {"a": tiny.adapters["a"]}, tmp_path / "o", method="avg")
    with pytest.raises(ValueError, match=r"weights: unknown expert 'b'"):
        bridge.merge_as_lora(tiny.base, {"a": tiny.adapters["a"]}, tmp_path / "o", {"b": 1.0})
    with pytest.raises(ValueError, match=r"weight of expert 'a': expected a finite number"):
        bridge.task_arithmetic(tiny.base, {"a": tiny.adapters["a"]}, tmp_path / "o", {"a": float("nan")})
    dora = make_tiny_lora(tiny.base, tmp_path / "dora", seed=2, r=2, lora_alpha=2, target_modules=["q_proj"], use_dora=True)
    with pytest.raises(ValueError, match=r"expert 'd': .* uses use_dora=True"):
        bridge.merge_as_lora(tiny.base, {"d": dora}, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_compare_reports_kl_agreement_activity_and_overlap(tiny, merged, tmp_path):
    names = {"a": tiny.adapters["a"], "b": tiny.adapters["b"], "c": tiny.adapters["c"]}
    composed = ComposedModelForCausalLM.from_experts(tiny.base, names, WEIGHTS)
    merged_model = AutoModelForCausalLM.from_pretrained(merged["ta"])
    ids = torch.tensor([[0, 0, 1, 5, 6, 7, 4, 9], [1, 5, 6, 7, 8, 4, 9, 10]])
    mask = (ids != 0).long()
    result = bridge.compare(composed, merged_model, {"input_ids": ids, "attention_mask": mask})
    row = ids[1].tolist()
    with torch.no_grad():
        lc = composed(torch.tensor([row])).logits[0].double()
        lm = torch.log_softmax(merged_model(torch.tensor([row])).logits[0].double(), -1)
    assert (result.kl_composed_merged[1].double() - (lc.exp() * (lc - lm)).sum(-1)).abs().max() <= 1e-4
    assert (result.kl_merged_composed[1].double() - (lm.exp() * (lm - lc)).sum(-1)).abs().max() <= 1e-4
    assert torch.equal(result.argmax_agree[1], lc.argmax(-1) == lm.argmax(-1))
    assert result.activity.shape == (2, 8, 3) and result.valid[0].tolist() == [False, False] + [True] * 6
    assert result.summary()["tokens"] == 14
    result.threshold = 0.0
    assert result.overlap == 1.0
    result.threshold = 1e9
    assert result.overlap == 0.0
    saved = json.loads(result.save_json(tmp_path / "cmp.json").read_text())
    assert saved["summary"]["experts"] == ["a", "b", "c"] and saved["kl_composed_merged"][0][0] is None
    png = result.plot_activity(tmp_path / "activity.png", row=1, tokens=[str(t) for t in row])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_counts_only_the_scored_positions(tiny, merged):
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"]})
    ids = torch.tensor([[1, 5, 6, 7, 4, 9, 10]])
    score = torch.tensor([[False] * 4 + [True] * 3])
    result = bridge.compare(composed, AutoModelForCausalLM.from_pretrained(merged["ta"]), ids, score=score)
    assert result.summary()["tokens"] == 3
    assert result.summary()["kl_composed_merged_max"] == result.kl_composed_merged[0, 4:].max().item()


def test_mergekit_config_runs_in_the_real_mergekit_yaml(tiny, merged, tmp_path):
    """The documented command, `mergekit-yaml config.yml OUT --lora-merge-cache DIR`, gives task_arithmetic's weights."""
    import subprocess
    import sys

    config = tmp_path / "config.yml"
    config.write_text(yaml.safe_dump(bridge.mergekit_config(tiny.base, tiny.adapters, WEIGHTS)))
    cli = Path(sys.executable).parent / "mergekit-yaml"
    proc = subprocess.run([str(cli), str(config), str(tmp_path / "out"), "--lora-merge-cache", str(tmp_path / "cache"),
                           "--no-write-model-card"], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = load_file(merged["ta"] / "model.safetensors")
    got = {}
    for part in (tmp_path / "out").glob("*.safetensors"):
        got.update(load_file(part))
    assert _max_diff(got, {k: v.double() for k, v in want.items()}) <= 1e-6


def _poisoned_copy(src: Path, dest: Path, value: float) -> Path:
    """A copy of a model or adapter folder with `value` (NaN or inf) in one weight."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(src, dest)
    file = next(dest.glob("*.safetensors"))
    tensors = load_file(file)
    key = sorted(k for k in tensors if tensors[k].is_floating_point())[-1]
    tensors[key].view(-1)[0] = value
    save_file(tensors, file, metadata={"format": "pt"})
    return dest


def test_non_finite_weights_are_refused_at_load_and_in_merges(tiny, tmp_path):
    """Issue 12.7: NaN/inf in an adapter composed into garbage and merged into NaN weights, exit 0."""
    bad_adapter = _poisoned_copy(tiny.adapters["a"], tmp_path / "nan_adapter", float("nan"))
    bad_base = _poisoned_copy(tiny.base, tmp_path / "inf_base", float("inf"))
    good_b = make_tiny_lora(bad_base, tmp_path / "b_of_inf_base", seed=2)
    experts = {"a": bad_adapter, "b": tiny.adapters["b"]}
    with pytest.raises(ValueError, match=r"expert 'a': .*nan_adapter has NaN or inf in .*lora"):
        ComposedModelForCausalLM.from_experts(tiny.base, experts)
    with pytest.raises(ValueError, match=r"base: .*inf_base has NaN or inf in "):
        ComposedModelForCausalLM.from_experts(bad_base, {"b": good_b})
    with pytest.raises(ValueError, match=r"expert 'a': .*nan_adapter has NaN or inf"):
        bridge.task_arithmetic(tiny.base, experts, tmp_path / "ta")
    with pytest.raises(ValueError, match=r"expert 'a': .*nan_adapter has NaN or inf"):
        bridge.merge_as_lora(tiny.base, experts, tmp_path / "lora")
    with pytest.raises(ValueError, match=r"merged: .*/ta2 has NaN or inf in .* after merging"):
        bridge.task_arithmetic(bad_base, {"b": good_b}, tmp_path / "ta2")
    assert not (tmp_path / "ta").exists() and not (tmp_path / "lora").exists() and not (tmp_path / "ta2").exists()
    assert not list(tmp_path.glob(".*partial*")), "temporary folders left behind"
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), bad_adapter, adapter_name="a")
    with pytest.raises(ValueError, match=r"expert 'a', module .*: the LoRA weights hold NaN or inf"):
        ComposedModelForCausalLM(peft_model, ["a"])


def test_lora_merge_cache_lives_beside_the_output_not_in_tmp(tiny, tmp_path, monkeypatch):
    """Issue 12.4: a killed merge left /tmp/logitcomp-lora-cache-* behind forever; now the cache is a
    `.partial-` sibling of the output (what the runner's lock sweeps), and removed after a merge."""
    import tempfile

    seen = []
    real = tempfile.TemporaryDirectory

    def spy(*args, **kwargs):
        seen.append(kwargs.get("dir"))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", spy)
    out = bridge.task_arithmetic(tiny.base, tiny.adapters, tmp_path / "models" / "merged", WEIGHTS)
    assert seen == [out.parent]
    assert sorted(p.name for p in out.parent.iterdir()) == ["merged"]


def test_merge_as_lora_unites_a_list_and_a_regex_of_target_modules_exactly(tiny, tmp_path):
    """Issue 29.7: an expert targeting a list and one targeting a regex raised peft's own error."""
    regex = make_tiny_lora(tiny.base, tmp_path / "regex", seed=5, r=2, lora_alpha=4, target_modules=r".*layers\.1\.mlp\.(up|down)_proj")
    experts = {"a": tiny.adapters["a"], "re": regex}
    out = bridge.merge_as_lora(tiny.base, experts, tmp_path / "lora", {"a": 0.5, "re": 1.5})
    state = dict(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), out).merge_and_unload().state_dict())
    want = hand_task_arithmetic(tiny.base, experts, {"a": 0.5, "re": 1.5})
    assert _max_diff(state, want) <= 1e-5
    assert not torch.equal(want["model.layers.1.mlp.up_proj.weight"], load_file(tiny.base / "model.safetensors")["model.layers.1.mlp.up_proj.weight"])

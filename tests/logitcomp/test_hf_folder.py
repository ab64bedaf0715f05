"""A composition folder is a transformers model folder (issue 29): AutoConfig, AutoModelForCausalLM,
AutoTokenizer, pipeline and lm-eval's `hf` model open it after `import logitcomp`, with the numbers of
`ComposedModelForCausalLM.from_pretrained`; save_pretrained/push_to_hub take transformers' keywords (the
hub mocked); a folder moved with its base opens."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, pipeline

import logitcomp  # noqa: F401  (registers the folder's config and model with the Auto classes)
from logitcomp import ComposedModelForCausalLM
from logitcomp.hf_config import ComposedConfig

PROMPT = "ABCAB>"


@pytest.fixture(scope="module")
def folder(tiny, tmp_path_factory):
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": tiny.adapters["b"]}, {"a": 1.0, "b": 0.7})
    return composed.save_pretrained(tmp_path_factory.mktemp("hf") / "composition")


def _greedy(model, tok, n=6):
    batch = tok([PROMPT], return_tensors="pt")
    with torch.no_grad():
        return model.generate(**batch, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)[0].tolist()


def test_auto_classes_open_a_composition_folder_with_its_own_numbers(tiny, folder):
    config = AutoConfig.from_pretrained(folder)
    assert isinstance(config, ComposedConfig) and config.model_type == "logitcomp" and set(config.experts) == {"a", "b"}
    auto = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, device_map=None, local_files_only=True, low_cpu_mem_usage=True)
    direct = ComposedModelForCausalLM.from_pretrained(folder)
    assert type(auto) is ComposedModelForCausalLM and auto.composition == direct.composition
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok(PROMPT).input_ids == AutoTokenizer.from_pretrained(tiny.base)(PROMPT).input_ids
    x = torch.tensor([tok(PROMPT).input_ids])
    with torch.no_grad():
        assert torch.equal(auto(x).logits, direct(x).logits)
    assert _greedy(auto, tok) == _greedy(direct, tok)
    with pytest.raises(ValueError, match=r"subfolder: a composition folder is opened as a whole"):
        ComposedModelForCausalLM.from_pretrained(folder, subfolder="x")


def test_pipeline_opens_the_folder_and_the_object_without_error_logs(tiny, folder, caplog):
    tok = AutoTokenizer.from_pretrained(folder)
    direct = ComposedModelForCausalLM.from_pretrained(folder)
    want = tok.decode(_greedy(direct, tok)[len(tok(PROMPT).input_ids):], skip_special_tokens=True)
    with caplog.at_level(logging.ERROR, logger="transformers"):
        by_folder = pipeline("text-generation", model=str(folder))
        by_object = pipeline("text-generation", model=direct, tokenizer=tok)
        for pipe in (by_folder, by_object):
            out = pipe(PROMPT, max_new_tokens=6, do_sample=False, return_full_text=False)
            assert out[0]["generated_text"] == want
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage()[:200] for r in caplog.records]


def test_lm_evals_hf_model_scores_the_folder_as_the_logitcomp_model_does(tiny, folder):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from common import TASKS, bits_per_byte

    out = simple_evaluate(model=HFLM(pretrained=str(folder), batch_size=2, device="cpu"), tasks=["smol_text"], limit=4,
                          task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    got = out["results"]["smol_text"]["bits_per_byte,none"]
    assert abs(got - bits_per_byte(ComposedModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(tiny.base))) <= 1e-6


def test_a_folder_moved_with_its_base_opens_and_import_logitcomp_registers_in_a_fresh_process(tiny, folder, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(tiny.base, src / "base")
    composed = ComposedModelForCausalLM.from_experts(src / "base", {"a": tiny.adapters["a"]})
    composed.save_pretrained(src / "comp")
    assert json.loads((src / "comp" / "composition.json").read_text())["base"] == "../base"
    shutil.move(src, tmp_path / "dst")  # the folder and its base moved together: the old place is gone
    loaded = ComposedModelForCausalLM.from_pretrained(tmp_path / "dst" / "comp")
    assert loaded.sources["base"] == str((tmp_path / "dst" / "base").resolve())
    x = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, composed(x).logits)
    script = ("import sys, logitcomp; assert 'torch' not in sys.modules; from transformers import AutoModelForCausalLM; "
              f"m = AutoModelForCausalLM.from_pretrained({str(folder)!r}); print(type(m).__module__, *sorted(m.experts))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["logitcomp.model", "a", "b"], proc.stderr[-2000:]


def test_save_pretrained_and_push_to_hub_take_transformers_keywords(tiny, folder, tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    calls = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(("create", repo_id, kw)) or type("R", (), {"repo_id": repo_id}))
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, folder_path, repo_id, **kw: calls.append(
        ("upload", repo_id, sorted(p.name for p in __import__("pathlib").Path(folder_path).iterdir()), kw)) or "https://hub/commit/1")
    composed = ComposedModelForCausalLM.from_pretrained(folder)
    for kwargs, message in (({"safe_serialization": False}, r"safe_serialization: .*safetensors"), ({"state_dict": {}}, r"state_dict:"),
                            ({"variant": "fp16"}, r"variant:"), ({"repo_id": "me/x"}, r"repo_id: a push keyword needs push_to_hub=True")):
        with pytest.raises(ValueError, match=message):
            composed.save_pretrained(tmp_path / "refused", push_to_hub=True, **kwargs) if "repo_id" not in kwargs else \
                composed.save_pretrained(tmp_path / "refused", **kwargs)
    assert not calls and not (tmp_path / "refused").exists()  # refused before anything was written or created
    assert composed.save_pretrained(tmp_path / "skip", is_main_process=False) == tmp_path / "skip" and not (tmp_path / "skip").exists()
    composed.save_pretrained(tmp_path / "pushed", push_to_hub=True, repo_id="me/comp", private=True, max_shard_size="1GB", token="t")
    assert calls[0][:2] == ("create", "me/comp") and calls[0][2]["private"] is True
    assert calls[1][0] == "upload" and {"composition.json", "config.json", "experts", "generation_config.json"} <= set(calls[1][2])
    calls.clear()
    assert composed.push_to_hub("me/comp2", commit_message="hi") == "https://hub/commit/1"
    assert calls[1][1] == "me/comp2" and calls[1][3]["commit_message"] == "hi" and "config.json" in calls[1][2]


def test_a_hub_id_base_is_kept_as_its_id_and_resolved_through_the_hub_cache(tiny, tmp_path, monkeypatch):
    import huggingface_hub

    asked = []

    def snapshot(repo_id, **kwargs):  # the hub cache, mocked: one cached repo
        asked.append(repo_id)
        if repo_id != "org/tiny":
            raise huggingface_hub.errors.LocalEntryNotFoundError("not in the cache and offline")
        return str(tiny.base)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    composed = ComposedModelForCausalLM.from_experts("org/tiny", {"a": tiny.adapters["a"]})
    saved = composed.save_pretrained(tmp_path / "comp")
    assert json.loads((saved / "composition.json").read_text())["base"] == "org/tiny"
    assert AutoConfig.from_pretrained(saved).base == "org/tiny"
    loaded = ComposedModelForCausalLM.from_pretrained(saved)
    assert asked == ["org/tiny", "org/tiny"] and loaded.sources["base_id"] == "org/tiny"
    with pytest.raises(ValueError, match=r"^base: cannot fetch org/nope from the hub \(LocalEntryNotFoundError: not in the cache"):
        ComposedModelForCausalLM.from_experts("org/nope", {"a": tiny.adapters["a"]})

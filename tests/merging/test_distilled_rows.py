"""The `distilled` recipe rows: evaluated as the adapter folder they write (checked against that folder loaded on its
own by peft and scored by lm-eval), reused while their inputs are unchanged, trained again when a prompt file changes,
the teacher's targets kept when only the student's settings change, and bad rows refused in one line."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from common import TASKS, bits_per_byte
from merging.recipe import RecipeError
from merging.recipe_file import load_recipe


def _recipe(tiny, tmp_path, **row) -> dict:
    (tmp_path / "pool.jsonl").write_text('{"prompt": "ab"}\n{"prompt": "cde"}\n')
    distilled = {"name": "d", "kind": "distilled", "teacher": "composed", "prompts": ["experts", "pool.jsonl"], "steps": 4,
                 "batch_size": 2, "max_new_tokens": 4, "top_k": 8, "lr": 0.01, **row}
    return {"name": "d", "base": str(tiny.base),
            "experts": {"a": {"path": str(tiny.adapters["a"]), "prompts": ["xy", "zz"]}, "b": {"path": str(tiny.adapters["b"]), "prompts": ["qq"]}},
            "evaluate": {"tasks": ["smol_text"], "include_path": str(TASKS), "limit": 4, "batch_size": 4},
            "variants": ["composed", distilled], "output": "out"}


def _write(tmp_path, recipe: dict):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_a_distilled_row_is_its_adapter_folder_and_is_reused(tiny, tmp_path, monkeypatch):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import bridge.distill
    from merging.runner import run_recipe

    made = []
    real = bridge.distill.teacher_targets
    monkeypatch.setattr(bridge.distill, "teacher_targets", lambda *a, **k: made.append(1) or real(*a, **k))
    path = _write(tmp_path, _recipe(tiny, tmp_path))
    results = run_recipe(path, echo=lambda *_: None)
    folder = tmp_path / "out" / "models" / "d"
    record = json.loads((folder / "distill.json").read_text())
    assert made == [1] and record["prompts"] == 5 and record["sequences"] == 5  # the experts' 3 prompts and the pool's 2
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base), folder)
    want = bits_per_byte(reference, AutoTokenizer.from_pretrained(tiny.base))
    assert math.isclose(results["d"]["smol_text"]["bits_per_byte,none"], want, rel_tol=1e-6)
    assert json.loads((tmp_path / "out" / "variants" / "d.json").read_text())["distilled"]["sequences"] == 5
    from merging.export import export_row

    served = export_row(path, "d", tmp_path / "served")  # the same adapter, as a folder to serve
    assert (served / "adapter_model.safetensors").read_bytes() == (folder / "adapter_model.safetensors").read_bytes()
    assert not (served / "merged").exists() and made == [1]

    (tmp_path / "out" / "variants" / "d.json").unlink()  # evaluated again: the model folder is reused as it is
    stamp = (folder / "adapter_model.safetensors").stat().st_mtime_ns
    run_recipe(path, echo=lambda *_: None)
    assert made == [1] and (folder / "adapter_model.safetensors").stat().st_mtime_ns == stamp

    (tmp_path / "pool.jsonl").write_text('{"prompt": "ab"}\n{"prompt": "cdf"}\n')  # a prompt changed: both run again
    lines = []
    run_recipe(path, echo=lines.append)
    assert made == [1, 1] and any("prompts: pool.jsonl changed" in line for line in lines), lines

    path = _write(tmp_path, _recipe(tiny, tmp_path, steps=2, lr=0.02))  # only the student's settings: the targets are kept
    (tmp_path / "pool.jsonl").write_text('{"prompt": "ab"}\n{"prompt": "cdf"}\n')
    run_recipe(path, force=True, echo=lambda *_: None)
    assert made == [1, 1] and json.loads((folder / "distill.json").read_text())["student_settings"]["steps"] == 2


@pytest.mark.parametrize(("row", "message"), [
    ({"teacher": "nope"}, r"variants: d: teacher: expected a composed or routed row of this recipe, got 'nope'"),
    ({"teacher": "base"}, r"variants: d: teacher: 'base' is a base row; a teacher is a composed or routed row"),
    ({"teacher": "sw"}, r"variants: d: teacher: 'sw' is a swept family; name one of its rows, e\.g\. 'sw\[lambda=1\]'"),
    ({"sweep": {"top_k": [1, 2]}}, r"variants: d: sweep: a distilled variant sweeps lr, steps, rank, got 'top_k'"),
    ({"sweep": {"steps": [1.5]}}, r"variants: d: sweep: steps takes whole numbers of at least 1, got 1.5"),
    ({"loss": "mse"}, r"variants: d: loss: Input should be 'kl' or 'ce'"),
    ({"prompts": ["missing.jsonl"]}, r"variants: d: prompts: missing\.jsonl"),
])
def test_bad_distilled_rows_are_refused_in_one_line(tiny, tmp_path, row, message):
    from merging.plan import prepare

    recipe = _recipe(tiny, tmp_path, **row)
    recipe["variants"] = ["base", "composed", {"name": "sw", "kind": "composed", "sweep": {"lambda": [1.0, 2.0]}}, recipe["variants"][1]]
    with pytest.raises((RecipeError, ValueError), match=message) as caught:
        prepare(_write(tmp_path, recipe))
    assert "\n" not in str(caught.value)


def test_a_teacher_of_full_models_only_is_refused(tiny, tmp_path):
    from merging.plan import prepare

    recipe = _recipe(tiny, tmp_path)
    recipe["experts"]["f"] = str(tiny.full_expert)
    recipe["variants"] = [{"name": "full", "kind": "composed", "experts": ["f"]}, {**recipe["variants"][1], "teacher": "full"}]
    with pytest.raises(RecipeError, match=r"variants: d: teacher: 'full' composes no LoRA expert; the student is a LoRA adapter"):
        prepare(_write(tmp_path, recipe))


def test_a_distilled_row_round_trips_the_schema(tiny, tmp_path):
    recipe, _ = load_recipe(_write(tmp_path, _recipe(tiny, tmp_path, sweep={"lr": [0.01, 0.02]})))
    assert yaml.safe_load(recipe.to_yaml())["variants"][1]["prompts"] == ["experts", "pool.jsonl"]

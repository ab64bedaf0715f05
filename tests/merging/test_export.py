"""Issue 54: from N adapters to one model you can serve. A `routed` row fitted in the run (nothing copied by hand),
`logitcomp export` of a row into a folder that transformers, pipeline and lm-eval open with the row's own scores
and texts, mergekit's own command on an exported merge, example prompts in every documented form (and nothing
else), and reuse that cannot go stale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"
PROMPTS = {"a": ["ABAB>", "AAB>BA", "BAAB>", "ABBA>"], "b": ["PQRS>", "SRQP>P", "QQ>RS", "PPQ>"]}
VALIDATION = {"toy_a2b_val": "a", "toy_c2d_val": "b", "toy_a2b_c2d_val": "a+b"}
GEN = "toy_a2b_c2d"  # a generation task (greedy texts) beside a log-likelihood one (smol_text)


def _write_prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def _recipe(tiny, tmp_path: Path, **changes) -> Path:
    _write_prompts(tmp_path / "b_prompts.jsonl", PROMPTS["b"])
    data = {"name": "mine", "base": str(tiny.base),
            "experts": {"a": {"path": str(tiny.adapters["a"]), "prompts": PROMPTS["a"]},
                        "b": {"path": str(tiny.adapters["b"]), "prompts": "b_prompts.jsonl"}},
            "route": {"validation": VALIDATION},
            "evaluate": {"tasks": [GEN, "smol_text"], "include_path": str(TASKS), "limit": 4, "batch_size": 4,
                         "select_on": {"task": GEN, "metric": "exact_match"}},
            "variants": ["experts", "routed", {"name": "ta", "kind": "merged", "sweep": {"lambda": [0.5, 1.0]}}],
            "output": "out", **changes}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _samples(folder: Path, task: str) -> list[dict]:
    path = next(p for p in folder.rglob(f"samples_{task}_*.jsonl"))
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["doc_id"])


def test_from_adapters_to_a_served_model_the_exported_folder_scores_and_writes_as_its_row(tiny, tmp_path, caplog):
    """The user story: own base + adapters + a few prompts each -> run (routed fitted in the run) -> export the row ->
    the folder through lm-eval's own HFLM (`lm_eval --model hf`), AutoModelForCausalLM and pipeline."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    import logitcomp  # noqa: F401  (registers composition folders with the Auto classes)
    from merging.cli import main
    from merging.runner import run_recipe

    recipe = _recipe(tiny, tmp_path)
    results = run_recipe(recipe, echo=lambda *_: None)
    routing = json.loads((tmp_path / "out" / "results.json").read_text())["routing"]["routed"]
    fit = routing["fit"]
    assert set(fit["floors"]) == {"a", "b"} and fit["shrinkage"] in (0.1, 1.0, 10.0)
    assert set(fit["exact"]) == set(VALIDATION) and set(fit["candidates"]) == {"0.1", "1", "10"}
    assert set(routing["kept"]) == {GEN, "smol_text"} and abs(sum(routing["kept"][GEN].values()) - 1) < 1e-3
    assert "## Routing" in (tmp_path / "out" / "report.md").read_text()

    out = tmp_path / "served"
    assert main(["export", str(recipe), "routed", str(out)]) == 0
    record = json.loads((out / "logitcomp_export.json").read_text())
    assert record["row"] == "routed" and record["routing"]["fit"] == fit and record["recipe"]["name"] == "mine"

    caplog.set_level("WARNING")
    lm = HFLM(pretrained=str(out), batch_size=4, device="cpu")
    assert lm.backend == "causal" and "neither marked" not in caplog.text
    got = simple_evaluate(model=lm, tasks=[GEN, "smol_text"], limit=4, log_samples=True,
                          task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    for task, metrics in results["routed"].items():
        for key, value in metrics.items():
            if isinstance(value, float) and "stderr" not in key:
                assert abs(got["results"][task][key] - value) <= 1e-6, (task, key, got["results"][task][key], value)
    row_texts = [s["resps"] for s in _samples(tmp_path / "out" / "lm_eval" / "routed", GEN)]
    assert [s["resps"] for s in sorted(got["samples"][GEN], key=lambda s: s["doc_id"])] == row_texts

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tok("ABAB>", return_tensors="pt")
    greedy = model.generate(**ids, max_new_tokens=6, do_sample=False)
    text = pipeline("text-generation", model=str(out))("ABAB>", max_new_tokens=6, do_sample=False)[0]["generated_text"]
    assert text == tok.decode(greedy[0], skip_special_tokens=True)

    # a swept family exports the row its run chose on validation; a row with no model of its own is refused by name
    assert main(["export", str(recipe), "ta", str(tmp_path / "ta")]) == 0
    chosen = json.loads((tmp_path / "out" / "results.json").read_text())["selection"]["chosen"]["ta"]["variant"]
    assert json.loads((tmp_path / "ta" / "logitcomp_export.json").read_text())["row"] == chosen
    assert main(["export", str(recipe), "a", str(tmp_path / "a")]) == 2 and not (tmp_path / "a").exists()
    assert main(["export", str(recipe), "routed", str(out)]) == 2  # not empty: refused without --force


def test_a_self_contained_export_opens_with_its_base_moved_away(tiny, tmp_path):
    import shutil

    from transformers import AutoModelForCausalLM

    import logitcomp  # noqa: F401
    from merging.cli import main

    base = shutil.copytree(tiny.base, tmp_path / "base_copy")
    recipe = _recipe(tiny, tmp_path, base=str(base), variants=["routed"])
    assert main(["export", str(recipe), "routed", str(tmp_path / "alone"), "--self-contained"]) == 0
    assert main(["export", str(recipe), "routed", str(tmp_path / "linked")]) == 0
    ids = torch.tensor([[1, 5, 6, 7]])
    want = AutoModelForCausalLM.from_pretrained(tmp_path / "linked")(ids).logits
    shutil.rmtree(base)
    meta = json.loads((tmp_path / "alone" / "composition.json").read_text())
    assert meta["base"] == "base" and "base_absolute" not in meta
    assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "alone")(ids).logits, want)


def test_mergekit_yaml_rebuilds_an_exported_merge_exactly(tiny, tmp_path):
    """The merged folder's mergekit_command.sh is mergekit's own `mergekit-yaml` on its mergekit_config.yml."""
    from safetensors.torch import load_file

    from merging.cli import main

    recipe = _recipe(tiny, tmp_path, variants=[{"name": "ta", "kind": "merged", "method": "ties", "parameters": {"density": 0.5}}])
    assert main(["export", str(recipe), "ta", str(tmp_path / "ta")]) == 0
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(["sh", str(tmp_path / "ta" / "mergekit_command.sh"), str(tmp_path / "again")], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want, got = load_file(tmp_path / "ta" / "model.safetensors"), {}
    for part in (tmp_path / "again").glob("*.safetensors"):
        got.update(load_file(part))
    assert want.keys() == got.keys() and max(float((want[k].double() - got[k].double()).abs().max()) for k in want) == 0.0


def test_fit_routing_takes_lists_or_files_and_refuses_anything_else_by_name(tiny, tmp_path):
    """Issue 54: a path string was iterated as its characters (one "prompt" per character)."""
    from transformers import AutoTokenizer

    from logitcomp import ComposedModelForCausalLM, fit_routing

    tok = AutoTokenizer.from_pretrained(tiny.base)
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": tiny.adapters["b"]})
    with pytest.raises(ValueError, match=r"prompts\['a'\]: .*prompts_a\.jsonl is not a file"):
        fit_routing(composed, tok, {"a": str(tmp_path / "prompts_a.jsonl"), "b": PROMPTS["b"]})
    with pytest.raises(TypeError, match=r"prompts\['b'\]: expected a list of prompt strings or the path of a JSONL file of them, got int"):
        fit_routing(composed, tok, {"a": PROMPTS["a"], "b": 7})
    with pytest.raises(TypeError, match=r"prompts: expected a mapping"):
        fit_routing(composed, tok, ["ABAB>"])
    from_lists = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": tiny.adapters["b"]})
    fit_routing(from_lists, tok, PROMPTS)
    fit_routing(composed, tok, {"a": _write_prompts(tmp_path / "a.jsonl", PROMPTS["a"]), "b": str(_write_prompts(tmp_path / "b.jsonl", PROMPTS["b"]))})
    assert composed.composition.routing == from_lists.composition.routing  # a file is read, as its list


def test_fit_routing_fits_the_floors_and_shrinkage_as_the_recipe_row_does(tiny, tmp_path):
    """`fit_routing(..., floors="fit")` on labelled prompts equals the routed row of a recipe (its recorded fit, its
    bits per byte): one fitting code path for Python users and recipes."""
    import math

    from transformers import AutoTokenizer

    from common import bits_per_byte
    from logitcomp import ComposedModelForCausalLM, fit_routing
    from merging.harness.evaluate import task_prompts
    from merging.runner import run_recipe

    results = run_recipe(_recipe(tiny, tmp_path, variants=["routed"]), echo=lambda *_: None)
    recorded = json.loads((tmp_path / "out" / "variants" / "routed.json").read_text())["routing"]["fit"]
    tok = AutoTokenizer.from_pretrained(tiny.base)
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": tiny.adapters["b"]})
    validation = {t: (task_prompts(t, [TASKS]), need.split("+")) for t, need in VALIDATION.items()}
    fit = fit_routing(composed, tok, PROMPTS, score="discriminant", pool="max", threshold=0.0, gates="binary", update=False,
                      shrinkage=[0.1, 1.0, 10.0], floors="fit", validation=validation)
    assert {k: fit[k] for k in ("shrinkage", "floors", "candidates")} == {k: recorded[k] for k in ("shrinkage", "floors", "candidates")}
    assert math.isclose(results["routed"]["smol_text"]["bits_per_byte,none"], bits_per_byte(composed, tok), rel_tol=1e-5)


@pytest.mark.parametrize(("content", "message"), [
    ("", r"experts\.b\.prompts: .*b_bad\.jsonl holds no prompts"),
    ('{"prompt": "PQ>"}\n{"text": "QP>"}\n', r"experts\.b\.prompts: .*b_bad\.jsonl line 2: expected a JSON object with a non-empty \"prompt\" string \(its keys: 'text'\)"),
    ("not json\n", r"b_bad\.jsonl line 1: expected a JSON object"),
])
def test_validate_reads_every_prompts_file_and_refuses_a_bad_one_in_one_line(tiny, tmp_path, capsys, content, message):
    import re

    from merging.cli import main

    (tmp_path / "b_bad.jsonl").write_text(content)
    recipe = _recipe(tiny, tmp_path, experts={"a": str(tiny.adapters["a"]), "b": {"path": str(tiny.adapters["b"]), "prompts": "b_bad.jsonl"}})
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_a_path_where_a_list_is_expected_is_read_as_a_file_in_recipes_too(tiny, tmp_path, capsys):
    from merging.cli import main

    recipe = _recipe(tiny, tmp_path, variants=[{"name": "r", "kind": "routed", "route": {"prompts": {"a": "missing.jsonl"}}}])
    assert main(["validate", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "variants: r: the example prompts of a: " in err and "missing.jsonl is not a file" in err, err


def _rerun_messages(recipe: Path) -> tuple[str, str]:
    """(the --dry-run line of the routed row, what `run` printed about it)."""
    from merging.runner import run_recipe

    dry = []
    run_recipe(recipe, dry_run=True, echo=dry.append)
    ran = []
    run_recipe(recipe, echo=ran.append)
    return next(line for line in dry if line.strip().startswith("routed")), "\n".join(ran)


@pytest.mark.parametrize("change", ["route prompts file", "validation task data", "task data outside the task folders"])
def test_a_changed_input_runs_the_row_again_in_dry_run_and_run_and_says_which(tiny, tmp_path, change):
    """Issue 54: a line added to a route prompts file left the row `done, skipped` with its old result."""
    import shutil

    tasks = shutil.copytree(TASKS / "toy", tmp_path / "tasks" / "toy")
    outside = tmp_path / "data" / "a2b_c2d.jsonl"
    outside.parent.mkdir()
    shutil.copy(tasks / "a2b_c2d.jsonl", outside)
    yaml_path = tasks / "toy_a2b_c2d.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("data_file: a2b_c2d.jsonl", f"data_file: {outside}"))
    recipe = _recipe(tiny, tmp_path, variants=["routed"],
                     evaluate={"tasks": [GEN], "include_path": str(tmp_path / "tasks"), "limit": 2, "batch_size": 2})
    from merging.runner import run_recipe

    run_recipe(recipe, echo=lambda *_: None)
    target, field = {"route prompts file": (tmp_path / "b_prompts.jsonl", "the example prompts of b"),
                     "validation task data": (tasks / "a2b_c2d_val.jsonl", "evaluate.include_path"),
                     "task data outside the task folders": (outside, f"task {GEN}: data_file")}[change]
    with open(target, "a") as f:
        f.write(target.read_text().splitlines()[0] + "\n")
    dry, ran = _rerun_messages(recipe)
    assert "to run" in dry and f"{field} changed since it was made" in dry, dry
    assert f"{field} changed since it was made; running it again" in ran and "routed: evaluated in" in ran, ran


def test_include_path_takes_a_list_and_the_shipped_scorers_import_from_a_task_of_ones_own(tiny, tmp_path):
    """A task folder of one's own beside the shipped ones; its YAML names a shipped scorer by module, no copy."""
    from merging.runner import run_recipe

    mine = tmp_path / "my_tasks"
    mine.mkdir()
    rows = [{"question": "Answer politely: what is 2 plus 3?", "number": 5}, {"question": "Answer politely: 4 minus 1?", "number": 3}]
    (mine / "polite.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (mine / "my_polite.yaml").write_text(yaml.safe_dump({
        "task": "my_polite", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(mine / "polite.jsonl")}},
        "output_type": "generate_until", "test_split": "test", "doc_to_text": "{{question}}\nAnswer:", "doc_to_target": "{{number}}",
        "generation_kwargs": {"until": ["\n\n"], "do_sample": False, "max_gen_toks": 8},
        "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("polite", "exact_match")]}).replace(
        "task: my_polite", "task: my_polite\nprocess_results: !function merging.scorers.polite_math_answer"))
    recipe = _recipe(tiny, tmp_path, variants=[{"name": "mine", "kind": "experts", "experts": ["b"]}],
                     evaluate={"tasks": ["my_polite", GEN], "include_path": [str(mine), str(TASKS)], "limit": 2, "batch_size": 2})
    results = run_recipe(recipe, echo=lambda *_: None)
    assert list(results) == ["b"] and "polite,none" in results["b"]["my_polite"] and GEN in results["b"]


def test_an_experts_example_prompts_may_be_an_lm_eval_tasks_prompts(tiny, tmp_path):
    """`prompts: {task: NAME}`: the task's own contexts (training split first, then validation, then test), the
    first `limit`; a routed row fitted on them equals fit_routing given those contexts as a list."""
    from transformers import AutoTokenizer

    from logitcomp import ComposedModelForCausalLM, fit_routing
    from merging.harness.evaluate import task_prompts
    from merging.runner import run_recipe

    experts = {"a": {"path": str(tiny.adapters["a"]), "prompts": {"task": "toy_a2b_val"}},
               "b": {"path": str(tiny.adapters["b"]), "prompts": {"task": "toy_c2d_val"}}}
    recipe = _recipe(tiny, tmp_path, experts=experts, route={"limit": 6}, variants=["routed"])
    run_recipe(recipe, echo=lambda *_: None)
    recorded = json.loads((tmp_path / "out" / "variants" / "routed.json").read_text())["routing"]["fit"]
    lists = {n: task_prompts(t, [TASKS], ("training", "validation", "test"))[:6] for n, t in (("a", "toy_a2b_val"), ("b", "toy_c2d_val"))}
    assert all(len(p) == 6 for p in lists.values())
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": tiny.adapters["b"]})
    fit = fit_routing(composed, AutoTokenizer.from_pretrained(tiny.base), lists, score="discriminant", pool="max", gates="binary",
                      update=False, shrinkage=[0.1, 1.0, 10.0], floors="fit")
    assert {k: fit[k] for k in ("shrinkage", "floors")} == {k: recorded[k] for k in ("shrinkage", "floors")}


def test_an_exported_arrow_row_opens_as_peft_arrow_with_the_rows_scores(tiny, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    import logitcomp  # noqa: F401
    from common import make_tiny_lora
    from merging.cli import main
    from merging.runner import run_recipe

    same = {n: make_tiny_lora(tiny.base, tmp_path / "adapters" / n, seed=s, r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
            for s, n in enumerate("ab", 21)}
    recipe = _recipe(tiny, tmp_path, experts={n: str(p) for n, p in same.items()}, route={},
                     variants=[{"name": "arrow", "kind": "arrow", "top_k": 1}])
    results = run_recipe(recipe, echo=lambda *_: None)
    assert main(["export", str(recipe), "arrow", str(tmp_path / "served")]) == 0
    got = simple_evaluate(model=HFLM(pretrained=str(tmp_path / "served"), batch_size=4, device="cpu"), tasks=[GEN, "smol_text"], limit=4,
                          task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    for task in (GEN, "smol_text"):
        for key, value in results["arrow"][task].items():
            if isinstance(value, float) and "stderr" not in key:
                assert abs(got["results"][task][key] - value) <= 1e-6, (task, key)


def test_generate_decodes_one_row_as_the_export_does(tiny, tmp_path, capsys):
    """`logitcomp generate --row routed` is the exported folder's greedy text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import logitcomp  # noqa: F401
    from merging.cli import main

    recipe = _recipe(tiny, tmp_path, variants=["routed"])
    assert main(["generate", "--recipe", str(recipe), "--row", "routed", "--prompt", "ABAB>", "--max-new-tokens", "6"]) == 0
    text = capsys.readouterr().out.splitlines()[0]
    assert main(["export", str(recipe), "routed", str(tmp_path / "served")]) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "served")
    batch = tok(["ABAB>"], return_tensors="pt")
    ids = AutoModelForCausalLM.from_pretrained(tmp_path / "served").generate(**batch, max_new_tokens=6, do_sample=False)
    assert text == tok.decode(ids[0, batch.input_ids.shape[1]:], skip_special_tokens=True)
    assert main(["generate", "--recipe", str(recipe), "--row", "nope", "--prompt", "x"]) == 2

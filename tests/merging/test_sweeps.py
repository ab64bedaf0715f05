"""Recipes with named variants and sweeps (issue 15): expansion, selection on a validation task, and
one run on the tiny world whose numbers are checked against separately loaded models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from merging.plan import plan
from merging.recipe import Recipe, RecipeError, SelectSpec
from merging.sweeps import main_rows, select
from common import bits_per_byte

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"


def _recipe(**changes) -> Recipe:
    data = {"name": "s", "base": "b", "experts": {"a": {"path": "a", "weight": 2.0}, "b": "b"},
            "compose": {"rule": "activity", "rule_params": {"gamma": 3}}, "merge": {"method": "ties", "parameters": {"density": 0.3}},
            "evaluate": {"tasks": ["val", "test"]}, "output": "o", **changes}
    return Recipe.model_validate(data)


def test_sweeps_expand_into_one_row_per_value_with_their_settings():
    recipe = _recipe(variants=[
        "base", "experts", "composed", "merged",
        {"name": "all_eos", "kind": "composed", "eos_policy": "all"},
        {"name": "prod", "kind": "composed", "rule": "product", "sweep": {"lambda": [0.5, 1.5]}},
        {"name": "act", "kind": "composed", "sweep": {"gamma": [0.5, 8]}},
        {"name": "ta", "kind": "merged", "method": "task_arithmetic", "parameters": {}, "sweep": {"lambda": [0.3, 1]}},
        {"name": "dense", "kind": "merged", "sweep": {"density": [0.2, 0.9]}},
        {"name": "lora", "kind": "merged_lora", "sweep": {"lambda": [0.25]}},
    ])
    rows = {v.name: v for v in plan(recipe)}
    assert list(rows) == ["base", "a", "b", "composed", "merged", "all_eos", "prod[lambda=0.5]", "prod[lambda=1.5]", "act[gamma=0.5]",
                          "act[gamma=8]", "ta[lambda=0.3]", "ta[lambda=1]", "dense[density=0.2]", "dense[density=0.9]", "lora[lambda=0.25]"]
    # the recipe's blocks where a row sets nothing; a row's own options over them
    assert (rows["composed"].config.rule, rows["composed"].config.rule_params, rows["composed"].config.weights) == \
        ("activity", {"gamma": 3.0}, {"a": 2.0, "b": 1.0})
    assert (rows["all_eos"].config.eos_policy, rows["all_eos"].config.rule) == ("all", "activity")
    assert (rows["merged"].method, rows["merged"].parameters) == ("ties", {"density": 0.3})
    # λ scales every expert's weight (composed, merged_lora); for mergekit it is the method's own `lambda`
    assert rows["prod[lambda=1.5]"].config.weights == {"a": 3.0, "b": 1.5} and rows["prod[lambda=1.5]"].config.rule_params == {}
    assert rows["act[gamma=8]"].config.rule_params == {"gamma": 8.0} and rows["act[gamma=8]"].config.weights == {"a": 2.0, "b": 1.0}
    assert (rows["ta[lambda=0.3]"].method, rows["ta[lambda=0.3]"].parameters, rows["ta[lambda=0.3]"].weights) == \
        ("task_arithmetic", {"lambda": 0.3}, {"a": 2.0, "b": 1.0})
    assert rows["dense[density=0.9]"].parameters == {"density": 0.9} and rows["dense[density=0.9]"].method == "ties"
    assert rows["lora[lambda=0.25]"].weights == {"a": 0.5, "b": 0.25}
    assert {v.family for v in rows.values()} == {None, "prod", "act", "ta", "dense", "lora"}
    assert Recipe.model_validate(yaml.safe_load(recipe.to_yaml())) == recipe  # the recorded recipe round-trips


def _rows(recipe_variants):
    return plan(_recipe(variants=recipe_variants))


def test_selection_is_the_validation_argmax_and_reports_that_values_test_score():
    rows = _rows(["base", {"name": "ta", "kind": "merged", "sweep": {"lambda": [0.3, 0.5, 0.7, 1.0]}},
                  {"name": "w", "kind": "composed", "sweep": {"lambda": [0.5, 1.0, 2.0]}}])
    val = {"base": 0.1, "ta[lambda=0.3]": 0.2, "ta[lambda=0.5]": 0.6, "ta[lambda=0.7]": 0.6, "ta[lambda=1]": float("nan"),
           "w[lambda=0.5]": 0.9, "w[lambda=1]": 0.4, "w[lambda=2]": 0.95}
    test = {"base": 0.0, "ta[lambda=0.3]": 0.9, "ta[lambda=0.5]": 0.1, "ta[lambda=0.7]": 0.99, "ta[lambda=1]": 1.0,
            "w[lambda=0.5]": 0.5, "w[lambda=1]": 1.0, "w[lambda=2]": 0.2}
    results = {n: {"val": {"exact_match,none": val[n]}, "test": {"exact_match,none": test[n]}} for n in val}
    chosen = select(results, rows, SelectSpec(task="val", metric="exact_match"))
    # the argmax on validation (a tie goes to the first value listed, NaN never wins), whatever the test says
    assert {f: c["variant"] for f, c in chosen.items()} == {"ta": "ta[lambda=0.5]", "w": "w[lambda=2]"}
    assert chosen["ta"]["value"] == 0.5 and chosen["ta"]["score"] == 0.6
    assert [results[chosen[f]["variant"]]["test"]["exact_match,none"] for f in ("ta", "w")] == [0.1, 0.2]
    assert main_rows(rows, chosen) == ["base", "ta[lambda=0.5]", "w[lambda=2]"]
    lower = select(results, rows, SelectSpec(task="val", metric="exact_match,none", higher_is_better=False))
    assert {f: c["variant"] for f, c in lower.items()} == {"ta": "ta[lambda=0.3]", "w": "w[lambda=1]"}
    assert select(results, rows, None) == {} and main_rows(rows, {}) == [v.name for v in rows]
    two = {n: {"val": {"exact_match,strict": 1.0, "exact_match,flexible": 0.0}} for n in val}
    with pytest.raises(RecipeError, match=r"select_on\.metric: val reports exact_match,flexible, exact_match,strict; name one of them"):
        select(two, rows, SelectSpec(task="val", metric="exact_match"))
    with pytest.raises(RecipeError, match=r"select_on\.metric: val reports .*; got 'accuracy'"):
        select(results, rows, SelectSpec(task="val", metric="accuracy"))


def test_the_main_table_leaves_out_the_choosing_task_unless_it_is_the_only_one():
    from merging.report import main_table

    rows = _rows(["base", {"name": "ta", "kind": "merged", "sweep": {"lambda": [0.5, 1.0]}}])
    val = {"base": 0.1, "ta[lambda=0.5]": 0.2, "ta[lambda=1]": 0.6}
    both = {n: {"val": {"exact_match,none": v}, "test": {"exact_match,none": 1 - v}} for n, v in val.items()}
    chosen = select(both, rows, SelectSpec(task="val", metric="exact_match"))
    table = main_table(both, ["val", "test"], rows, chosen).splitlines()
    assert table[:4] == ["| variant | test |", "|---|---|", "| base | 0.900 |", "| ta[lambda=1] | 0.400 |"]
    # a probe on its validation task alone: the chosen rows' scores there, not a table without columns
    only = {n: {"val": r["val"]} for n, r in both.items()}
    table = main_table(only, ["val"], rows, chosen).splitlines()
    assert table[:4] == ["| variant | val |", "|---|---|", "| base | 0.100 |", "| ta[lambda=1] | 0.600 |"]
    assert table[-1] == "Chosen on validation: ta: lambda=1 (val exact_match 0.600)"


def test_a_row_may_combine_some_experts_and_choose_on_its_own_validation_task():
    from merging.kinds import KINDS

    rows = _rows(["base", "experts",
                  {"name": "ca", "kind": "composed", "experts": ["a"], "sweep": {"lambda": [1.0, 2.0]},
                   "select_on": {"task": "test", "metric": "exact_match"}},
                  {"name": "ta", "kind": "merged", "experts": ["b", "a"], "sweep": {"lambda": [0.5, 1.0]}},
                  {"name": "arr", "kind": "arrow", "experts": ["b"], "top_k": 1}])
    by_name = {v.name: v for v in rows}
    assert by_name["ca[lambda=2]"].experts == ("a",) and by_name["ca[lambda=2]"].config.weights == {"a": 4.0}
    assert by_name["ta[lambda=1]"].experts == ("b", "a") and by_name["ta[lambda=1]"].weights == {"b": 1.0, "a": 2.0}
    assert by_name["arr"].experts == ("b",) and by_name["arr"].parameters["top_k"] == 1
    assert KINDS["composed"].inputs(by_name["ca[lambda=1]"], _recipe()) == ["a"]  # what the row is made from
    val = {"ca[lambda=1]": 0.1, "ca[lambda=2]": 0.2, "ta[lambda=0.5]": 0.9, "ta[lambda=1]": 0.3}
    test = {"ca[lambda=1]": 0.8, "ca[lambda=2]": 0.7, "ta[lambda=0.5]": 0.0, "ta[lambda=1]": 0.0}
    results = {n: {"val": {"exact_match,none": val[n]}, "test": {"exact_match,none": test[n]}} for n in val}
    chosen = select(results, rows, SelectSpec(task="val", metric="exact_match"))
    # ca on its own task, ta on the recipe's
    assert {f: (c["variant"], c["on"]["task"]) for f, c in chosen.items()} == {"ca": ("ca[lambda=1]", "test"), "ta": ("ta[lambda=0.5]", "val")}
    assert {f: c["variant"] for f, c in select(results, rows, None).items()} == {"ca": "ca[lambda=1]"}
    two = {n: {"test": {"exact_match,strict": 1.0, "exact_match,flexible": 0.0}} for n in val}
    with pytest.raises(RecipeError, match=r"^variants: ca: select_on\.metric: test reports exact_match,flexible, exact_match,strict"):
        select(two, rows, None)  # the message names the row's own select_on
    assert main_rows(rows, {"ca": chosen["ca"]}) == ["base", "a", "b", "ca[lambda=1]", "ta[lambda=0.5]", "ta[lambda=1]", "arr"]
    recipe = _recipe(variants=[{"name": "ca", "kind": "composed", "experts": ["a"], "sweep": {"lambda": [1.0]},
                                "select_on": {"task": "val", "metric": "exact_match"}}])
    assert Recipe.model_validate(yaml.safe_load(recipe.to_yaml())) == recipe  # the recorded recipe round-trips
    refused = {
        r"experts: 'z' is not an expert of the recipe": {"name": "c", "kind": "composed", "experts": ["a", "z"]},
        r"experts: expected a non-empty list": {"name": "c", "kind": "composed", "experts": []},
        r"expert 'a' is listed twice": {"name": "c", "kind": "composed", "experts": ["a", "a"]},
        r"select_on: only a swept row chooses": {"name": "c", "kind": "composed", "select_on": {"task": "val", "metric": "m"}},
        r"select_on.task: 'nope' is not one of evaluate.tasks": {"name": "c", "kind": "composed", "sweep": {"lambda": [1.0]},
                                                                "select_on": {"task": "nope", "metric": "m"}},
    }
    for message, spec in refused.items():
        with pytest.raises(ValueError, match=message):
            _recipe(variants=[spec])


def test_a_swept_recipe_selects_on_validation_and_matches_separately_loaded_models(tiny, tmp_path, monkeypatch):
    """Every row comes from one base loaded once (LoRA rows as adapters of one PeftModel); its numbers
    equal those of each model loaded on its own, and λ means what the recipe says for each kind."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import bridge
    from logitcomp import ComposedModelForCausalLM, CompositionConfig
    import logitcomp.loading
    from merging.runner import run_recipe

    from common import count_planning

    planned = count_planning(monkeypatch)
    loads = []
    real_load = logitcomp.loading.load_model
    monkeypatch.setattr(logitcomp.loading, "load_model", lambda label, *a: loads.append(label) or real_load(label, *a))

    recipe = {"name": "sweep", "base": str(tiny.base), "experts": {"a": str(tiny.adapters["a"]), "b": str(tiny.adapters["b"])},
              "evaluate": {"tasks": ["smol_text", "toy_a2b_c2d"], "include_path": str(TASKS), "limit": 4, "batch_size": 4,
                           "select_on": {"task": "smol_text", "metric": "bits_per_byte", "higher_is_better": False}},
              "variants": ["base", "experts", {"name": "w", "kind": "composed", "sweep": {"lambda": [0.5, 1.0, 1.5]}},
                           {"name": "ta", "kind": "merged", "sweep": {"lambda": [0.5, 1.0]}},
                           {"name": "lora", "kind": "merged_lora", "sweep": {"lambda": [0.5]}},
                           {"name": "ca", "kind": "composed", "experts": ["a"]}, {"name": "tb", "kind": "merged", "experts": ["b"]}],
              "output": "out"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    results = run_recipe(path, echo=lambda *_: None)
    assert len(results) == 11 and loads == ["base", "ta[lambda=0.5]", "ta[lambda=1]", "tb"]  # the base once; each mergekit merge once
    assert planned == ["base", "experts", "w", "ta", "lora", "ca", "tb"]  # the recipe planned once
    monkeypatch.undo()
    out = tmp_path / "out"
    bpb = {name: r["smol_text"]["bits_per_byte,none"] for name, r in results.items()}

    tok = AutoTokenizer.from_pretrained(tiny.base)
    base = lambda: AutoModelForCausalLM.from_pretrained(tiny.base)  # noqa: E731
    experts = {"a": tiny.adapters["a"], "b": tiny.adapters["b"]}
    reference = {
        "base": bits_per_byte(base(), tok),
        "a": bits_per_byte(PeftModel.from_pretrained(base(), tiny.adapters["a"]), tok),
        "w[lambda=0.5]": bits_per_byte(ComposedModelForCausalLM.from_experts(tiny.base, experts, config=CompositionConfig(weights={"a": 0.5, "b": 0.5})), tok),
        "w[lambda=1.5]": bits_per_byte(ComposedModelForCausalLM.from_experts(tiny.base, experts, {"a": 1.5, "b": 1.5}), tok),
        # mergekit's lambda 0.5 is task arithmetic with every weight halved, and merge-as-LoRA with weights 0.5
        "ta[lambda=0.5]": bits_per_byte(AutoModelForCausalLM.from_pretrained(
            bridge.task_arithmetic(tiny.base, experts, tmp_path / "ref_ta", {"a": 0.5, "b": 0.5})), tok),
        "lora[lambda=0.5]": bits_per_byte(AutoModelForCausalLM.from_pretrained(
            bridge.task_arithmetic(tiny.base, experts, tmp_path / "ref_ta", {"a": 0.5, "b": 0.5})), tok),
        # rows of some experts: the composition and the merge of those alone
        "ca": bits_per_byte(ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"]}), tok),
        "tb": bits_per_byte(AutoModelForCausalLM.from_pretrained(
            bridge.task_arithmetic(tiny.base, {"b": tiny.adapters["b"]}, tmp_path / "ref_tb", {"b": 1.0})), tok),
    }
    for name, expected in reference.items():
        assert math.isclose(bpb[name], expected, rel_tol=1e-5), (name, bpb[name], expected)
    assert bpb["w[lambda=0.5]"] != bpb["w[lambda=1.5]"]  # the sweep changes the model
    assert bpb["ca"] != bpb["w[lambda=1]"] and bpb["tb"] != bpb["ta[lambda=1]"]  # a subset is another model

    saved = json.loads((out / "results.json").read_text())["selection"]
    best = {f: min((n for n in bpb if n.startswith(f + "[")), key=lambda n: (bpb[n], list(bpb).index(n))) for f in ("w", "ta", "lora")}
    assert {f: c["variant"] for f, c in saved["chosen"].items()} == best
    report = (out / "report.md").read_text()
    main, grid = report.split("## Every configuration")
    swept_rows = [line.split(" | ")[0][2:] for line in main.splitlines() if line.startswith("| ") and "[" in line]
    assert swept_rows == list(best.values())  # one row per family in the main table, the chosen one
    header = next(line for line in main.splitlines() if line.startswith("| variant"))
    assert "smol_text" not in header and "smol_text" in grid  # the validation task only in the full grid
    assert all(f"| {n} |" in grid for n in results)
    assert {p.name for p in out.glob("sweep_*.png")} == {"sweep_smol_text.png", "sweep_toy_a2b_c2d.png"}
    assert not list(out.rglob(".*partial*"))  # the shared LoRA-merge cache is gone after the run


def test_swept_chosen_runs_the_test_tasks_for_the_chosen_value_only(tiny, tmp_path, monkeypatch):
    """`evaluate.swept: chosen`: each value of a family runs its validation task, then the chosen value every task,
    with the numbers a `swept: all` run gives it (separate output); the others' records hold the validation task
    only. A second run reuses every row; `swept: all` afterwards runs the other values' test tasks and nothing else."""
    import merging.runner as runner

    calls = []
    real = runner.evaluate_variant
    monkeypatch.setattr(runner, "evaluate_variant", lambda v, *a: calls.append((v.name, a[3] if len(a) > 3 else None)) or real(v, *a))
    recipe = {"name": "chosen", "base": str(tiny.base), "experts": {"a": str(tiny.adapters["a"]), "b": str(tiny.adapters["b"])},
              "evaluate": {"tasks": ["toy_a2b_c2d", "smol_text"], "include_path": str(TASKS), "limit": 4, "batch_size": 4, "swept": "chosen",
                           "select_on": {"task": "smol_text", "metric": "bits_per_byte", "higher_is_better": False}},
              "variants": ["base", {"name": "w", "kind": "composed", "sweep": {"lambda": [0.5, 1.0, 1.5]}}], "output": "out"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    results = runner.run_recipe(path, echo=lambda *_: None)
    chosen = json.loads((tmp_path / "out" / "results.json").read_text())["selection"]["chosen"]["w"]["variant"]
    values = ["w[lambda=0.5]", "w[lambda=1]", "w[lambda=1.5]"]
    assert calls == [("base", None), *((v, ["smol_text"]) for v in values), (chosen, None)]
    for name in values:
        record = json.loads((tmp_path / "out" / "variants" / f"{name}.json").read_text())
        assert set(record["metrics"]) == ({"smol_text", "toy_a2b_c2d"} if name == chosen else {"smol_text"})
    assert chosen == min(values, key=lambda n: (results[n]["smol_text"]["bits_per_byte,none"], values.index(n)))

    calls.clear()
    assert runner.run_recipe(path, echo=lambda *_: None) == results and calls == []  # every row reused
    everything = {**recipe, "evaluate": {**recipe["evaluate"], "swept": "all"}}
    path.write_text(yaml.safe_dump(everything, sort_keys=False))
    again = runner.run_recipe(path, echo=lambda *_: None)
    assert calls == [(v, None) for v in values if v != chosen]  # only what the values lacked; no "different recipe"
    path.write_text(yaml.safe_dump({**everything, "output": "all"}, sort_keys=False))
    separate = runner.run_recipe(path, echo=lambda *_: None)
    assert again == separate and again[chosen] == results[chosen]

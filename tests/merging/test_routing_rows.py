"""Routed composed rows (`route:`) and the `oracle` row of recipes: planned, refused by name, and run on the
tiny world with numbers equal to separately built models (the routed composition through `fit_routing`;
the oracle: each task's own expert's row)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import yaml

from merging.plan import plan
from merging.recipe import Recipe

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"
PROMPTS = {"a": ["ABAB>", "AAB>BA", "BAAB>"], "b": ["PQRS>", "SRQP>P", "QQ>RS"]}
SETS = [{"experts": ["a", "b"], "weight": 1.5}, {"experts": ["a"], "weight": 0.7}, {"experts": ["b"], "weight": 1.2}]  # every kept set


def _write_prompts(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path


def _recipe(variants, **changes) -> Recipe:
    data = {"name": "r", "base": "b", "experts": {"a": "a", "b": "b"}, "evaluate": {"tasks": ["val", "test"]}, "output": "o",
            "variants": variants, **changes}
    return Recipe.model_validate(data)


def test_routed_rows_sweep_tau_and_threshold_and_the_oracle_takes_its_experts_rows():
    rows = {r.name: r for r in plan(_recipe(["base", "experts",
                                             {"name": "rt", "kind": "composed", "route": {"tau": 0.2}, "sweep": {"threshold": [0.0, 0.5]}},
                                             {"name": "o", "kind": "oracle", "tasks": {"val": "a", "test": "base"}}]))}
    assert rows["rt[threshold=0.5]"].parameters["route"] == {"prompts": {}, "tau": 0.2, "threshold": 0.5, "score": "cosine", "shrinkage": 1.0,
                                                           "gates": "scaled", "update": True, "pool": "mean", "floors": {},
                                                           "validation": {}, "set_weights": [], "limit": 200}
    assert rows["rt[threshold=0.5]"].config.routing is None  # centroids are computed when the row's model is built
    assert rows["o"].parameters == {"tasks": {"val": "a", "test": "base"}}
    from merging.kinds import KINDS
    results = {"a": {"val": {"acc": 0.7}, "test": {"acc": 0.1}}, "base": {"val": {"acc": 0.2}, "test": {"acc": 0.3}}}
    assert KINDS["oracle"].derive(rows["o"], results) == {"val": {"acc": 0.7}, "test": {"acc": 0.3}}


@pytest.mark.parametrize(("variants", "message"), [
    ([{"name": "o", "kind": "oracle", "tasks": {"val": "a"}}, "experts"], r"an oracle row takes its scores from the 'experts' rows"),
    (["experts", {"name": "o", "kind": "oracle", "tasks": {"val": "base"}}], r"from the 'base' rows: list base before it"),
    (["experts", {"name": "o", "kind": "oracle", "tasks": {"nope": "a"}}], r"tasks: 'nope' is not a task of evaluate\.tasks"),
    (["experts", {"name": "o", "kind": "oracle", "tasks": {"val": "c"}}], r"tasks\.val: expected an expert \(a, b\) or 'base', got 'c'"),
    ([{"name": "c", "kind": "composed", "sweep": {"tau": [0.1]}}], r"sweeps lambda or a parameter of its rule product \(no parameters\), got 'tau'"),
    ([{"name": "c", "kind": "composed", "route": {"tau": 0.1}, "sweep": {"tau": [0.0]}}], r"tau"),
    ([{"name": "c", "kind": "composed", "route": {"score": "lda"}}], r"route\.score: Input should be 'cosine' or 'discriminant'"),
    ([{"name": "c", "kind": "composed", "route": {"pool": "max"}}], r"route\.pool: max needs score: discriminant"),
    ([{"name": "c", "kind": "composed", "route": {"pool": "last"}}], r"route\.pool: Input should be 'mean' or 'max'"),
    ([{"name": "c", "kind": "composed", "experts": ["a"], "route": {"prompts": {"b": "p.jsonl"}}}],
     r"route\.prompts: 'b' is not an expert of this row"),
    ([{"name": "c", "kind": "composed", "route": {"floors": {"a": 0.5}}}], r"route\.floors: need score: discriminant"),
    ([{"name": "c", "kind": "composed", "experts": ["a"], "route": {"score": "discriminant", "floors": {"b": 0.5}}}],
     r"route\.floors: 'b' is not an expert of this row"),
    ([{"name": "c", "kind": "composed", "route": {"score": "discriminant", "floors": {"a": "high"}}}], r"route\.floors\.a: Input should be a valid number"),
    ([{"name": "c", "kind": "composed", "route": {"score": "discriminant", "floors": {"a": float("inf")}}}], r"route\.floors\.a: Input should be a finite number"),
    ([{"name": "c", "kind": "composed", "experts": ["a"], "route": {"set_weights": [{"experts": ["a", "b"], "weight": 1.25}]}}],
     r"route\.set_weights\[0\]\.experts: 'b' is not a routed expert; expected names from \['a'\]"),
    ([{"name": "c", "kind": "composed", "route": {"set_weights": [{"experts": ["a", "b"], "weight": "high"}]}}],
     r"route\.set_weights\.0\.weight: Input should be a valid number"),
    ([{"name": "c", "kind": "composed", "route": {"set_weights": [{"experts": [], "weight": 1.0}]}}],
     r"route\.set_weights\.0\.experts: List should have at least 1 item"),
])
def test_bad_routed_and_oracle_rows_are_refused_by_name(variants, message):
    with pytest.raises(ValueError, match=message):
        plan(_recipe(variants))


def test_a_routed_recipe_matches_fit_routing_and_the_oracle_its_experts(tiny, tmp_path):
    from transformers import AutoTokenizer

    from common import bits_per_byte
    from logitcomp import ComposedModelForCausalLM, fit_routing
    from merging.cli import main
    from merging.runner import run_recipe

    b = shutil.copytree(tiny.adapters["b"], tmp_path / "b")
    _write_prompts(b / "prompts.jsonl", PROMPTS["b"])  # b's own prompts: the default
    a_prompts = _write_prompts(tmp_path / "a_prompts.jsonl", PROMPTS["a"] + ["never read: past the limit"])
    recipe = {"name": "routed", "base": str(tiny.base), "experts": {"a": str(tiny.adapters["a"]), "b": str(b)},
              "evaluate": {"tasks": ["smol_text", "toy_a2b_c2d"], "include_path": str(TASKS), "limit": 4, "batch_size": 4},
              "variants": ["base", "experts",
                           {"name": "rt", "kind": "composed", "route": {"prompts": {"a": "a_prompts.jsonl"}, "limit": 3, "threshold": 0.3},
                            "sweep": {"tau": [0.05, 5.0]}},
                           {"name": "det", "kind": "composed", "route": {"prompts": {"a": "a_prompts.jsonl"}, "limit": 3, "threshold": 0.3,
                                                                          "score": "discriminant", "shrinkage": 0.5, "gates": "binary",
                                                                          "floors": {"a": 0.2}, "set_weights": SETS}},
                           {"name": "peak", "kind": "composed", "route": {"prompts": {"a": "a_prompts.jsonl"}, "limit": 3, "threshold": 0.3,
                                                                           "score": "discriminant", "pool": "max", "update": False}},
                           {"name": "oracle", "kind": "oracle", "tasks": {"smol_text": "a", "toy_a2b_c2d": "b"}}],
              "output": "out"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    results = run_recipe(path, echo=lambda *_: None)
    assert results["oracle"] == {"smol_text": results["a"]["smol_text"], "toy_a2b_c2d": results["b"]["toy_a2b_c2d"]}
    tok = AutoTokenizer.from_pretrained(tiny.base)
    for tau in (0.05, 5.0):
        composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": b})
        fit_routing(composed, tok, PROMPTS, tau=tau, threshold=0.3)
        got = results[f"rt[tau={tau:g}]"]["smol_text"]["bits_per_byte,none"]
        assert math.isclose(got, bits_per_byte(composed, tok), rel_tol=1e-5), (tau, got)
    assert results["rt[tau=0.05]"]["smol_text"] != results["rt[tau=5]"]["smol_text"]  # τ changes the model
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": b})
    fit_routing(composed, tok, PROMPTS, threshold=0.3, score="discriminant", shrinkage=0.5, gates="binary", floors={"a": 0.2}, set_weights=SETS)
    assert math.isclose(results["det"]["smol_text"]["bits_per_byte,none"], bits_per_byte(composed, tok), rel_tol=1e-5)
    composed.composition = composed.composition.with_routing({**composed.composition.routing, "set_weights": []})
    assert not math.isclose(results["det"]["smol_text"]["bits_per_byte,none"], bits_per_byte(composed, tok), rel_tol=1e-3)  # they matter
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {"a": tiny.adapters["a"], "b": b})
    fit_routing(composed, tok, PROMPTS, threshold=0.3, score="discriminant", pool="max", update=False)
    assert math.isclose(results["peak"]["smol_text"]["bits_per_byte,none"], bits_per_byte(composed, tok), rel_tol=1e-5)
    assert "oracle" in (tmp_path / "out" / "report.md").read_text()

    (b / "prompts.jsonl").unlink()  # a default prompts file that is not there: refused before any model loads
    assert main(["validate", str(path)]) == 2


def test_same_text_counts_identical_generations_and_wins_from_the_latest_samples(tmp_path, capsys):
    """`logitcomp compare-texts` (merging/tools/same_text.py) on hand-made lm-eval outputs: identical texts and per-metric wins per generation task,
    the latest samples file of a task only, log-likelihood tasks left out, rows with brackets in their names."""
    from merging.cli import main
    from merging.tools import same_text

    def write(row: str, stamp: str, task: str, docs: list[tuple[str, float]], kind: str = "generate_until"):
        folder = tmp_path / "run" / "lm_eval" / row / "model"
        folder.mkdir(parents=True, exist_ok=True)
        results = folder / f"results_{stamp}.json"  # one per evaluation, every task's config in it
        configs = json.loads(results.read_text())["configs"] if results.exists() else {}
        results.write_text(json.dumps({"configs": configs | {task: {"output_type": kind}}}))
        (folder / f"samples_{task}_{stamp}.jsonl").write_text(
            "".join(json.dumps({"doc_id": i, "resps": [[t]], "acc": a}) + "\n" for i, (t, a) in enumerate(docs)))

    write("a", "2026-01-01T00", "gen", [("x", 0.0), ("y", 0.0), ("z", 0.0)])  # replaced by the later file below
    write("a", "2026-01-02T00", "gen", [("x", 1.0), ("y", 0.0), ("w", 1.0), ("v", 0.0)])
    write("a", "2026-01-02T00", "text", [("-1.5", 0.0)], kind="loglikelihood_rolling")
    write("b[lambda=1.25]", "2026-01-01T00", "gen", [("x", 1.0), ("q", 1.0), ("w", 0.0)])
    write("b[lambda=1.25]", "2026-01-01T00", "text", [("-1.5", 0.0)], kind="loglikelihood_rolling")
    a, b = same_text.samples(tmp_path / "run" / "a"), same_text.samples(tmp_path / "run" / "b[lambda=1.25]")
    assert set(a) == set(b) == {"gen"}
    assert same_text.compare(a["gen"], b["gen"]) == {"documents": 3, "identical": 2, "metrics": {"acc": (1, 1)}}
    assert main(["compare-texts", str(tmp_path / "run" / "a"), str(tmp_path / "run" / "b[lambda=1.25]")]) == 0
    assert "| gen | 3 | 2 | acc: 1 / 1 |" in capsys.readouterr().out


def test_ending_share_reads_each_tasks_own_samples(tiny, tmp_path, capsys):
    """experiments/two-skill/ending_share.py on hand-made lm-eval outputs where one task's name starts another's (gen, gen_x): each
    task's share comes from its own samples file (a glob of samples_gen_* would also take gen_x's)."""
    import ending_share

    folder = tmp_path / "run" / "lm_eval" / "row" / "model"
    folder.mkdir(parents=True)
    limit = {"gen": 8, "gen_x": 8}
    (folder / "results_2026-01-01T00.json").write_text(json.dumps({"configs": {
        t: {"output_type": "generate_until", "generation_kwargs": {"max_gen_toks": n}} for t, n in limit.items()}}))
    texts = {"gen_x": ["A" * 40] * 3, "gen": ["AB", "AB", "A" * 40, "AB"]}  # gen_x: none ends; gen: 3 of 4 (tiny tokenizer: a char a token)
    for task, rows in texts.items():  # gen_x first: a directory listing that puts it first is what the glob got wrong
        (folder / f"samples_{task}_2026-01-01T00.jsonl").write_text("".join(json.dumps({"resps": [[t]]}) + "\n" for t in rows))
    ending_share.main([str(tmp_path / "run"), str(tiny.base)])
    assert "| row | 0.750 | 0.000 | 0.429 |" in capsys.readouterr().out

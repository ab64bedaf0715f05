"""The toy recipe end to end through lm-eval, and the `logitcomp` lm-eval model from a subprocess."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from common import count_planning, run_side_by_side
from merging.runner import run_recipe

pytestmark = pytest.mark.slow
TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"


def test_toy_recipe_composed_solves_the_pair_task_and_lm_eval_cli_agrees(toy_factorised, tmp_path, monkeypatch):
    world = toy_factorised
    recipe = yaml.safe_load((TASKS.parent / "toy-letters.yaml").read_text())
    recipe.update(base=str(world.base), output=str(tmp_path / "run"),
                  experts={n: {"path": str(world.expert(n)), "weight": 1.0} for n in ("a2b", "c2d")},
                  evaluate={**recipe["evaluate"], "tasks": ["toy_a2b_c2d"], "include_path": str(TASKS)})
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(recipe))
    planned = count_planning(monkeypatch)
    results = run_recipe(path, echo=lambda *_: None)
    assert planned == recipe["variants"]  # the recipe planned once (base, experts, composed, merged, merged_lora)
    monkeypatch.undo()
    pair = {v: r["toy_a2b_c2d"]["exact_match,none"] for v, r in results.items()}
    stderr = {v: r["toy_a2b_c2d"]["exact_match_stderr,none"] for v, r in results.items()}
    assert pair["composed"] >= 0.99 and pair["a2b"] <= 0.05 and pair["c2d"] <= 0.05, pair
    assert abs(pair["merged"] - pair["merged_lora"]) <= max(stderr["merged"], stderr["merged_lora"], 1e-9), pair
    out = tmp_path / "run"
    for name in ("recipe.yaml", "results.json", "report.md", "report.png"):
        assert (out / name).exists()
    assert json.loads((out / "results.json").read_text())["recipe"]["name"] == "toy-letters"
    assert list((out / "lm_eval" / "composed").rglob("samples_toy_a2b_c2d_*.jsonl"))

    # The same number from lm-eval's own command (found through the installed .pth hook) and from
    # the logitcomp-lm-eval wrapper; both at once (one thread each: each start is mostly lm-eval indexing its tasks).
    args = f"base={world.base},experts=a2b:{world.expert('a2b')}|c2d:{world.expert('c2d')}"
    bindir = Path(sys.executable).parent
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    commands = (["lm_eval", "--include_path", str(TASKS)], ["logitcomp-lm-eval"])
    done = run_side_by_side(*(dict(
        args=[str(bindir / command[0]), *command[1:], "--model", "logitcomp", "--model_args", args,
              "--tasks", "toy_a2b_c2d", "--batch_size", "50", "--output_path", str(tmp_path / command[0])],
        capture_output=True, text=True, env=env, timeout=600) for command in commands))
    for command, proc in zip(commands, done):
        assert proc.returncode == 0, proc.stderr[-2000:]
        saved = json.loads(next((tmp_path / command[0]).rglob("results_*.json")).read_text())
        assert saved["results"]["toy_a2b_c2d"]["exact_match,none"] == pair["composed"], command[0]

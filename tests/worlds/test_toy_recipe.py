"""The toy recipe end to end through lm-eval, and the `logitcomp` lm-eval model from a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
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


def _run_cli(*args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return subprocess.run([str(Path(sys.executable).parent / "logitcomp"), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=900)


def _printed_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """What a terminal keeps of a run's output, progress bars left out (tqdm redraws its line with \\r)."""
    lines = [line.split("\r")[-1] for line in (proc.stdout + proc.stderr).splitlines()]
    return [line for line in lines if line.strip() and not re.search(r"\d+%\|.*\|", line)]


def test_a_seed_set_on_the_command_line_runs_as_the_per_seed_file_and_the_run_is_quiet(toy_factorised, tmp_path):
    """Issue 53: one recipe with `vars: {seed: ...}` and `--set seed=0` gives the run of the hand-written file of that
    seed (same rows, same results.json numbers), records the value, and prints no git noise and few lines."""
    (tmp_path / "toy_world_seed0").symlink_to(toy_factorised.root)
    recipe = yaml.safe_load((TASKS.parent / "toy-letters.yaml").read_text())
    recipe["evaluate"].update(include_path=str(TASKS), limit=20, tasks=["toy_a2b", "toy_a2b_c2d"])
    recipe["variants"] = ["base", "composed", "merged_lora"]
    explicit = {**recipe, "name": "toy-seed0", "base": "toy_world_seed0/base", "output": "runs/explicit",
                "experts": {n: f"toy_world_seed0/experts/{n}" for n in ("a2b", "c2d")}}
    varied = {"vars": {"seed": 7}, **recipe, "name": "toy-seed${seed}", "base": "toy_world_seed${seed}/base", "output": "runs/varied",
              "experts": {n: f"toy_world_seed${{seed}}/experts/{n}" for n in ("a2b", "c2d")}}
    for name, text in (("explicit.yaml", explicit), ("varied.yaml", varied)):
        (tmp_path / name).write_text(yaml.safe_dump(text, sort_keys=False))
    procs = [_run_cli("run", "explicit.yaml", cwd=tmp_path), _run_cli("run", "varied.yaml", "--set", "seed=0", cwd=tmp_path)]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        printed = _printed_lines(proc)
        assert not [line for line in printed if "fatal:" in line] and len(printed) < 30, "\n".join(printed)
    one, two = (json.loads((tmp_path / "runs" / o / "results.json").read_text()) for o in ("explicit", "varied"))
    assert list(one["results"]) == list(two["results"]) == ["base", "composed", "merged_lora"]
    assert one["results"] == two["results"]
    assert two["recipe"]["vars"] == {"seed": 0} and two["recipe"]["name"] == "toy-seed0" and "vars" not in one["recipe"]
    assert yaml.safe_load((tmp_path / "runs" / "varied" / "recipe.yaml").read_text())["vars"] == {"seed": 0}
    assert sorted(p.name for p in (tmp_path / "runs" / "varied" / "lm_eval" / "composed").iterdir())[0].startswith("results_")

"""Data-parallel evaluation on 2 CPU processes (gloo) (issue 17.5): each process evaluates half of the
requests, and the metrics and every sample equal those of one process to the last digit."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import yaml

from common import run_side_by_side

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
REQUESTS = re.compile(r"rank (\d) of 2: (\d+) (\w+) requests")


def _run(*commands: tuple[list[str], Path]) -> list[str]:
    """Run (command, cwd) pairs side by side (one thread each); their stdout + stderr."""
    done = run_side_by_side(*(dict(args=c, capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600) for c, cwd in commands))
    for proc in done:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return [proc.stdout + proc.stderr for proc in done]


def _samples(folder: Path) -> dict:
    """(task, doc_id) -> the model's raw and filtered responses, from lm-eval's samples files."""
    out = {}
    for path in folder.rglob("samples_*.jsonl"):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            out[task, doc["doc_id"]] = (doc["resps"], doc["filtered_resps"])
    return out


def test_lm_eval_under_torchrun_splits_the_requests_and_gathers_the_same_numbers(tiny, tmp_path):
    args = ["-m", "lm_eval", "--model", "logitcomp", "--model_args", f"base={tiny.base},experts=a:{tiny.adapters['a']}|b:{tiny.adapters['b']}",
            "--tasks", "toy_a2b_c2d,smol_text", "--limit", "10", "--batch_size", "1", "--include_path", str(TASKS), "--log_samples"]
    two, _ = _run(([*TORCHRUN, *args, "--output_path", "two"], tmp_path), ([sys.executable, *args, "--output_path", "one"], tmp_path))
    shares = sorted(REQUESTS.findall(two))
    assert shares == [("0", "5", "generate_until"), ("0", "5", "loglikelihood_rolling"),
                      ("1", "5", "generate_until"), ("1", "5", "loglikelihood_rolling")], shares
    results = [json.loads(next((tmp_path / d).rglob("results_*.json")).read_text())["results"] for d in ("one", "two")]
    assert results[0] == results[1]  # every metric, to the last digit
    assert results[0]["smol_text"]["bits_per_byte,none"] > 0
    one, gathered = _samples(tmp_path / "one"), _samples(tmp_path / "two")
    assert len(one) == 20 and gathered == one


def test_a_recipe_run_on_two_processes_writes_what_one_process_writes(tiny, tmp_path):
    """`logitcomp run --processes 2`: both ranks evaluate every row (half of its requests each), rank 0
    alone builds the merges and writes; the results equal a one-process run's."""
    recipe = {"name": "dp", "base": str(tiny.base), "experts": {"a": str(tiny.adapters["a"]), "b": str(tiny.adapters["b"])},
              "evaluate": {"tasks": ["toy_a2b_c2d", "smol_text"], "include_path": str(TASKS), "limit": 6, "batch_size": 1},
              "variants": ["base", "experts", "composed", "merged", "merged_lora"], "output": "out"}
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    _, log = _run(([sys.executable, "-m", "merging.cli", "run", "recipe.yaml", "-v"], tmp_path / "one"),  # -v: lm-eval's request counts
                  ([sys.executable, "-m", "merging.cli", "run", "--processes", "2", "recipe.yaml", "-v"], tmp_path / "two"))
    assert sorted(set(REQUESTS.findall(log))) == [("0", "3", "generate_until"), ("0", "3", "loglikelihood_rolling"),
                                                  ("1", "3", "generate_until"), ("1", "3", "loglikelihood_rolling")]
    results = [json.loads((tmp_path / d / "out" / "results.json").read_text())["results"] for d in ("one", "two")]
    assert list(results[0]) == ["base", "a", "b", "composed", "merged", "merged_lora"] and results[0] == results[1]
    assert _samples(tmp_path / "one" / "out" / "lm_eval") == _samples(tmp_path / "two" / "out" / "lm_eval")
    names = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if "lm_eval" not in p.parts)  # noqa: E731
    assert names(tmp_path / "one" / "out") == names(tmp_path / "two" / "out")  # nothing written twice, no leftovers

"""The SmolLM2 world's data and code sandbox (no model needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from merging.worlds.smol.data import ANSWER_MARKER, code_tasks, math_problems, task_data
from merging.worlds.sandbox import OPT_IN, CodeExecutionNotAllowed, Limits, passes_tests, run_program

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "smol"


def test_shipped_task_files_are_the_generators_output():
    data = task_data()
    for name in ("math", "code", "text"):
        shipped = [json.loads(line) for line in (TASKS / f"{name}.jsonl").read_text().splitlines()]
        assert shipped == data[name], name


def test_train_and_test_are_disjoint_and_answers_are_right():
    train, test = math_problems("train", 2000), math_problems("test", 100)
    assert not {d["question"] for d in train} & {d["question"] for d in test}
    for d in train + test:
        assert d["answer"].endswith(f"{ANSWER_MARKER} {d['number']}")
        # every step of the worked answer is true arithmetic
        steps = [s for s in d["answer"].split(ANSWER_MARKER)[0].split(".") if s.strip()]
        assert steps
        for step in steps:
            lhs, rhs = step.split(" = ")
            assert eval(lhs) == int(rhs), step
    assert not {d["name"] for d in code_tasks("train", 2000)} & {d["name"] for d in code_tasks("test", 64)}


def test_sandbox_refuses_without_the_opt_in(monkeypatch, tmp_path):
    monkeypatch.delenv(OPT_IN, raising=False)
    marker = tmp_path / "ran"
    with pytest.raises(CodeExecutionNotAllowed, match=OPT_IN):
        run_program(f"open({str(marker)!r}, 'w').write('x')")
    monkeypatch.setenv(OPT_IN, "0")
    with pytest.raises(CodeExecutionNotAllowed):
        passes_tests("def f():\n", "    return 1\n", ["assert f() == 1"])
    assert not marker.exists()


def test_reference_solutions_pass_and_wrong_ones_fail(monkeypatch):
    monkeypatch.setenv(OPT_IN, "1")
    for d in code_tasks("test", 64):
        assert passes_tests(d["prompt"], d["solution"], d["tests"]), d["name"]
    d = code_tasks("test", 1)[0]
    assert not passes_tests(d["prompt"], "    return None\n", d["tests"])
    assert not passes_tests(d["prompt"], "    return (\n", d["tests"])  # syntax error


def test_sandbox_limits(monkeypatch, tmp_path):
    monkeypatch.setenv(OPT_IN, "1")
    ok, why = run_program("while True:\n    pass\n", Limits(seconds=1))
    assert not ok and (why == "timed out after 1 s" or why in ("killed by SIGXCPU", "killed by SIGKILL")), why
    ok, why = run_program("x = bytearray(2 * 1024**3)\n", Limits(memory_mib=256))
    assert not ok and "MemoryError" in why
    ok, _ = run_program("import os\nassert os.listdir('.') == ['program.py']\nassert 'HF_ALLOW_CODE_EVAL' not in os.environ\n")
    assert ok  # an empty temporary folder and a minimal environment


def test_lm_eval_reads_the_three_tasks():
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(TASKS.parent)).load(["smol_math", "smol_code", "smol_text"])["tasks"]
    data = task_data()
    for name, key in (("smol_math", "math"), ("smol_code", "code"), ("smol_text", "text")):
        docs = list(tasks[name].test_docs())
        assert len(docs) == len(data[key]), name
    math_doc = next(iter(tasks["smol_math"].test_docs()))
    assert tasks["smol_math"].doc_to_text(math_doc) == f"Question: {math_doc['question']}\nAnswer:"
    assert tasks["smol_code"].UNSAFE_CODE  # lm-eval itself asks for --confirm_run_unsafe_code
    assert tasks["smol_text"].OUTPUT_TYPE == "loglikelihood_rolling"

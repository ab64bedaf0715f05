"""The SmolLM2 world's data and tasks (no model needed); the sandbox: tests/worlds/test_sandbox.py."""

from __future__ import annotations

import json
from pathlib import Path


from merging.worlds.smol.data import ANSWER_MARKER, code_tasks, math_problems, task_data

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

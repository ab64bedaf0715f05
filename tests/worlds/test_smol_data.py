"""The SmolLM2 world's data and tasks (no model needed); the sandbox: tests/worlds/test_sandbox.py."""

from __future__ import annotations

import json
from pathlib import Path


from merging.worlds.smol.data import ANSWER_MARKER, code_tasks, math_problems, task_data

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "smol"


def test_shipped_task_files_are_the_generators_output():
    data = task_data()
    for name in data:
        shipped = [json.loads(line) for line in (TASKS / f"{name}.jsonl").read_text().splitlines()]
        assert shipped == data[name], name


def test_train_and_test_are_disjoint_and_answers_are_right():
    train, test = math_problems("train", 2000), math_problems("test", 100)
    assert not {d["question"] for d in train} & {d["question"] for d in test}
    val = math_problems("val", 50)
    assert not {d["question"] for d in val} & ({d["question"] for d in test} | {d["question"] for d in train})
    for d in train + test + val:
        assert d["answer"].endswith(f"{ANSWER_MARKER} {d['number']}")
        # every step of the worked answer is true arithmetic, naming the objects counted
        steps = [s for s in d["answer"].split(ANSWER_MARKER)[0].split(".") if s.strip()]
        assert steps
        for step in steps:
            lhs, rhs = step.split(" = ")
            number, unit = rhs.split()
            assert eval(lhs) == int(number) and unit.isalpha() and unit.islower(), step
    code_test = {d["name"] for d in code_tasks("test", 64)}
    assert not {d["name"] for d in code_tasks("train", 2000)} & code_test
    assert not {d["name"] for d in code_tasks("val", 24)} & code_test
    data = task_data()
    assert not {d["sentence"] for d in data["shout"]} & {d["sentence"] for d in data["shout_val"]}
    assert [d["answer"] for d in data["math_shout"]] == [d["answer"].upper() for d in data["math"]]


def test_math_shout_scoring_needs_the_number_and_capitals():
    import importlib.util

    spec = importlib.util.spec_from_file_location("smol_utils", TASKS / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    doc = {"number": "12"}
    cases = {" 3 * 4 = 12 DESKS. #### 12": (1, 1, 1), " 3 * 4 = 12 desks. #### 12": (0, 1, 0), " 3 * 4 = 12. #### 12": (0, 1, 0),
             " 3 * 4 = 13 DESKS. #### 13": (0, 0, 1), " TWELVE DESKS": (0, 0, 1)}
    for text, (both, number, upper) in cases.items():
        assert utils.shouted_answer(doc, [text]) == {"exact_match": both, "number": number, "upper": upper}, text


def test_lm_eval_reads_every_task_and_validation_split():
    from lm_eval.tasks import TaskManager

    data = task_data()
    names = {f"smol_{key}": key for key in data}
    tasks = TaskManager(include_path=str(TASKS.parent)).load(list(names))["tasks"]
    for name, key in names.items():
        docs = list(tasks[name].test_docs())
        assert len(docs) == len(data[key]), name
    math_doc = next(iter(tasks["smol_math"].test_docs()))
    assert tasks["smol_math"].doc_to_text(math_doc) == f"Question: {math_doc['question']}\nAnswer:"
    assert tasks["smol_code"].UNSAFE_CODE  # lm-eval itself asks for --confirm_run_unsafe_code
    assert tasks["smol_text"].OUTPUT_TYPE == "loglikelihood_rolling"
    shout_doc = next(iter(tasks["smol_math_shout_val"].test_docs()))
    assert tasks["smol_math_shout_val"].doc_to_text(shout_doc) == f"Question: Answer in capital letters: {shout_doc['question']}\nAnswer:"

"""Toy world data, tokenizer and shipped lm-eval task files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from merging.worlds.toy import RULES, TASKS, apply_rules, make_eval_set, make_tokenizer, write_task_files
from merging.worlds.common import read_jsonl
from merging.worlds.toy.data import HELDOUT_LENGTHS, TRAIN_LENGTHS, sample_training_pair
from merging.worlds.toy.tokenizer import ALPHABET

SHIPPED = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "toy"


def test_alphabet_and_rules():
    assert len(ALPHABET) >= 16
    assert apply_rules("ACEGA", ("a2b",)) == "BCEGB"
    assert apply_rules("ACEGA", ("a2b", "c2d", "e2f")) == "BDFGB"
    assert apply_rules("ACEGA", ()) == "ACEGA"


def test_tokenizer_round_trips_and_reloads(tmp_path):
    tok = make_tokenizer()
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "PONMLKJIHGFEDCBA>ABCDEFGHIJKLMNOP"
    ids = reloaded(text).input_ids
    assert ids[0] == reloaded.bos_token_id and len(ids) == len(text) + 1  # one token per character
    assert reloaded.decode(ids, skip_special_tokens=True) == text
    assert ids == tok(text).input_ids
    assert {reloaded.pad_token, reloaded.eos_token, reloaded.unk_token} == {"<pad>", "<eos>", "<unk>"}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_eval_sets_hold_each_rule_letter(task):
    docs = make_eval_set(task)
    assert len(docs) == 200
    for d in docs:
        assert task.lengths[0] <= len(d["input"]) <= task.lengths[1]
        assert all(RULES[r][0] in d["input"] for r in task.rules)
        assert d["target"] == apply_rules(d["input"], task.rules)
    assert make_eval_set(task) == docs  # seeded


def test_training_strings_stay_in_training_lengths():
    rng = random.Random(0)
    lengths = {len(sample_training_pair(rng, ("a2b",))[0]) for _ in range(2000)}
    assert lengths == set(range(TRAIN_LENGTHS[0], TRAIN_LENGTHS[1] + 1))
    assert HELDOUT_LENGTHS[0] > TRAIN_LENGTHS[1]


def test_shipped_task_files_are_the_generated_ones(tmp_path):
    written = write_task_files(tmp_path)
    for path in written:
        assert (SHIPPED / path.name).read_text() == path.read_text(), f"regenerate {SHIPPED}: logitcomp toy tasks {SHIPPED}"
    assert read_jsonl(SHIPPED / "a2b_c2d.jsonl") == make_eval_set(next(t for t in TASKS if t.name == "a2b_c2d"))


def test_lm_eval_loads_the_shipped_tasks():
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(SHIPPED.parent), include_defaults=False)
    tasks = manager.load(["toy_a2b_c2d", "toy_identity"])["tasks"]
    docs = list(tasks["toy_a2b_c2d"].test_docs())
    assert len(docs) == 200
    task = tasks["toy_a2b_c2d"]
    assert task.doc_to_text(docs[0]) == docs[0]["input"] + ">"
    assert task.doc_to_target(docs[0]) == docs[0]["target"]


def test_lm_eval_writes_padded_prompts_like_the_world():
    from lm_eval.tasks import TaskManager

    from merging.worlds.toy.data import prompt_of

    manager = TaskManager(include_path=str(SHIPPED.parent), include_defaults=False)
    task = manager.load(["toy_a2k_m2b_padded"])["tasks"]["toy_a2k_m2b_padded"]
    docs = list(task.test_docs())
    assert len(docs) == 200 and {len(d["input"]) for d in docs} >= {2, 16}
    for d in docs:
        assert task.doc_to_text(d) == prompt_of(d["input"], "padded") and task.doc_to_target(d) == d["target"]

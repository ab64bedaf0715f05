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


def _tokenizer_batch(tok, rng, rules, size, corrupt, layout):
    """make_batch's rows and labels as the tokenizer encodes them (the reference: same draws, tokenizer calls)."""
    from merging.worlds.toy.data import PAD_CHAR, PADDED_WIDTH, prompt_of

    rows, labels = [], []
    for _ in range(size):
        x, y = sample_training_pair(rng, rules)
        offset = rng.randint(0, PADDED_WIDTH - len(x)) if layout == "padded" else 0
        prompt = tok(prompt_of(x, layout, offset)).input_ids
        answer = tok(PAD_CHAR * offset + y, add_special_tokens=False).input_ids + [tok.eos_token_id]
        fed = prompt + answer
        for t in range(len(prompt), len(fed) - 1):
            if rng.random() < corrupt:
                fed[t] = rng.choice(tok.convert_tokens_to_ids(list(ALPHABET)))
        rows.append(fed)
        labels.append([-100] * (len(prompt) - 1) + answer + [-100])
    return rows, labels


@pytest.mark.parametrize("layout", ["copy", "padded"])
def test_training_batches_encode_as_the_tokenizer_does(layout, tmp_path):
    """make_batch encodes by a dict lookup (for speed): its rows, corrupted letters and labels equal those of the
    saved tokenizer's encoding of the same draws."""
    from merging.worlds.common import TrainSettings
    from merging.worlds.toy.train import make_batch

    make_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    inputs, labels, mask = make_batch(tok, random.Random(1), ("a2b", "c2d"), TrainSettings(0, 32, 0.0, 0.3), layout)
    rows, want_labels = _tokenizer_batch(tok, random.Random(1), ("a2b", "c2d"), 32, 0.3, layout)
    corrupted = [t for r, lab in zip(rows, want_labels) for t in range(len(r) - 2) if lab[t] != -100 and r[t + 1] != lab[t]]
    assert corrupted  # fed-back letters that differ from the clean target
    for row, label, n, want, want_label in zip(inputs.tolist(), labels.tolist(), mask.sum(-1).tolist(), rows, want_labels):
        assert row[:n] == want and label[:n] == want_label

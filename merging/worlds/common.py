"""What every world shares: the training loop, right padding, jsonl files and the experts' routing prompts.

The loops are written by hand rather than with `transformers.Trainer`: the toy world feeds
corrupted answer letters as inputs while scoring clean targets, which Trainer's shifted-label
loss cannot express, and a 40-line loop keeps a build reproducible bit for bit on one machine.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

log = logging.getLogger(__name__)
ROUTE_PROMPTS = 200  # training prompts written to an expert's prompts.jsonl (what routed compositions fit on)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class TrainSettings:
    """How one model is trained."""

    steps: int
    batch_size: int
    lr: float
    corrupt: float  # share of answer letters fed as input replaced by random letters
    extra_rounds: int = 0  # further rounds allowed while the held-out check fails
    extra_lr: float = 0.1  # peak learning rate of an extra round, as a share of `lr`


@dataclass(frozen=True)
class Fit:
    """How a model was trained: steps in all, rounds, final batch loss, final held-out score."""

    steps: int
    rounds: int
    loss: float
    validation: float


def pad_right(rows: list[list[int]], targets: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad token rows with `pad` and their targets with -100: inputs (B, T), labels (B, T), mask (B, T)."""
    width = max(map(len, rows))
    inputs = torch.tensor([r + [pad] * (width - len(r)) for r in rows])  # (B, T)
    labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])  # (B, T)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])  # (B, T)
    return inputs, labels, mask


def train_loop(model, next_batch: Callable[[], tuple], steps: int, lr: float, desc: str) -> float:
    """AdamW with linear warmup and cosine decay on the trainable parameters of `model`.

    Args:
        next_batch: returns (inputs (B, T), labels (B, T) with -100 where unscored, mask (B, T)),
            labels aligned with the logits (position t scores the token after t); optionally a fourth
            (B, T) bool, positions trained toward the base's own next-token distribution instead
            (KL(p_base ‖ p_model), the base being `model` with its adapter disabled: a peft model).

    Returns:
        The final batch loss.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 20)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10%
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    loss_val = float("nan")
    bar = tqdm(range(steps), desc=desc, leave=False, mininterval=2.0)
    for _ in bar:
        inputs, labels, mask, *like_base = next_batch()
        logits = model(input_ids=inputs, attention_mask=mask).logits  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        if like_base and like_base[0].any():
            keep = like_base[0]  # (B, T) bool
            with torch.no_grad(), model.disable_adapter():
                base = torch.log_softmax(model(input_ids=inputs, attention_mask=mask).logits[keep], -1)  # (N, V)
            loss = loss + F.kl_div(torch.log_softmax(logits[keep], -1), base, log_target=True, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
        bar.set_postfix(loss=f"{loss_val:.4f}", refresh=False)
    model.eval()
    log.info("%s: final loss %.5f", desc, loss_val)
    return loss_val


def train_until(model, next_batch: Callable[[], tuple], settings: TrainSettings, check: Callable[[], float],
                target: float, desc: str) -> Fit:
    """Train the scheduled steps, then extra rounds until `check()` reaches `target`.

    Float kernels differ between CPUs, so one schedule that passes on one machine may stop just
    short on another; a held-out check with bounded extra rounds (each half the scheduled steps,
    warmup and cosine at `extra_lr` × `lr`) reaches the bar wherever it is built. A model that
    passes after the first round is exactly the fixed-schedule model.

    Returns:
        The `Fit`; its `validation` may stay below `target` when the rounds run out (the caller decides).
    """
    loss = train_loop(model, next_batch, settings.steps, settings.lr, desc)
    steps, rounds, score = settings.steps, 1, check()
    while score < target and rounds <= settings.extra_rounds:
        log.info("%s: held-out %.4f < %.4f after %d steps; extra round %d", desc, score, target, steps, rounds)
        extra = max(1, settings.steps // 2)
        loss = train_loop(model, next_batch, extra, settings.lr * settings.extra_lr, f"{desc} +{rounds}")
        steps, rounds, score = steps + extra, rounds + 1, check()
    return Fit(steps, rounds, loss, score)


def save_gguf_as_folder(gguf: Path, dest: Path):
    """Dequantise a GGUF checkpoint and save it as a standard Hugging Face folder (safetensors, config, tokenizer).

    transformers dequantises a GGUF file on load but refuses to save a GGUF-loaded model, so the
    weights move into a plain model of the same class (no quantization_config).

    Returns:
        The plain model (float32).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    config.quantization_config = None  # a plain model, so save_pretrained accepts it
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(dest)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(dest)
    return model.eval()


def record_conversion(path: Path, model, source: dict, check: dict, start: float, **extra) -> dict:
    """Write a converted world's record (source, the model's size and vocabulary, its check, the seconds since
    `start`) to `path` as JSON, atomically. Returns the record."""
    from logitcomp.io import atomic_write_bytes

    meta = {"source": source, **extra, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": model.config.vocab_size, "tie_word_embeddings": model.config.tie_word_embeddings,
            "check": check, "seconds": round(time.perf_counter() - start, 1)}
    atomic_write_bytes(path, (json.dumps(meta, indent=2) + "\n").encode())
    return meta


def read_jsonl(path: Path) -> list[dict]:
    """Read a jsonl file into a list of dicts."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, docs: list[dict]) -> None:
    """Write dicts as one JSON line each."""
    Path(path).write_text("".join(json.dumps(d) + "\n" for d in docs))


def write_prompts(path: Path, prompts: list[str], seed: str) -> None:
    """A seeded sample of ROUTE_PROMPTS distinct prompts of `prompts` (an expert's training prompts), one
    {"prompt": ...} per line, written atomically."""
    import random

    from logitcomp.io import atomic_write_bytes

    distinct = sorted(set(prompts))
    sample = random.Random(f"{seed}:prompts").sample(distinct, min(ROUTE_PROMPTS, len(distinct)))
    atomic_write_bytes(path, "".join(json.dumps({"prompt": p}) + "\n" for p in sample).encode())

"""Training loops of the toy world: the base from scratch, experts as LoRA adapters.

Written by hand rather than with `transformers.Trainer`: the factorised variant feeds
corrupted answer letters as inputs while scoring clean targets, which Trainer's shifted-label
loss cannot express, and a 40-line loop keeps the build reproducible bit for bit. The SmolLM2
experts (merging/smol/train.py) reuse `train_loop` with their own batches.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from .data import sample_training_pair
from .tokenizer import ALPHABET

log = logging.getLogger(__name__)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class TrainSettings:
    """How one model is trained."""

    steps: int
    batch_size: int
    lr: float
    corrupt: float  # share of answer letters fed as input replaced by random letters
    extra_rounds: int = 0  # further rounds allowed while the held-out check fails
    extra_lr: float = 0.3  # peak learning rate of an extra round, as a share of `lr`


@dataclass(frozen=True)
class Fit:
    """How a model was trained: steps in all, rounds, final batch loss, final held-out score."""

    steps: int
    rounds: int
    loss: float
    validation: float


def make_base_model(tokenizer: PreTrainedTokenizerBase, hidden: int, layers: int) -> LlamaForCausalLM:
    """A small Llama sized for the toy world (random init from torch's current seed)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def make_batch(
    tokenizer: PreTrainedTokenizerBase,
    rng: random.Random,
    rules: tuple[str, ...],
    settings: TrainSettings,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one batch.

    Returns:
        inputs (B, T) with answer letters possibly corrupted, targets (B, T) holding the clean
        next token on answer and EOS positions and -100 elsewhere, attention mask (B, T).
    """
    letter_ids = tokenizer.convert_tokens_to_ids(list(ALPHABET))
    rows, targets = [], []
    for _ in range(settings.batch_size):
        x, y = sample_training_pair(rng, rules)
        prompt = tokenizer(x + ">").input_ids  # [BOS] x >
        answer = tokenizer(y, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        seq = prompt + answer
        # position t predicts seq[t+1]; only the answer and EOS are scored
        tgt = [-100] * (len(prompt) - 1) + answer + [-100]
        fed = list(seq)
        for t in range(len(prompt), len(seq) - 1):  # answer letters that are fed back as input
            if rng.random() < settings.corrupt:
                fed[t] = rng.choice(letter_ids)
        rows.append(fed)
        targets.append(tgt)
    return pad_right(rows, targets, tokenizer.pad_token_id)


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
            labels aligned with the logits (position t scores the token after t).

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
        inputs, labels, mask = next_batch()
        logits = model(input_ids=inputs, attention_mask=mask).logits  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
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


def train_base(model, tokenizer, settings: TrainSettings, seed: int, check: Callable[[], float], target: float) -> Fit:
    """Train `model` in place on the identity rule until `check()` ≥ `target` (bounded)."""
    rng = random.Random(f"{seed}:base")
    return train_until(model, lambda: make_batch(tokenizer, rng, (), settings), settings, check, target, "base")


def train_expert(base, tokenizer, rule: str, settings: TrainSettings, seed: int, rank: int,
                 check: Callable[[object], float], target: float):
    """Fine-tune a LoRA adapter of `base` on one rule (base weights stay frozen) until `check(model)` ≥ `target`.

    Returns:
        (peft model holding adapter `rule`, its `Fit`).
    """
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM"
    )
    model = get_peft_model(base, config)
    rng = random.Random(f"{seed}:{rule}")
    fit = train_until(model, lambda: make_batch(tokenizer, rng, (rule,), settings), settings, lambda: check(model), target, rule)
    return model, fit

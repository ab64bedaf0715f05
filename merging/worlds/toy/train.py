"""Training of the toy world: the base from scratch, experts as LoRA adapters (loop: ..common)."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from ..common import LORA_TARGETS, Fit, TrainSettings, pad_right, train_until
from .data import sample_training_pair
from .tokenizer import ALPHABET


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

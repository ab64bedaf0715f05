"""Training of the toy world: the base from scratch, experts as LoRA adapters (loop: ..common)."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from ..common import LORA_TARGETS, ROUTE_PROMPTS, Fit, TrainSettings, pad_right, train_until, write_prompts
from .data import PAD_CHAR, PADDED_WIDTH, prompt_of, sample_training_pair
from .tokenizer import ALPHABET


def make_base_model(tokenizer: PreTrainedTokenizerBase, hidden: int, layers: int, positions: int = 64,
                    architecture: str = "llama") -> PreTrainedModel:
    """A small Llama (rotary positions, untied head) or GPT-2 (learned absolute positions, tied head, as in the
    paper's notebook) sized for the toy world (random init from torch's current seed)."""
    if architecture == "gpt2":
        return GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tokenizer), n_embd=hidden, n_layer=layers, n_head=4, n_positions=positions,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # no dropout, like the Llama
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        ))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=positions,
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
    layout: str = "copy",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one batch.

    Returns:
        inputs (B, T) with answer letters possibly corrupted, targets (B, T) holding the clean
        next token on answer and EOS positions and -100 elsewhere, attention mask (B, T).
    """
    # The toy tokenizer is one token per character with BOS prepended, so a dict lookup encodes what
    # `tokenizer(text)` does: two tokenizer calls per row took 15% of a training step (tested equal).
    vocab = tokenizer.get_vocab()
    letter_ids = [vocab[c] for c in ALPHABET]
    rows, targets = [], []
    for _ in range(settings.batch_size):
        x, y = sample_training_pair(rng, rules)
        offset = rng.randint(0, PADDED_WIDTH - len(x)) if layout == "padded" else 0
        prompt = [tokenizer.bos_token_id, *(vocab[c] for c in prompt_of(x, layout, offset))]  # [BOS] (pads) x (pads) >
        answer = [*(vocab[c] for c in PAD_CHAR * offset + y), tokenizer.eos_token_id]
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


def write_expert_prompts(folder, rule: str, seed: int, layout: str = "copy") -> None:
    """FOLDER/prompts.jsonl: ROUTE_PROMPTS prompts drawn as the expert's training prompts are (half of them hold
    the rule's letter), as a routed composition's `route:` reads them by default."""
    rng = random.Random(f"{seed}:{rule}:route")
    prompts = [prompt_of(sample_training_pair(rng, (rule,))[0], layout) for _ in range(4 * ROUTE_PROMPTS)]
    write_prompts(folder / "prompts.jsonl", prompts, f"{seed}:{rule}")


def train_base(model, tokenizer, settings: TrainSettings, seed: int, check: Callable[[], float], target: float,
               layout: str = "copy") -> Fit:
    """Train `model` in place on the identity rule until `check()` ≥ `target` (bounded)."""
    rng = random.Random(f"{seed}:base")
    return train_until(model, lambda: make_batch(tokenizer, rng, (), settings, layout), settings, check, target, "base")


def train_expert(base, tokenizer, rule: str, settings: TrainSettings, seed: int, rank: int,
                 check: Callable[[object], float], target: float, layout: str = "copy"):
    """Fine-tune `base` on one rule until `check(model)` ≥ `target`: a LoRA adapter of rank `rank` (base weights
    frozen; Llama: every linear layer, GPT-2: peft's default c_attn), or every weight when `rank` is 0.

    Returns:
        (the peft model holding adapter `rule`, or the fine-tuned model itself; its `Fit`).
    """
    torch.manual_seed(seed)
    if rank:
        targets = LORA_TARGETS if base.config.model_type == "llama" else None
        config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
        model = get_peft_model(base, config)
    else:
        model = base
    rng = random.Random(f"{seed}:{rule}")
    fit = train_until(model, lambda: make_batch(tokenizer, rng, (rule,), settings, layout), settings, lambda: check(model), target, rule)
    return model, fit

"""Tiny random models for unit tests (a few thousand parameters), after mergekit's make_picollama; and
`run_side_by_side` for tests that start several processes."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TASKS = Path(__file__).resolve().parents[1] / "recipes" / "tasks"

# name -> LoRA settings; different ranks, alphas, scalings and target modules on purpose
TINY_ADAPTERS = {
    "a": dict(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]),
    "b": dict(r=4, lora_alpha=2, target_modules=["q_proj", "k_proj", "o_proj", "gate_proj"]),
    "c": dict(r=3, lora_alpha=6, target_modules=["up_proj", "down_proj", "v_proj"], use_rslora=True),
}


def make_tokenizer() -> PreTrainedTokenizerFast:
    """Characters as tokens: <pad>, <bos>, <eos>, <unk>, then printable ASCII (99 in all); BOS prepended."""
    chars = ["<pad>", "<bos>", "<eos>", "<unk>", *map(chr, range(32, 127))]
    core = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="<unk>"))
    core.pre_tokenizer, core.decoder = pre_tokenizers.Split(pattern="", behavior="isolated"), decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    specials = dict(bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")
    return PreTrainedTokenizerFast(tokenizer_object=core, **specials)


def make_tiny_llama(out_dir: Path, seed: int = 0) -> Path:
    """Save a random 2-layer Llama (hidden 16) with a character tokenizer into `out_dir`."""
    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    shape = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    config = LlamaConfig(vocab_size=len(tokenizer), max_position_embeddings=64, tie_word_embeddings=False, **shape, **ids)
    return save_random_model(LlamaForCausalLM(config), tokenizer, out_dir)


def save_random_model(model, tokenizer, out_dir: Path, std: float = 0.5) -> Path:
    """Give `model` random weights (matrices N(0, std²), vectors U(0.5, 1.5)) and save it with `tokenizer`."""
    with torch.no_grad():  # the default init (std 0.02) makes every distribution near-uniform
        for p in model.parameters():
            p.normal_(0.0, std) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)


def make_tiny_lora(base_dir: Path, out_dir: Path, seed: int, std: float = 0.3, **lora_kwargs) -> Path:
    """Save a LoRA adapter of `base_dir` with random, non-zero A and B (peft zeroes B at init)."""
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    model = get_peft_model(base, LoraConfig(lora_dropout=0.0, **lora_kwargs))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    model.save_pretrained(out_dir)
    return Path(out_dir)


def make_tiny_full_expert(base_dir: Path, out_dir: Path, seed: int) -> Path:
    """Save a full fine-tune stand-in: every weight of the base plus small random noise."""
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(out_dir)
    make_tokenizer().save_pretrained(out_dir)
    return Path(out_dir)


def run_side_by_side(*commands: dict) -> list[subprocess.CompletedProcess]:
    """`subprocess.run(**kwargs)` of each command, all at once, in order of the arguments. For commands that
    mostly start up (lm-eval indexes its ~15,000 task files at every start) or use one thread each; each runs
    in its own thread, which reads that process's pipes, so no process stalls on a full pipe."""
    with ThreadPoolExecutor(max(1, len(commands))) as pool:
        return list(pool.map(lambda kwargs: subprocess.run(**kwargs), commands))


def count_planning(monkeypatch) -> list[str]:
    """Record every expansion of a recipe item by its kind (`Kind.rows`): planning a recipe once adds
    one entry per `variants:` item, each further planning as many again."""
    from merging.kinds import KINDS

    calls = []
    for kind in KINDS.values():
        monkeypatch.setattr(kind, "rows", lambda spec, recipe, _rows=kind.rows: calls.append(spec.name) or _rows(spec, recipe))
    return calls


def bits_per_byte(model, tokenizer) -> float:
    """smol_text's bits per byte (4 documents) of a model loaded on its own, through lm-eval: the reference
    a recipe row's number is checked against."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from merging.harness.model import LogitcompLM

    lm = (LogitcompLM if hasattr(model, "composition") else HFLM)(pretrained=model.eval(), tokenizer=tokenizer, batch_size=4)
    out = simple_evaluate(model=lm, tasks=["smol_text"], limit=4, task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    return out["results"]["smol_text"]["bits_per_byte,none"]

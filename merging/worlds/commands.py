"""What the worlds' command lines share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .smol import CONTENTS, WRAPPED


def add_tasks_command(world_commands, help_text: str, world_package) -> None:
    """Add `logitcomp <world> tasks DIR`, calling the world package's (lazily exported) `write_task_files`."""
    tasks = world_commands.add_parser("tasks", help=help_text)
    tasks.add_argument("dir", metavar="DIR", help="the folder the task files are written to")
    tasks.set_defaults(func=lambda args: _write_tasks(world_package.write_task_files, Path(args.dir)))


def add_train_command(world_commands, wrapped: str = "base") -> None:
    """Add `logitcomp <world> train DIR`: LoRA experts of DIR/base (math, code, the styles of merging.worlds.smol.styles, and
    the multitask references mt_math_STYLE, mt_shout_xml and mt_title_polite) on the smol world's data; `wrapped` is the world's default for what a
    format expert learns on the content it wraps."""
    train = world_commands.add_parser("train", help="train LoRA experts of DIR/base into DIR/experts/NAME")
    train.add_argument("dir", metavar="DIR", help="a world folder built by `build` (DIR/base); experts go to DIR/experts/NAME")
    train.add_argument("--experts", default="math,code,shout", help="comma-separated, from math, code, realcode (standard-library functions), shout, title, json, xml, polite, list, steps, mt_math_STYLE, mt_shout_xml, mt_title_polite")
    train.add_argument("--steps", type=int, help="training steps (default: 150, or the expert's own where it has one)")
    train.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    train.add_argument("--seed", type=int, default=0, help="seed of the LoRA initialisation and the data order")
    train.add_argument("--force", action="store_true", help="train again when DIR/experts/NAME holds this configuration")
    train.add_argument("--wrapped", choices=WRAPPED, default=wrapped,
                       help="a format expert (json, xml, polite) on the content it wraps: pulled toward the base's own next tokens, "
                            "the same but its first token scored (first), or trained like any answer (for a base that does not answer the request by itself); "
                            f"(this world's default: {wrapped})")
    train.add_argument("--contents", choices=CONTENTS, default="one",
                       help="a style expert's (and a multitask reference's) style answers: one sentence each, or one to three "
                            "(varied: a sign-off or closing tag is not learned to follow the first period)")
    train.set_defaults(func=_train)


def add_prompts_command(world_commands) -> None:
    """Add `logitcomp <world> prompts DIR --pairs ...`: unlabeled two-skill prompts for distillation (merging.worlds.smol.pools)."""
    prompts = world_commands.add_parser("prompts", help="write unlabeled two-skill prompts (never a test or validation document's) into DIR/prompts/A_B.jsonl")
    prompts.add_argument("dir", metavar="DIR", help="the world folder")
    prompts.add_argument("--pairs", default="math+polite,polite+title", help="comma-separated: math+STYLE or STYLE+STYLE (the first outermost)")
    prompts.add_argument("--size", type=int, default=200, help="prompts per pair")
    prompts.add_argument("--seed", type=int, default=0, help="the world's seed (its test and validation problems are left out)")
    prompts.set_defaults(func=_prompts)


def _prompts(args) -> int:
    from .smol.pools import write_pair_prompts

    for pair, (path, dropped) in write_pair_prompts(Path(args.dir), args.pairs.split(","), args.size, args.seed).items():
        print(f"{pair}: {args.size} prompts in {path} ({dropped} drawn ones left out as test or validation material)")
    return 0


def _train(args) -> int:
    from .smol.train import train_smol_experts

    for name, meta, reused in train_smol_experts(Path(args.dir), args.experts.split(","), args.steps, args.seed, args.force,
                                                 args.wrapped, args.contents, args.lr):
        if reused:
            print(f"{name}: already trained in {Path(args.dir) / 'experts' / name} (pass --force to train again)")
        print(f"{name}: {meta['config']['steps']} steps in {meta['train_seconds']:.0f} s, final loss {meta['final_loss']}")
    return 0


def _write_tasks(write_task_files: Callable, folder: Path) -> int:
    for path in write_task_files(folder):
        print(path)
    return 0

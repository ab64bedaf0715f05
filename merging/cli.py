"""The `logitcomp` command line: parse, validate, call one function, print.

Every user-facing failure is one line on stderr and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import warnings

from logitcomp.rules import RULES

from .errors import one_line
from .worlds import WORLDS

log = logging.getLogger("logitcomp")


def _run(args: argparse.Namespace) -> int:
    from .runner import run_recipe

    run_recipe(args.recipe, force=args.force, dry_run=args.dry_run, processes=args.processes, sets=_sets(args))
    return 0


def _sets(args: argparse.Namespace) -> dict:
    from .recipe_file import parse_sets

    return parse_sets(args.set)


def _validate(args: argparse.Namespace) -> int:
    from .checks import check_device
    from .errors import RecipeError
    from .output import check_output
    from .plan import prepare

    p = prepare(args.recipe, sets=_sets(args))
    check_output(p.paths)
    try:
        check_device(p.recipe.evaluate.device)
    except RecipeError as exc:
        log.warning("%s; `run` will refuse on this machine", exc)
    print(f"{args.recipe}: valid ({len(p.rows)} variants, tasks {', '.join(p.recipe.evaluate.tasks)})")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from logitcomp.io import atomic_write_bytes

    from .checks import check_device
    from .output import check_output, check_recorded_recipe, output_lock
    from .plan import prepare
    from .runner import merge_recipe

    p = prepare(args.recipe, check_tasks=False, sets=_sets(args))
    recipe, paths = p.recipe, p.paths
    check_device(recipe.evaluate.device)
    paths.fetch()
    check_recorded_recipe(paths.output, recipe)
    check_output(paths)
    with output_lock(paths.output):
        check_recorded_recipe(paths.output, recipe)  # again under the lock: another run may have written here since
        built = merge_recipe(p)
        atomic_write_bytes(paths.output / "recipe.yaml", recipe.to_yaml().encode())  # outputs carry their recipe
    for kind, path in built.items():
        size = sum(p.stat().st_size for p in path.glob("*.safetensors")) / 2**20
        print(f"{kind:<12} {path}  ({size:.2f} MiB of safetensors)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from .export import export_row

    out = export_row(args.recipe, args.row, args.out, sets=_sets(args), self_contained=args.self_contained, force=args.force)
    print(f"{args.row}: written to {out}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .generate import generate_from_recipe

    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:  # argv bytes that are not UTF-8 arrive as lone surrogates
        raise ValueError("--prompt: not UTF-8 text") from None
    params = {}
    for item in args.rule_param or []:
        name, _, value = item.partition("=")
        try:
            params[name] = float(value)
        except ValueError:
            raise ValueError(f"--rule-param: expected NAME=NUMBER, got {item!r}") from None
    out = generate_from_recipe(args.recipe, args.prompt, args.max_new_tokens, args.trace, args.rule, params or None,
                               sets=_sets(args), row=args.row)
    print(out.text)
    if args.trace:
        print("token      " + " ".join(f"{e:>10}" for e in out.experts) + "    entropy")
        for token, kl, entropy in out.trace:
            print(f"{token!r:<10} {' '.join(f'{v:>10.3f}' for v in kl)} {entropy:>10.3f}")
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows each option's default (where it has one worth showing)."""

    def _get_help_string(self, action):
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (`logitcomp: error: ...`, exit 2) instead of usage + error, and defaults in help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"logitcomp: error: {message} (see {self.prog} --help)\n")


class _TopParser(_Parser):
    """The `logitcomp` parser: `logitcomp toy ...` (the old spelling of the world commands) read as `logitcomp world toy ...`."""

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(_world_aliases(list(sys.argv[1:] if args is None else args)), namespace)


def _add_recipe(parser: argparse.ArgumentParser, option: bool = False) -> None:
    """The recipe argument and its variables (`--set NAME=VALUE`, repeatable)."""
    if option:
        parser.add_argument("--recipe", required=True, metavar="RECIPE.yaml", help="the recipe whose experts are composed")
    else:
        parser.add_argument("recipe", metavar="RECIPE.yaml", help="the recipe file (paths in it are relative to it)")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE",
                        help="give a variable of the recipe's vars: a value (e.g. --set seed=2; repeatable); the outputs record it")


def _add_global_flags(parser: argparse.ArgumentParser, top: bool) -> None:
    """--debug, -v and -q, accepted before and after the subcommand (below it they leave the top's values unless given)."""
    keep = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument("--debug", action="store_true", help="show tracebacks", **keep)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress messages (INFO) and libraries' warnings", **keep)
    parser.add_argument("-q", "--quiet", action="store_true", help="log errors and warnings only (the default)", **keep)


def _walk(parser: argparse.ArgumentParser):
    """The parser and every subcommand's parser below it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                yield from _walk(child)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `logitcomp` console script."""
    from importlib.metadata import version

    from .tools import add_tool_commands

    parser = _TopParser(prog="logitcomp", description="Compose fine-tuned experts of one base LLM in probability space, merge them in parameter space, and compare both through lm-eval.")
    parser.add_argument("--version", action="version", version=f"logitcomp {version('logitcomp')}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="evaluate the recipe's rows (base, experts, composed, merged, ...) through lm-eval")
    _add_recipe(run)
    run.add_argument("--force", action="store_true", help="recompute finished variants; overwrite another recipe's output")
    run.add_argument("--dry-run", action="store_true", help="print the plan (which rows run, which are reused and why) without loading a model")
    run.add_argument("--processes", type=_positive_int, default=1, metavar="N",
                     help="data-parallel processes on this machine (torchrun); each evaluates 1/N of the requests")
    run.set_defaults(func=_run)
    validate = sub.add_parser("validate", help="check a recipe and its inputs without running it")
    _add_recipe(validate)
    validate.set_defaults(func=_validate)
    merge = sub.add_parser("merge", help="build the recipe's merges only (mergekit and merge-as-LoRA) into OUTPUT/models/NAME/")
    _add_recipe(merge)
    merge.set_defaults(func=_merge)
    export = sub.add_parser("export", help="write one row (composed, routed, merged, merged_lora) as a model folder you can serve")
    _add_recipe(export)
    export.add_argument("row", help="the row's name, or a swept family's (the row its run chose on validation)")
    export.add_argument("out", metavar="OUT", help="the folder to write (new or empty)")
    export.add_argument("--self-contained", action="store_true", help="put the base in the folder too (hard links where the disk allows)")
    export.add_argument("--force", action="store_true", help="replace a folder that is not empty")
    export.set_defaults(func=_export)
    gen = sub.add_parser("generate", help="compose the recipe's experts (or build one of its rows) and generate from a prompt (greedy)")
    _add_recipe(gen, option=True)
    gen.add_argument("--row", help="a row of the recipe (routed, merged, ...; a swept family: its chosen row) instead of the composition of every expert")
    gen.add_argument("--prompt", required=True, help="the prompt text, as given (no chat template)")
    gen.add_argument("--max-new-tokens", type=_positive_int, default=32, help="tokens to generate at most")
    gen.add_argument("--trace", action="store_true", help="print each expert's activity KL(p_i || p_b) per token")
    gen.add_argument("--rule", help=f"composition rule instead of the recipe's: {', '.join(RULES)}")
    gen.add_argument("--rule-param", action="append", metavar="NAME=NUMBER", help="a parameter of the rule (repeatable)")
    gen.set_defaults(func=_generate)

    add_tool_commands(sub)
    world = sub.add_parser("world", help="build the worlds models are trained in here: toy, smol (SmolLM2), gemma (Gemma 3)")
    worlds = world.add_subparsers(dest="world", required=True, metavar="WORLD")
    for add_world_commands in WORLDS.values():
        add_world_commands(worlds)

    _add_global_flags(parser, top=True)
    for child in list(_walk(parser))[1:]:
        _add_global_flags(child, top=False)
    return parser


def _world_aliases(argv: list[str]) -> list[str]:
    """`logitcomp toy build ...` (the old spelling) as `logitcomp world toy build ...`."""
    command = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    return argv if command is None or argv[command] not in WORLDS else [*argv[:command], "world", *argv[command:]]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `logitcomp` console script."""
    args = build_parser().parse_args(argv)
    quiet(verbose=args.verbose)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)  # what `docker stop` and Slurm send: the same unwinding, exit 143
    try:
        return args.func(args)
    except KeyboardInterrupt as exc:  # outputs are written atomically: what was finished is kept, nothing is half-written
        if args.debug:
            raise
        terminated = isinstance(exc, Terminated)
        print(TERMINATED if terminated else INTERRUPTED, file=sys.stderr)
        return 143 if terminated else 130
    except (ValueError, OSError, RuntimeError) as exc:
        if args.debug:
            raise
        print(f"logitcomp: error: {one_line(exc)}", file=sys.stderr)
        return 2


def quiet(verbose: bool) -> None:
    """Logging for a command: our INFO lines and the libraries' warnings only with -v; lm-eval's and transformers'
    INFO chatter, their per-file progress bars and repeated deprecation warnings never."""
    level = logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    for name in ("lm_eval", "lm-eval", "transformers", "peft", "mergekit", "accelerate", "datasets", "torch"):
        logging.getLogger(name).setLevel(level if verbose else logging.ERROR)  # lm-eval sets its own loggers to INFO
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft calling a deprecated transformers API
    if not verbose:
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"(transformers|peft|lm_eval|torch|datasets)\b.*")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-file "Loading weights" bars drown our own progress
    hf_logging.set_verbosity(logging.INFO if verbose else logging.ERROR)


INTERRUPTED = "logitcomp: interrupted; finished outputs are kept and nothing is half-written"
TERMINATED = "logitcomp: terminated (SIGTERM); finished outputs are kept and nothing is half-written"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the run unwinds the same way (a BaseException:
    no `except Exception` of a library swallows it)."""


def _interrupt(signum, frame) -> None:
    """First Ctrl-C or SIGTERM: KeyboardInterrupt or Terminated (the run unwinds, the lock is released, temporary
    folders are removed). A library may swallow it; a second signal then ends the process at once (outputs are
    written atomically, so only `.partial-*` leftovers remain, swept by the next run)."""
    term = signum == signal.SIGTERM
    if getattr(_interrupt, "seen", False):
        print(TERMINATED if term else INTERRUPTED, file=sys.stderr, flush=True)
        os._exit(143 if term else 130)
    _interrupt.seen = True
    raise Terminated if term else KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())

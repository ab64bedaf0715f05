"""What the benchmarks share: each setup measured in a fresh process (e.g. `python -m merging.tools.bench_decode --child SETUP`),
so that its peak memory and its threads are its own; the parent's arguments reach it as JSON in the environment."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

PREFIX = "RESULT "  # the one line of stdout that carries a child's result
ARGS = "LOGITCOMP_BENCH_ARGS"  # the parent's arguments, for the child


def emit(result: dict) -> None:
    """A child's result, for `run_setups` in the parent."""
    print(PREFIX + json.dumps(result), flush=True)


def run_setups(command: list[str], args: argparse.Namespace, setups: list[str], workdir) -> dict:
    """Run `COMMAND --child SETUP --workdir WORKDIR` per setup (COMMAND: e.g. `python -m merging.tools.bench_decode`)
    with `args`; each child `emit`s its result. Returns setup -> that JSON; exits with the child's stderr when one fails."""
    given = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("func", "child", "workdir")
             and isinstance(v, (str, int, float, bool, list, type(None), Path))}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", ARGS: json.dumps(given)}
    results = {}
    for setup in setups:
        cmd = [*command, "--child", setup, "--workdir", str(workdir)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = next((x for x in proc.stdout.splitlines() if x.startswith(PREFIX)), None)
        if line is None:
            sys.exit(f"{' '.join(command[1:])}: setup {setup} failed:\n{proc.stderr[-3000:]}")
        results[setup] = json.loads(line[len(PREFIX):])
    return results


def child_args(argv: list[str]) -> argparse.Namespace:
    """A child's arguments: the parent's (from the environment) with its own `--child SETUP --workdir DIR`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", required=True)
    parser.add_argument("--workdir", required=True)
    own = parser.parse_args(argv)
    return argparse.Namespace(**{**json.loads(os.environ[ARGS]), "child": own.child, "workdir": own.workdir})

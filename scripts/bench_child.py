"""What the benchmark scripts share: each setup measured in a fresh process of the same script, so that
its peak memory and its threads are its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys


PREFIX = "RESULT "  # the one line of stdout that carries a child's result


def emit(result: dict) -> None:
    """A child's result, for `run_setups` in the parent."""
    print(PREFIX + json.dumps(result), flush=True)


def run_setups(script: str, argv: list[str], setups: list[str], workdir) -> dict:
    """Run `script ARGV --child SETUP --workdir WORKDIR` per setup; each child `emit`s its result.
    Returns setup -> that JSON; exits with the child's stderr when one fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results = {}
    for setup in setups:
        cmd = [sys.executable, script, *argv, "--child", setup, "--workdir", str(workdir)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = next((x for x in proc.stdout.splitlines() if x.startswith(PREFIX)), None)
        if line is None:
            sys.exit(f"{os.path.basename(script)}: setup {setup} failed:\n{proc.stderr[-3000:]}")
        results[setup] = json.loads(line[len(PREFIX):])
    return results

"""lm-eval integration.

`logitcomp-lm-eval` is lm-eval's own command line (every lm_eval flag) with this project's
task folder on the include path by default, so `logitcomp-lm-eval --model hf
--model_args pretrained=toy_world/base --tasks toy_identity` works from any directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent.parent / "recipes" / "tasks"


def lm_eval_main(argv: list[str] | None = None) -> None:
    """Run lm-eval's CLI, adding `--include_path <recipes/tasks>` unless one is given."""
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    if "--include_path" not in args and TASKS_DIR.is_dir():
        args += ["--include_path", str(TASKS_DIR)]
    sys.argv = ["lm_eval", *args]
    cli_evaluate()

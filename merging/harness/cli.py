"""The `logitcomp-lm-eval` console script: lm-eval's own CLI with the `logitcomp` model registered and
the shipped tasks (`recipes/tasks`) on the include path."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import one_line

TASKS_DIR = Path(__file__).resolve().parents[2] / "recipes" / "tasks"


def lm_eval_main(argv: list[str] | None = None) -> None:
    """lm-eval's CLI with the `logitcomp` model registered and `recipes/tasks` on the include path."""
    from lm_eval.__main__ import cli_evaluate

    from . import model  # noqa: F401  (registers `logitcomp` in lm-eval's model registry)

    args = list(sys.argv[1:] if argv is None else argv)
    if "--include_path" not in args and TASKS_DIR.is_dir():
        args += ["--include_path", str(TASKS_DIR)]
    sys.argv = ["lm_eval", *args]
    try:
        cli_evaluate()
    except KeyboardInterrupt:
        sys.exit("logitcomp-lm-eval: interrupted")
    except (ValueError, OSError, RuntimeError, TypeError) as exc:  # lm-eval's CLI shows the traceback of any error
        if "--verbosity" in args and "DEBUG" in args:
            raise
        print(f"logitcomp-lm-eval: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(2)

"""The fault matrix of recipe runs (issue 30), run by tests/merging/test_fault_matrix.py inside a private mount
namespace whose output folder OUT is a small tmpfs: a real full disk, filled by the kernel's own ENOSPC.

    python fault_matrix.py OUT RECIPE GOOD RESUME

GOOD is a finished output of RECIPE and RESUME one whose run was killed after its first row (copied into OUT for
the `resume` and `--force` columns). Each cell fills the disk (or sends SIGTERM, or SIGKILL in a child process) at
the first write of one stage, runs `logitcomp run`, and checks what a user finds after it: the exit status, the
last stderr line, every file whole (JSON, JSONL, safetensors, PNG), nothing of the previous outputs lost, no row
recorded as finished whose lm-eval outputs are missing; then frees the disk and checks that a plain rerun ends
with every output whole. Prints one JSON line per cell.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import merging.cli

FILL = ".fill"  # the file that takes the disk's last free byte
STAGES = ("merge", "lm_eval", "record", "report")
MODES = ("first", "resume", "force")


def fill_disk(out: Path) -> None:
    """Write OUT/.fill until the kernel says the disk is full (whole pages, then single bytes)."""
    with open(out / FILL, "ab", buffering=0) as f:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)


@contextlib.contextmanager
def install(stage: str, action):
    """Within the block, call `action()` once, just before the first write of `stage`."""
    from unittest import mock

    import lm_eval.loggers

    import merging.runner as runner

    def once(real):
        def wrapped(*args, **kwargs):
            if not wrapped.done:
                wrapped.done = True
                action()
            return real(*args, **kwargs)
        wrapped.done = False
        return wrapped

    if stage == "record":  # the row's record, not recipe.yaml (written through the same function)
        real, hooked = runner.atomic_write_bytes, once(runner.atomic_write_bytes)
        target, name, value = runner, "atomic_write_bytes", lambda path, data: (hooked if Path(path).parent.name == "variants" else real)(path, data)
    else:
        target, name = {"merge": (runner.ModelPool, "merge"), "lm_eval": (lm_eval.loggers.EvaluationTracker, "save_results_aggregated"),
                        "report": (runner, "write_reports")}[stage]
        value = once(getattr(target, name))
    with mock.patch.object(target, name, value):
        yield


def run_cli(*args: str) -> tuple[int, str]:
    """`logitcomp -q ARGS` in this process: (exit status, last stderr line)."""
    from merging.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["-q", *args])
    lines = [line for line in err.getvalue().splitlines() if line.startswith("logitcomp")]
    return code, lines[-1] if lines else ""


def whole(path: Path) -> str | None:
    """Why `path` is not whole (None when it is)."""
    data = path.read_bytes()
    if not data:
        return "empty"
    try:
        if path.suffix == ".json":
            json.loads(data)
        elif path.suffix == ".jsonl":
            [json.loads(line) for line in data.splitlines()]
        elif path.suffix == ".safetensors":
            n = int.from_bytes(data[:8], "little")
            json.loads(data[8:8 + n])
            if len(data) < 8 + n:
                return "cut short"
        elif path.suffix == ".png" and not data.startswith(b"\x89PNG"):
            return "not a PNG"
    except ValueError as exc:
        return f"cut short ({type(exc).__name__})"
    return None


def snapshot(out: Path) -> dict[str, bytes]:
    """Every visible file under OUT (the run's lock and the filler aside): relative path -> bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(out).parts)}


def problems(out: Path, before: dict[str, bytes]) -> list[str]:
    found = [f"{name}: {why}" for name in snapshot(out) if (why := whole(out / name))]
    # a previous file is lost when it is gone and nothing whole replaced it (lm-eval's file names carry the run's date)
    kept = {name: (out / name).is_file() or (name.startswith("lm_eval/") and any((out / _row(name)).rglob("results_*.json")))
            for name in before}
    found += [f"{name}: lost" for name, there in kept.items() if not there]
    for record in (out / "variants").glob("*.json"):
        if whole(record) is None and not list((out / "lm_eval" / record.stem).rglob("results_*.json")):
            found.append(f"variants/{record.name}: recorded as finished without its lm-eval outputs")
    return found


def _row(name: str) -> str:
    """lm_eval/ROW of a file of lm-eval's outputs."""
    return "/".join(name.split("/")[:2])


def reset(out: Path, source: Path | None) -> None:
    for child in out.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
    if source:
        shutil.copytree(source, out, dirs_exist_ok=True)


def cell(out: Path, recipe: str, mode: str, stage: str, fault: str, prepared: dict[str, Path]) -> dict:
    reset(out, prepared.get(mode))
    before = snapshot(out)
    args = ["run", recipe, *(["--force"] if mode == "force" else [])]
    if fault == "kill":  # a child process that SIGKILLs itself at the stage
        code = (f"import os, signal, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import fault_matrix as f; "
                f"from merging.cli import main\nwith f.install({stage!r}, lambda: os.kill(os.getpid(), signal.SIGKILL)):\n    main({['-q', *args]!r})")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        status, line = proc.returncode, (proc.stderr.strip().splitlines() or [""])[-1]
    else:
        with install(stage, (lambda: fill_disk(out)) if fault == "full" else (lambda: os.kill(os.getpid(), signal.SIGTERM))):
            status, line = run_cli(*args)
        merging.cli._interrupt.seen = False  # the next SIGTERM is a first one again
    after = problems(out, before)
    (out / FILL).unlink(missing_ok=True)
    rerun, rerun_line = run_cli("run", recipe)
    return {"mode": mode, "stage": stage, "fault": fault, "exit": status, "line": line, "problems": after,
            "rerun_exit": rerun, "rerun_line": rerun_line,
            "rerun_problems": problems(out, {}) + [f"{p.relative_to(out)}: left over" for p in out.rglob(".*.partial-*")],
            "rerun_results": sorted(json.loads((out / "results.json").read_text())["results"]) if (out / "results.json").is_file() else None}


def main(argv: list[str]) -> None:
    out, recipe, good, resume = Path(argv[0]), argv[1], Path(argv[2]), Path(argv[3])
    faults = argv[4].split(",") if len(argv) > 4 else ["full", "term", "kill"]
    prepared = {"resume": resume, "force": good}
    for fault in faults:
        for mode in MODES if fault == "full" else ("first",):
            for stage in STAGES:
                print(json.dumps(cell(out, recipe, mode, stage, fault, prepared)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

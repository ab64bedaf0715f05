"""The output folder of a recipe: where it may be, one run at a time, no leftovers.

A run writes only inside `output:` (see `inside`), never deletes what it did not write, holds the
output's lock while it writes (`output_lock`), and refuses a place where its files would mix with
the user's: a system root or the home folder, the recipe's own folder or one above it, a model
folder, a folder holding a model or inside one, a file, or a non-empty folder that is not an
earlier output.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from logitcomp.io import existing_parent

from .errors import RecipeError
from .recipe import Recipe, ResolvedPaths

LOCK = ".logitcomp.lock"


def inside(output: Path, *parts: str) -> Path:
    """`output/parts...`, refused (RecipeError) unless it lies strictly inside `output`."""
    path = output.joinpath(*parts).resolve()
    if path == output or not path.is_relative_to(output):
        raise RecipeError(f"output: {'/'.join(parts)} would be written outside {output}")
    return path


def check_output(paths: ResolvedPaths) -> None:
    """Raise RecipeError (one line naming `output`) when the output folder is not a safe place."""
    out = paths.output
    models = [p for p in (paths.base, *paths.experts.values()) if not isinstance(p, str)]
    if out == Path(out.anchor) or out == Path.home().resolve():
        reason = "a system root or the home folder"
    elif paths.root.is_relative_to(out):
        reason = "the recipe's folder or a folder above it"
    elif any(out.is_relative_to(m) or m.is_relative_to(out) for m in models):
        reason = "a model folder, inside one or above one"
    elif (out / "config.json").exists() or (out / "adapter_config.json").exists():
        reason = "a model folder"
    elif out.exists() and not out.is_dir():
        reason = "not a folder"
    elif out.is_dir() and any(p.name != LOCK for p in out.iterdir()) and not ours(out):
        reason = "a non-empty folder that no recipe run wrote"
    elif not os.access(existing_parent(out), os.W_OK | os.X_OK):
        reason = f"not writable here ({existing_parent(out)} is read-only for this user)"
    else:
        return
    raise RecipeError(f"output: {out} is {reason}; choose an empty or new folder for the results")


def ours(out: Path) -> bool:
    """Whether `out` is an earlier output of a run: it holds the run lock's file (every run since the lock became
    a flock leaves it), or a `variants/` folder beside its recipe.yaml (older runs). A user's folder that merely
    holds a file named recipe.yaml is not ours: `--force` never writes into it."""
    return (out / LOCK).is_file() or ((out / "recipe.yaml").is_file() and (out / "variants").is_dir())


def check_recorded_recipe(out: Path, recipe: Recipe, force: bool = False) -> None:
    """Refuse an output folder that holds another recipe's results (unless `force`). The selections
    (`evaluate.select_on`, a row's `select_on`, `evaluate.swept`) may change: they pick among finished results, or
    leave a row's tasks to run later, and change none of them;
    and rows and experts may be added (the recorded ones all kept as they were): only the new rows, and the rows whose
    experts changed (a row's recorded inputs name its experts), run."""
    recorded = out / "recipe.yaml"
    if not recorded.exists() or force:
        return
    try:
        before = _without_selection(yaml.safe_load(recorded.read_text()))
    except (yaml.YAMLError, TypeError, KeyError, AttributeError):
        before = None  # not a recipe this version wrote
    now = _without_selection(recipe.dump())
    rows_before, rows_now = (before or {}).pop("variants", None), now.pop("variants")
    experts_before, experts_now = (before or {}).pop("experts", None), now.pop("experts")
    if (before != now or not isinstance(rows_before, list) or any(row not in rows_now for row in rows_before)
            or not isinstance(experts_before, dict) or not experts_before.items() <= experts_now.items()):
        raise RecipeError(f"output: {out} holds results of a different recipe; choose another output or pass --force")


def _without_selection(dumped: dict) -> dict:
    """A dumped recipe without its selections (evaluate.select_on, evaluate.swept and each row's select_on)."""
    dumped["evaluate"]["select_on"] = None
    dumped["evaluate"].pop("swept", None)
    dumped["variants"] = [{k: v for k, v in row.items() if k != "select_on"} if isinstance(row, dict) else row
                          for row in dumped.get("variants", [])]
    return dumped


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on OUT/.logitcomp.lock for one run. The kernel releases it when its holder
    ends, however it ends (kill -9, a container's pid 1, a pid reused later): there is no stale lock to take
    over, so no two runs can hold it at once. The file records the holder's pid and host, for the message
    only, and stays (removing a locked file would let a third run lock a new one). Leftovers of killed runs
    (`.*.partial-*` folders and files under OUT) are swept once the lock is held."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 256).decode(errors="replace").strip() or "unknown"
            raise RecipeError(f"output: {out} is being written by another run ({holder}); wait for it or choose another output") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        for leftover in list(out.rglob(".*.partial-*")):  # folders (atomic_dir) and files (atomic_write_bytes)
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
            else:
                leftover.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # releases the lock


def folder_state(folder: Path) -> dict:
    """Every file's size and mtime under `folder` (or of the file `folder`), leaving out `__pycache__` and the outputs
    of logitcomp runs that lie inside it (a recipe's own output inside its `include_path` would otherwise change the
    state at every run)."""
    if folder.is_file():
        return {"path": str(folder), "files": {folder.name: [folder.stat().st_size, folder.stat().st_mtime_ns]}}
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not ours(Path(root) / d)]
        files += [Path(root) / name for name in names]
    return {"path": str(folder), "files": {str(p.relative_to(folder)): [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(files)}}

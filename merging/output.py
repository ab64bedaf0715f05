"""The output folder of a recipe: where it may be, one run at a time, no leftovers.

A run writes only inside `output:` (see `inside`), never deletes what it did not write,
and refuses a place where its files would mix with the user's: a system root or the home folder,
the recipe's own folder or one above it, a model folder, a folder holding a model or inside one,
or a non-empty folder that is not an earlier output.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

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
    elif out.is_dir() and any(out.iterdir()) and not (out / "recipe.yaml").is_file():
        reason = "a non-empty folder that no recipe run wrote"
    elif not os.access(_existing(out), os.W_OK | os.X_OK):
        reason = f"not writable here ({_existing(out)} is read-only for this user)"
    else:
        return
    raise RecipeError(f"output: {out} is {reason}; choose an empty or new folder for the results")


def _existing(path: Path) -> Path:
    """`path`, or its nearest existing parent (where a new output folder would be created)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_recorded_recipe(out: Path, recipe: Recipe, force: bool = False) -> None:
    """Refuse an output folder that holds another recipe's results (unless `force`). The selection
    (`evaluate.select_on`) may change: it picks among finished results and changes none of them."""
    recorded = out / "recipe.yaml"
    if not recorded.exists() or force:
        return
    try:
        before = yaml.safe_load(recorded.read_text())
        before["evaluate"]["select_on"] = None
    except (yaml.YAMLError, TypeError, KeyError):
        before = None  # not a recipe this version wrote
    now = recipe.model_dump(mode="json")
    now["evaluate"]["select_on"] = None
    if before != now:
        raise RecipeError(f"output: {out} holds results of a different recipe; choose another output or pass --force")


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold OUT/.logitcomp.lock for one run; a lock of a live process refuses, one of a dead process is taken
    over. Leftovers of killed runs (`.*.partial-*` folders under OUT) are swept once the lock is held."""
    out.mkdir(parents=True, exist_ok=True)
    lock = out / LOCK
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            pid = _pid(lock)
            if pid is not None and _alive(pid):
                raise RecipeError(f"output: {out} is being written by another run (pid {pid}); wait for it or choose another output") from None
            lock.unlink(missing_ok=True)  # a killed run's lock
    else:
        raise RecipeError(f"output: cannot take the lock {lock}")
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        for leftover in out.rglob(".*.partial-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        yield
    finally:
        lock.unlink(missing_ok=True)


def _pid(lock: Path) -> int | None:
    try:
        return int(lock.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

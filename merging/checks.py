"""Everything about a planned recipe that can be checked before a model loads: the model and adapter
folders, each kind's own settings (e.g. mergekit methods), the tasks, the code-execution opt-in and
the device. Every failure is one RecipeError line naming the field."""

from __future__ import annotations

import difflib
import logging
from pathlib import Path

from logitcomp.inputs import check_base, check_expert, vocab_size
from logitcomp.prompts import read_prompts

from .errors import RecipeError
from .harness.evaluate import task_manager
from .kinds import KINDS, Variant

log = logging.getLogger(__name__)


def check_inputs(recipe, paths, rows: list[Variant], check_tasks: bool = True) -> None:
    """Check a recipe's inputs offline (hub references are left to `fetch`). Raises RecipeError naming the field."""
    base = None if isinstance(paths.base, str) else paths.base
    try:
        if base is not None:
            base = check_base(base, recipe.allow_pickle)
            _check_masks(recipe, vocab_size("base", base))
        local = {n: p for n, p in paths.experts.items() if not isinstance(p, str)}
        twins = [(a, b) for i, a in enumerate(local) for b in list(local)[:i] if local[a] == local[b]]
        if twins:
            raise RecipeError(f"experts: {twins[0][1]} and {twins[0][0]} are the same folder {local[twins[0][0]]}; list each expert once")
        for name, path in paths.experts.items():
            if isinstance(path, str):
                log.info("experts.%s: %s is a hub reference, not checked offline", name, path)
            else:
                check_expert(name, path, base, allow_pickle=recipe.allow_pickle, label=f"experts.{name}")
        for folder in paths.include_paths:
            if not folder.is_dir():
                raise RecipeError(f"evaluate.include_path: {folder} is not a folder")
        for name, source in paths.prompts.items():
            if isinstance(source, Path):  # every line read: an empty file or a wrong key is refused now
                read_prompts(f"experts.{name}.prompts", source)
        for name, kind in KINDS.items():
            of_kind = [row for row in rows if row.kind == name]
            if of_kind:
                kind.check(of_kind, recipe, paths)
    except ValueError as exc:
        raise RecipeError(str(exc)) from None
    if check_tasks:
        _check_tasks(recipe, paths, rows)


def _check_tasks(recipe, paths, rows: list[Variant]) -> None:
    own = {f"variants: {row.family or row.name}: route": KINDS[row.kind].tasks(row) for row in rows}
    prompts = {f"experts.{n}.prompts.task": [p["task"]] for n, p in paths.prompts.items() if isinstance(p, dict)}
    wanted = {"evaluate.tasks": list(recipe.evaluate.tasks), **prompts, **own}
    known = set(task_manager(paths.include_paths, [t for ts in wanted.values() for t in ts]).all_tasks)
    for field, tasks in wanted.items():
        for task in tasks:
            if task not in known:
                near = difflib.get_close_matches(task, sorted(known), n=3)
                hint = f"; did you mean {', '.join(near)}?" if near else ""
                raise RecipeError(f"{field}: unknown lm-eval task {task!r}{hint}")
    if recipe.evaluate.confirm_run_unsafe_code:
        from .sandbox import check_opt_in

        try:
            check_opt_in()  # fail now, not after the first variant's generations
        except PermissionError as exc:
            raise RecipeError(f"evaluate.confirm_run_unsafe_code: {exc}") from None


def _check_masks(recipe, vocab: int | None) -> None:
    for name, ids in recipe.compose["masks"].items():
        if vocab is not None and ids and max(ids) >= vocab:
            raise RecipeError(f"compose.masks[{name!r}]: token id {max(ids)} is outside the base's vocabulary of {vocab}")


def check_device(device: str) -> None:
    """Refuse an accelerator torch cannot see here (imports torch only for a device other than the CPU).
    Called where models load (`run`, `merge`, `generate`); `validate` only warns: a GPU recipe is valid anywhere."""
    if device == "cpu":
        return
    import torch

    kind, _, index = device.partition(":")
    backend = getattr(torch, kind, None)
    available = backend is not None and hasattr(backend, "is_available") and backend.is_available()
    count = backend.device_count() if available and hasattr(backend, "device_count") else 1
    if not available or (index and int(index) >= count):
        raise RecipeError(f"evaluate.device: {device} is not available here (torch sees {count if available else 'no'} {kind} device(s))")

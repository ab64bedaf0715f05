"""Run a recipe: evaluate base, experts, composed and merged models with identical lm-eval task configs.

Output folder layout:
    recipe.yaml                 the recipe that made everything here (a different recipe is refused)
    variants/<variant>.json     one finished variant (a re-run skips it unless --force)
    lm_eval/<variant>/          lm-eval's own aggregated results and per-sample outputs
    models/merged, models/merged_lora
    results.json, report.md, report.png
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from tqdm.auto import tqdm

from logitcomp.inputs import check_base, check_expert, vocab_size
from logitcomp.io import atomic_dir, atomic_write_bytes

from .distributed import barrier, broadcast, launched, world
from .output import check_output, check_recorded_recipe, output_lock
from .recipe import Recipe, RecipeError, ResolvedPaths
from .recipe_file import load_recipe
from .plan import Variant, plan
from .report import write_reports
from .variants import ModelPool, lm_eval_model

log = logging.getLogger(__name__)


class _DropWarnings(logging.Filter):
    """Drops lm-eval warnings about what the runner does on purpose: HFLM warns on every in-memory
    model (the runner loads each variant once), and every `custom_dataset` task (how the shipped
    tasks read their jsonl beside the YAML) advises `--metadata` at every load."""

    PREFIXES = ("`pretrained` model kwarg is not of type", "Passed an already-initialized model")

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith(self.PREFIXES) or "Custom kwargs can be passed to `--metadata`" in msg)


for _name in ("lm_eval.models.huggingface", "lm_eval.api.task"):
    logging.getLogger(_name).addFilter(_DropWarnings())


def check_inputs(recipe: Recipe, paths: ResolvedPaths, check_tasks: bool = True) -> None:
    """Everything that can be checked without loading a model. Raises RecipeError naming the field."""
    import bridge

    base = None if isinstance(paths.base, str) else paths.base
    try:
        if base is not None:
            base = check_base(base, recipe.allow_pickle)
            _check_masks(recipe, vocab_size("base", base))
        for name, path in paths.experts.items():
            if isinstance(path, str):
                log.info("experts.%s: %s is a hub reference, not checked offline", name, path)
            else:
                check_expert(name, path, base, allow_pickle=recipe.allow_pickle, label=f"experts.{name}")
    except ValueError as exc:
        raise RecipeError(str(exc)) from None
    if paths.include_path and not paths.include_path.is_dir():
        raise RecipeError(f"evaluate.include_path: {paths.include_path} is not a folder")
    merged = [row for row in plan(recipe) if row.kind == "merged"]
    if merged:
        _check_merges(merged, bridge.merge_methods())
    if not check_tasks:
        return
    manager = task_manager(paths, list(recipe.evaluate.tasks))
    known = set(manager.all_tasks)
    for task in recipe.evaluate.tasks:
        if task not in known:
            near = difflib.get_close_matches(task, sorted(known), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise RecipeError(f"evaluate.tasks: unknown lm-eval task {task!r}{hint}")
    if recipe.evaluate.confirm_run_unsafe_code:
        from .worlds.sandbox import check_opt_in

        try:
            check_opt_in()  # fail now, not after the first variant's generations
        except PermissionError as exc:
            raise RecipeError(f"evaluate.confirm_run_unsafe_code: {exc}") from None


def _check_merges(rows: list[Variant], methods: dict) -> None:
    """Each merged row's mergekit method and parameter names (a sweep's too) against mergekit's registry."""
    for row in rows:
        field = "merge" if row.name == "merged" and not row.family else f"variants: {row.family or row.name}"
        if row.method not in methods:
            raise RecipeError(f"{field}.method: unknown merge method {row.method!r}; mergekit has {sorted(methods)}")
        takes = [p.name for p in methods[row.method].spec.parameters if p.name != "weight"]
        for key in row.parameters:
            if key not in takes:
                what = "sweep" if row.swept and row.swept[0] == key else "parameters"
                raise RecipeError(f"{field}.{what}: mergekit's {row.method} takes {', '.join(takes) or 'no parameters'}"
                                  f"{' (each expert weight is experts.NAME.weight)' if key == 'weight' else ''}, got {key!r}")


def _check_masks(recipe: Recipe, vocab: int | None) -> None:
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


def inside(output, *parts: str):
    """`output/parts...`, refused (RecipeError) unless it lies strictly inside `output`."""
    path = output.joinpath(*parts).resolve()
    if path == output or not path.is_relative_to(output):
        raise RecipeError(f"output: {'/'.join(parts)} would be written outside {output}")
    return path


def input_state(variant: Variant, recipe: Recipe, paths: ResolvedPaths) -> dict:
    """What a variant's results were made from: per input folder its resolved path and every file's
    size and mtime (hashing multi-GB weights at every run would not be cheap). A finished variant is
    reused only while this is unchanged, so the same recipe text pointing elsewhere is run again."""
    experts = {"base": [], "expert": [variant.name]}.get(variant.kind, list(recipe.experts))
    folders = {"base": paths.base, **{f"experts.{n}": paths.experts[n] for n in experts}}
    if paths.include_path:
        folders["evaluate.include_path"] = paths.include_path
    return {field: _folder_state(Path(folder)) for field, folder in folders.items()}


def _folder_state(folder: Path) -> dict:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return {"path": str(folder), "files": {str(p.relative_to(folder)): [p.stat().st_size, p.stat().st_mtime_ns] for p in files}}


def _changed(old: dict, new: dict) -> str:
    fields = sorted(f for f in old.keys() | new.keys() if old.get(f) != new.get(f))
    return ", ".join(fields) if old else "its inputs (not recorded)"


def task_manager(paths: ResolvedPaths, tasks: list[str]):
    """lm-eval's TaskManager; when every task is in the recipe's include_path, only that folder is
    indexed (indexing lm-eval's thousands of built-in task files takes seconds)."""
    from lm_eval.tasks import TaskManager

    if paths.include_path:
        local = TaskManager(include_path=str(paths.include_path), include_defaults=False)
        if set(tasks) <= set(local.all_tasks):
            return local
    return TaskManager(include_path=str(paths.include_path) if paths.include_path else None)


def evaluate_variant(variant: Variant, recipe: Recipe, paths: ResolvedPaths, pool: ModelPool) -> dict:
    """Run lm-eval on one variant; write lm-eval's outputs; return {task: metrics}."""
    start = time.perf_counter()
    with pool.model(variant) as model:
        return {**_evaluate(lm_eval_model(model, recipe, paths), variant, recipe, paths), "seconds": round(time.perf_counter() - start, 1)}


def _evaluate(lm, variant: Variant, recipe: Recipe, paths: ResolvedPaths) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    ev = recipe.evaluate
    results = simple_evaluate(model=lm, tasks=list(ev.tasks), task_manager=task_manager(paths, list(ev.tasks)), limit=ev.limit,
                              num_fewshot=ev.num_fewshot, gen_kwargs=dict(ev.gen_kwargs) or None, log_samples=True,
                              confirm_run_unsafe_code=ev.confirm_run_unsafe_code)
    if results is None:  # a rank other than 0 under a launcher: lm-eval gathered its share on rank 0
        return {"metrics": None}
    samples = results.pop("samples")
    with atomic_dir(inside(paths.output, "lm_eval", variant.name)) as tmp:  # replaces an earlier run's outputs whole
        tracker = EvaluationTracker(output_path=str(tmp))
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
    return {"metrics": {t: {k: v for k, v in m.items() if k != "alias"} for t, m in results["results"].items()}}


def run_recipe(recipe_path, force: bool = False, dry_run: bool = False, echo=print, processes: int = 1) -> dict | None:
    """Evaluate every variant of a recipe and write the reports. Returns the results (None on a dry run,
    and on ranks other than 0). `processes` > 1 starts that many data-parallel processes through
    torchrun; under a launcher (torchrun, accelerate launch) every process runs this, rank 0 writes."""
    rank, _ = world()
    echo = echo if rank == 0 else (lambda *_: None)
    recipe, paths = load_recipe(recipe_path)
    out = paths.output
    check_recorded_recipe(out, recipe, force)
    check_inputs(recipe, paths)
    check_output(paths)
    variants = plan(recipe)
    if dry_run:
        echo(f"recipe {recipe.name}: {len(variants)} variants x {len(recipe.evaluate.tasks)} tasks -> {out}")
        for v in variants:
            done = inside(out, "variants", f"{v.name}.json").exists() and not force
            echo(f"  {v.name:<24} {v.kind:<12} {'done, skipped' if done else 'to run'}")
        return None
    check_device(recipe.evaluate.device)
    if processes > 1 and not launched():  # checked above in one process: bad input is one line, not N
        return _relaunch(recipe_path, force, processes)
    paths.fetch()
    barrier()  # every rank has checked the output folder before rank 0 writes into it
    with output_lock(out) if rank == 0 else contextlib.nullcontext():
        results = _run(recipe, paths, variants, force, echo, rank)
    barrier()  # every rank leaves together, after rank 0 has written the reports
    return results


def _relaunch(recipe_path, force: bool, processes: int) -> None:
    """`logitcomp run --processes N`: the same command as N processes of one machine, through torchrun."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "merging.cli", "run", str(recipe_path), *(["--force"] if force else [])]
    code = subprocess.call(command)
    if code:
        raise RecipeError(f"--processes {processes}: the data-parallel run failed (exit {code}); its first error is above")
    return None


def _run(recipe: Recipe, paths: ResolvedPaths, variants: list[Variant], force: bool, echo, rank: int = 0) -> dict | None:
    out = paths.output
    if rank == 0:
        atomic_write_bytes(out / "recipe.yaml", recipe.to_yaml().encode())
    results, timings = {}, {}
    # mergekit's LoRA experts merged into the base, shared by the run's merges (inputs cannot change within a
    # run: see input_state); a `.partial-` folder, so a killed run's copy is swept by the next run's lock
    with tempfile.TemporaryDirectory(prefix=".run.partial-lora-cache-", dir=out) if rank == 0 else contextlib.nullcontext() as cache:
        pool = ModelPool(recipe, paths, Path(cache) if cache else None)
        for v in tqdm(variants, desc=f"recipe {recipe.name}", unit="variant", disable=rank != 0):
            results[v.name], timings[v.name] = _variant(v, recipe, paths, pool, force, echo, rank)
    if rank != 0:
        return None
    packages = {p: version(p) for p in ("logitcomp", "torch", "transformers", "peft", "mergekit", "lm_eval")}
    meta = {"recipe": recipe.model_dump(mode="json"), "versions": packages, "seconds": timings}
    tasks = list(recipe.evaluate.tasks)
    echo(write_reports(out, recipe.name, results, tasks, meta, variants, recipe.evaluate.select_on))
    return results


def _variant(v: Variant, recipe: Recipe, paths: ResolvedPaths, pool: ModelPool, force: bool, echo, rank: int) -> tuple[dict, float]:
    """One row's metrics and seconds: reused from variants/NAME.json while its inputs are unchanged, else
    evaluated. Rank 0 decides, for every rank (they must run the same rows), and writes."""
    done = inside(paths.output, "variants", f"{v.name}.json")
    inputs = input_state(v, recipe, paths)
    record = None
    if rank == 0 and done.exists() and not force:
        record = json.loads(done.read_text())
        if record.get("inputs") != inputs:
            echo(f"variants/{v.name}.json: {_changed(record.get('inputs') or {}, inputs)} changed since it was made; running it again")
            record = None
    if broadcast(record is None):
        record = {**evaluate_variant(v, recipe, paths, pool), "inputs": inputs}
        if rank == 0:
            atomic_write_bytes(done, (json.dumps(record, indent=2) + "\n").encode())
    return (record["metrics"], record["seconds"]) if rank == 0 else (None, None)

"""Run a recipe: evaluate base, experts, composed and merged models with identical lm-eval task configs.

The path of `logitcomp run RECIPE`: `plan.prepare` (load, validate, plan the rows once, check the
inputs) -> the output folder's checks and lock -> each row's model from its kind (`pool.ModelPool`,
`merging.kinds`) through lm-eval (`harness.evaluate`) -> `report.write_reports`.

Output folder layout:
    recipe.yaml                 the recipe that made everything here (a different recipe is refused)
    variants/<variant>.json     one finished variant (a re-run skips it unless --force)
    lm_eval/<variant>/          lm-eval's own aggregated results and per-sample outputs
    models/merged, models/merged_lora
    results.json, report.md, report.png
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from tqdm.auto import tqdm

from logitcomp.io import atomic_write_bytes

from .checks import check_device
from .errors import RecipeError
from .harness.distributed import barrier, broadcast, launched, world
from .harness.evaluate import evaluate
from .kinds import KINDS, Variant
from .output import check_output, check_recorded_recipe, folder_state, inside, output_lock
from .plan import Plan, plan, prepare
from .pool import ModelPool, build_row
from .recipe import Recipe, ResolvedPaths
from .report import write_reports
from .sweeps import families, select


def input_state(variant: Variant, recipe: Recipe, paths: ResolvedPaths) -> dict:
    """What a variant's results were made from: per input folder or file its resolved path and every file's
    size and mtime (hashing multi-GB weights at every run would not be cheap): the base, the row's experts, the
    task folders (`evaluate.include_path`: the task YAMLs and the data beside them), the data files a task names
    outside them, and the kind's own (a routed row's example-prompt files). A finished variant is reused only
    while this is unchanged, so the same recipe text pointing elsewhere is run again."""
    kind = KINDS[variant.kind]
    folders = {"base": paths.base, **{f"experts.{n}": paths.experts[n] for n in kind.inputs(variant, recipe)}}
    for i, folder in enumerate(paths.include_paths):
        folders["evaluate.include_path" + (f"[{i}]" if len(paths.include_paths) > 1 else "")] = folder
    tasks = (*recipe.evaluate.tasks, *kind.tasks(variant))
    folders |= {f"task {task}: {key}": path for task, key, path in task_data_files(tasks, tuple(paths.include_paths))}
    folders |= kind.input_files(variant, paths)
    return {field: folder_state(Path(folder)) for field, folder in folders.items()}


def task_data_files(tasks: tuple[str, ...], include_paths: tuple[Path, ...]) -> list[tuple[str, str, Path]]:
    """(task, dataset_kwargs key, path) of each local data file or folder a task's YAML names outside the task
    folders (those inside are in their folders' state)."""
    from .harness.evaluate import task_manager

    if not include_paths:
        return []
    index = task_manager(list(include_paths), list(tasks)).task_index
    out = []
    for task in tasks:
        entry = index.get(task)
        if entry is None or entry.yaml_path is None or not isinstance(entry.cfg, dict):
            continue
        for key, value in (entry.cfg.get("dataset_kwargs") or {}).items():
            for item in value if isinstance(value, list) else [value]:
                path = Path(entry.yaml_path).parent / item if isinstance(item, str) else None
                if path is not None and path.exists() and not any(path.resolve().is_relative_to(f) for f in include_paths):
                    out.append((task, key, path.resolve()))
    return out


def _changed(old: dict, new: dict) -> str:
    fields = sorted(f for f in old.keys() | new.keys() if old.get(f) != new.get(f))
    return ", ".join(fields) if old else "its inputs (not recorded)"


def evaluate_variant(variant: Variant, recipe: Recipe, paths: ResolvedPaths, pool: ModelPool, tasks: list[str] | None = None) -> dict:
    """Run lm-eval on one variant (on `tasks`, default every task of the recipe); write lm-eval's outputs; return
    {"metrics": {task: metrics}, "seconds": ...}."""
    from .harness.model import lm_eval_model

    start = time.perf_counter()
    outputs = inside(paths.output, "lm_eval", variant.name)
    spec = recipe.evaluate.model_copy(update={"tasks": tasks}) if tasks else recipe.evaluate
    with KINDS[variant.kind].model(variant, pool) as model:
        lm = lm_eval_model(model, paths.base, recipe.evaluate.batch_size, recipe.trust_remote_code)
        metrics = evaluate(lm, spec, paths.include_paths, outputs)
        seconds = round(time.perf_counter() - start, 1)
        described = KINDS[variant.kind].describe(variant, model, pool, outputs) if metrics is not None else {}
    return {"metrics": metrics, "seconds": seconds, **described}


def run_recipe(recipe_path, force: bool = False, dry_run: bool = False, echo=print, processes: int = 1,
               sets: dict | None = None) -> dict | None:
    """Evaluate every variant of a recipe and write the reports. Returns the results (None on a dry run,
    and on ranks other than 0). `processes` > 1 starts that many data-parallel processes through
    torchrun; under a launcher (torchrun, accelerate launch) every process runs this, rank 0 writes.
    `sets`: the values of the recipe's variables (`--set NAME=VALUE`)."""
    rank, _ = world()
    echo = echo if rank == 0 else (lambda *_: None)
    p = prepare(recipe_path, sets=sets)
    recipe, paths, variants = p.recipe, p.paths, p.rows
    out = paths.output
    check_recorded_recipe(out, recipe, force)
    check_output(paths)
    if dry_run:
        echo(f"recipe {recipe.name}: {len(variants)} variants x {len(recipe.evaluate.tasks)} tasks -> {out}")
        validation_only = _validation_only(recipe, variants)
        for v in variants:
            if KINDS[v.kind].derives:
                echo(f"  {v.name:<24} {v.kind:<12} derived from the rows before it")
                continue
            record, why = (None, None) if force else finished(v, recipe, paths, input_state(v, recipe, paths), validation_only.get(v.name))
            first = f" on {validation_only[v.name][0]} (every task if chosen)" if v.name in validation_only else ""
            echo(f"  {v.name:<24} {v.kind:<12} {'done, skipped' if record else 'to run' + first + (f' ({why})' if why else '')}")
        return None
    check_device(recipe.evaluate.device)
    if processes > 1 and not launched():  # checked above in one process: bad input is one line, not N
        return _relaunch(recipe_path, force, processes, sets)
    paths.fetch()
    barrier()  # every rank has checked the output folder before rank 0 writes into it
    with output_lock(out) if rank == 0 else contextlib.nullcontext():
        if rank == 0:  # again under the lock: another recipe's run may have written here since the check above
            check_recorded_recipe(out, recipe, force)
        results = _run(p, force, echo, rank)
    barrier()  # every rank leaves together, after rank 0 has written the reports
    return results


def _relaunch(recipe_path, force: bool, processes: int, sets: dict | None) -> None:
    """`logitcomp run --processes N`: the same command as N processes of one machine, through torchrun."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "merging.cli", "run", str(recipe_path), *(["--force"] if force else []),
               *(["-v"] if logging.getLogger().getEffectiveLevel() <= logging.INFO else []),  # the processes log as this one
               *(f"--set={name}={json.dumps(value)}" for name, value in (sets or {}).items())]
    code = subprocess.call(command)
    if code:
        raise RecipeError(f"--processes {processes}: the data-parallel run failed (exit {code}); its first error is above")
    return None


def _run(p: Plan, force: bool, echo, rank: int = 0) -> dict | None:
    recipe, paths, variants = p.recipe, p.paths, p.rows
    out = paths.output
    if rank == 0:
        atomic_write_bytes(out / "recipe.yaml", recipe.to_yaml().encode())
    results, timings, routing = {}, {}, {}
    # mergekit's LoRA experts merged into the base, shared by the run's merges (inputs cannot change within a
    # run: see input_state); a `.partial-` folder, so a killed run's copy is swept by the next run's lock
    with tempfile.TemporaryDirectory(prefix=".run.partial-lora-cache-", dir=out) if rank == 0 else contextlib.nullcontext() as cache:
        pool = ModelPool(recipe, paths, Path(cache) if cache else None)
        validation_only, groups = _validation_only(recipe, variants), families(variants)

        def run_row(row: Variant, tasks: list[str] | None) -> None:
            results[row.name], timings[row.name], described = _variant(row, recipe, paths, pool, force, echo, rank, results, tasks)
            if described:
                routing[row.name] = described

        for v in tqdm(variants, desc=f"recipe {recipe.name}", unit="variant", disable=rank != 0):
            run_row(v, validation_only.get(v.name))
            if v.name in validation_only and groups[v.family][-1].name == v.name:
                run_row(_chosen_row(groups[v.family], recipe, results, rank), None)  # the value the family chose: every task
    if rank != 0:
        return None
    packages = {p: version(p) for p in ("logitcomp", "torch", "transformers", "peft", "mergekit", "lm_eval")}
    meta = {"recipe": recipe.dump(), "versions": packages, "seconds": timings}
    tasks = list(recipe.evaluate.tasks)
    echo(write_reports(out, recipe.name, results, tasks, meta, variants, recipe.evaluate.select_on, routing))
    return results


def _validation_only(recipe: Recipe, variants: list[Variant]) -> dict[str, list[str]]:
    """Under `evaluate.swept: chosen`, row -> [its family's validation task] for each row of a family that chooses
    (its own select_on or the recipe's); the chosen row runs every task after the family's last value."""
    if recipe.evaluate.swept != "chosen":
        return {}
    return {r.name: [(r.select_on or recipe.evaluate.select_on).task] for rows in families(variants).values()
            for r in rows if r.select_on or recipe.evaluate.select_on}


def _chosen_row(rows: list[Variant], recipe: Recipe, results: dict, rank: int) -> Variant:
    """The row a family (`rows`) chose on validation (rank 0 decides from the scores, every rank runs it)."""
    name = select(results, rows, recipe.evaluate.select_on)[rows[0].family]["variant"] if rank == 0 else None
    name = broadcast(name)
    return next(r for r in rows if r.name == name)


def finished(v: Variant, recipe: Recipe, paths: ResolvedPaths, inputs: dict,
             tasks: list[str] | None = None) -> tuple[dict | None, str | None]:
    """The row's record in variants/NAME.json when it can be reused (`run` and `--dry-run` decide alike), else
    None and why not (None when the row was never run): unreadable, not a record, made from other inputs, or
    without a score of one of `tasks` (default: the recipe's), as a row first run on its validation task only."""
    done = inside(paths.output, "variants", f"{v.name}.json")
    if not done.exists():
        return None, None
    try:
        record = json.loads(done.read_bytes())
    except (ValueError, OSError) as exc:
        return None, f"unreadable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'empty'})"
    if not isinstance(record, dict) or not isinstance(record.get("metrics"), dict) or not isinstance(record.get("seconds"), (int, float)):
        return None, "not a finished row's record"
    if record.get("inputs") != inputs:
        return None, f"{_changed(record.get('inputs') if isinstance(record.get('inputs'), dict) else {}, inputs)} changed since it was made"
    if missing := [t for t in tasks or recipe.evaluate.tasks if t not in record["metrics"]]:
        return None, f"not yet run on {', '.join(missing)}"
    return record, None


def _variant(v: Variant, recipe: Recipe, paths: ResolvedPaths, pool: ModelPool, force: bool, echo, rank: int,
             results: dict, tasks: list[str] | None = None) -> tuple[dict, float, dict | None]:
    """One row's metrics, seconds and routing (a routed row's record's, else None) on `tasks` (default every task):
    reused from variants/NAME.json while its inputs are unchanged and it holds them, else evaluated (a deriving
    kind's from `results`, the rows before it). Rank 0 decides, for every rank (they must run the same rows), and writes."""
    if KINDS[v.kind].derives:  # nothing to evaluate: made from the rows before it, at every run
        echo(f"{v.name}: derived from the rows before it")
        return (KINDS[v.kind].derive(v, results), 0.0, None) if rank == 0 else (None, None, None)
    done = inside(paths.output, "variants", f"{v.name}.json")
    inputs = input_state(v, recipe, paths)
    record = None
    if rank == 0 and not force:
        record, why = finished(v, recipe, paths, inputs, tasks)
        if why:
            echo(f"variants/{v.name}.json: {why}; running it again")
    if broadcast(record is None):
        record = {**evaluate_variant(v, recipe, paths, pool, tasks), "inputs": inputs}
        if rank == 0:
            atomic_write_bytes(done, (json.dumps(record, indent=2) + "\n").encode())
        echo(f"{v.name}: evaluated in {record['seconds']:.1f} s")
    else:
        echo(f"{v.name}: reused (its inputs are unchanged)")
    return (record["metrics"], record["seconds"], record.get("routing")) if rank == 0 else (None, None, None)


def merge_recipe(p: Plan) -> dict[str, Path]:
    """Build the model folder of every row of a merging kind (`logitcomp merge`); with none listed, the
    rows of every merging kind's default variant that the recipe allows. Returns row name -> folder."""
    rows = [row for row in p.rows if KINDS[row.kind].merges]
    if not rows:
        defaults = [name for name, kind in KINDS.items() if kind.merges and kind.default and not kind.unavailable(p.recipe)]
        rows = plan(p.recipe.model_copy(update={"variants": defaults}))
    return {row.name: build_row(KINDS[row.kind], row, p.recipe, p.paths) for row in rows}

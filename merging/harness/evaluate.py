"""One row of a recipe through lm-eval: its task index, `simple_evaluate`, and lm-eval's own outputs
written atomically into the row's folder."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from pathlib import Path

from logitcomp.io import atomic_dir, free_mib


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


def task_manager(include_paths: list[Path], tasks: list[str]):
    """lm-eval's TaskManager; when every task is in `include_paths`, only those folders are indexed
    (indexing lm-eval's thousands of built-in task files takes seconds)."""
    from lm_eval.tasks import TaskManager

    folders = [str(p) for p in include_paths] or None
    if folders:
        local = TaskManager(include_path=folders, include_defaults=False)
        if set(tasks) <= set(local.all_tasks):
            return local
    return TaskManager(include_path=folders)


def task_prompts(task: str, include_paths: list[Path], splits: tuple[str, ...] = ("validation", "test")) -> list[str]:
    """The contexts lm-eval gives a model for a task's documents (zero-shot), from the first of `splits` it has
    (`training`, `validation`, `test`)."""
    from lm_eval.tasks import get_task_dict

    t = get_task_dict([task], task_manager(include_paths, [task]))[task]
    split = next((s for s in splits if getattr(t, f"has_{s}_docs")()), None)
    if split is None:
        raise ValueError(f"task {task}: it has none of the splits {', '.join(splits)}")
    return [t.doc_to_text(d) for d in getattr(t, f"{split}_docs")()]


def sample_contexts(outputs: Path) -> dict[str, list[str]]:
    """Task -> the contexts of its documents in lm-eval's per-sample outputs in `outputs` (each document's first
    request's context), in document order."""
    contexts = {}
    for path in sorted(p for p in Path(outputs).rglob("samples_*.jsonl") if SAMPLES.fullmatch(p.name)):
        records = [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        contexts[SAMPLES.fullmatch(path.name)[1]] = [r["arguments"]["gen_args_0"]["arg_0"] for r in sorted(records, key=lambda r: r["doc_id"])]
    return contexts


def evaluate(lm, spec, include_paths: list[Path], out: Path) -> dict | None:
    """Run lm-eval on `lm` with a recipe's `evaluate:` block (`spec`); write lm-eval's aggregated results
    and per-sample outputs into `out` (replacing an earlier run's whole). Returns {task: metrics}, or None
    on a rank other than 0 under a launcher (lm-eval gathered its share on rank 0)."""
    import lm_eval.evaluator
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    lm_eval.evaluator.get_git_commit_hash = _git_hash_quietly

    tasks = list(spec.tasks)
    results = simple_evaluate(model=lm, tasks=tasks, task_manager=task_manager(include_paths, tasks), limit=spec.limit,
                              num_fewshot=spec.num_fewshot, gen_kwargs=dict(spec.gen_kwargs) or None, log_samples=True,
                              confirm_run_unsafe_code=spec.confirm_run_unsafe_code)
    if results is None:
        return None
    samples = results.pop("samples")
    with atomic_dir(out) as tmp:
        tracker = EvaluationTracker(output_path=str(tmp))
        tracker.general_config_tracker.model_name_sanitized = ""  # files at lm_eval/ROW/, not under a model-name folder
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
        _check_written(tmp, out, {task: len(samples[task]) for task in results["configs"]})
    return {t: {k: v for k, v in m.items() if k != "alias"} for t, m in results["results"].items()}


def _git_hash_quietly() -> str | None:
    """lm-eval's `get_git_commit_hash` without git's "fatal: not a git repository" on the terminal of every row
    run outside a repository (lm-eval lets git's stderr through)."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()  # noqa: S607
    except (subprocess.CalledProcessError, FileNotFoundError):
        return get_commit_from_path(os.getcwd())


SAMPLES = re.compile(  # lm-eval's samples_TASK_DATE.jsonl
    r"samples_(.+)_(\d{4}-\d\d-\d\dT[\d\-.:]+)\.jsonl")


def _check_written(tmp: Path, out: Path, counts: dict[str, int]) -> None:
    """lm-eval's EvaluationTracker only logs a warning when a write fails (a full disk leaves a results JSON cut
    short and empty sample files): its files are read back before the row's folder replaces the previous one.
    Raises OSError naming the file; the previous outputs are then kept whole."""
    problems = []
    results = sorted(tmp.rglob("results_*.json"))
    if not results:
        problems.append("no results_*.json")
    for path in results:
        try:
            json.loads(path.read_bytes())
        except ValueError:
            problems.append(f"{path.name} is cut short ({path.stat().st_size} bytes)")
    # lm-eval names them samples_TASK_DATE.jsonl: a glob of samples_TASK_* would also take smol_math_json's for smol_math
    samples = sorted(p for p in tmp.rglob("samples_*.jsonl") if SAMPLES.fullmatch(p.name))
    for task, count in counts.items():
        files = [p for p in samples if SAMPLES.fullmatch(p.name)[1] == task]
        lines = [line for path in files for line in path.read_bytes().splitlines()]
        try:
            complete = len(lines) == count and all(isinstance(json.loads(line), dict) for line in lines)
        except ValueError:
            complete = False
        if not complete:
            problems.append(f"samples of {task}: {len(lines)} of {count} records{' (none written)' if not files else ''}")
    if problems:
        raise OSError(f"lm_eval/{out.name}: lm-eval did not write its outputs whole ({'; '.join(problems)}; {free_mib(tmp):.0f} MiB free "
                      "on that disk); the previous outputs are kept")

"""Reports of a recipe run: results.json, report.md (variants x tasks) and report.png (grouped bars)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from logitcomp.io import atomic_write_bytes


def metric_columns(results: dict[str, dict[str, dict]], tasks: list[str]) -> list[tuple[str, str, str]]:
    """(task, lm-eval `metric,filter` key, column header) for every metric any variant reports.

    A task with one metric is headed by its name; a task with several (filters, perplexities)
    gets one column per metric, headed `task metric` plus the filter unless it is `none`.
    """
    columns = []
    for task in tasks:
        keys = []
        for by_task in results.values():
            for key, value in by_task.get(task, {}).items():
                if "," in key and "_stderr" not in key and isinstance(value, (int, float)) and key not in keys:
                    keys.append(key)
        for key in keys:
            metric, _, filt = key.partition(",")
            label = task if len(keys) == 1 else f"{task} {metric}" + ("" if filt == "none" else f" ({filt})")
            columns.append((task, key, label))
    return columns


def _cell(task_metrics: dict, key: str) -> tuple[float, float | None] | None:
    if key not in task_metrics:
        return None
    stderr = task_metrics.get(key.replace(",", "_stderr,", 1))
    return float(task_metrics[key]), float(stderr) if isinstance(stderr, (int, float)) else None


def markdown_table(results: dict[str, dict[str, dict]], tasks: list[str]) -> str:
    """Rows = variants, columns = each task's metrics, cells = value ± stderr."""
    columns = metric_columns(results, tasks)
    lines = ["| variant | " + " | ".join(label for *_, label in columns) + " |", "|---|" + "---|" * len(columns)]
    for variant, by_task in results.items():
        cells = []
        for task, key, _ in columns:
            cell = _cell(by_task.get(task, {}), key)
            cells.append("-" if cell is None else f"{cell[0]:.3f}" + (f" ± {cell[1]:.3f}" if cell[1] is not None else ""))
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_reports(out: Path, recipe_name: str, results: dict, tasks: list[str], meta: dict) -> None:
    """Write results.json, report.md and report.png into `out`, each atomically."""
    table = markdown_table(results, tasks)
    atomic_write_bytes(out / "results.json", (json.dumps({**meta, "results": results}, indent=2) + "\n").encode())
    note = "Cells: lm-eval's metric ± its stderr (where lm-eval gives one); the plot shows the metrics that lie in [0, 1]."
    atomic_write_bytes(out / "report.md", f"# {recipe_name}\n\n{note}\n\n{table}".encode())
    atomic_write_bytes(out / "report.png", _bars(results, tasks, recipe_name))


def _bars(results: dict, tasks: list[str], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(results)
    columns = metric_columns(results, tasks)
    cells = {(v, label): _cell(results[v].get(task, {}), key) for v in variants for task, key, label in columns}
    labels = [label for *_, label in columns
              if all(cells[v, label] is None or 0.0 <= cells[v, label][0] <= 1.0 for v in variants)]  # no perplexities
    width = 0.8 / max(1, len(variants))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(labels) + 3.5), 4))
    for i, variant in enumerate(variants):
        vals = [(cells[variant, label] or (0.0, None))[0] for label in labels]
        errs = [(cells[variant, label] or (0.0, None))[1] or 0.0 for label in labels]
        ax.bar([t + i * width for t in range(len(labels))], vals, width, yerr=errs, label=variant)
    ax.set_xticks([t + 0.4 - width / 2 for t in range(len(labels))], labels, rotation=20, ha="right")
    ax.set_ylabel("score")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never over a bar
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()

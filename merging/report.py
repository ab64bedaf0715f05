"""Reports of a recipe run: results.json, report.md (variants x tasks) and report.png (grouped bars)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from logitcomp.io import atomic_write_bytes


def primary_metric(task_metrics: dict) -> tuple[str, float, float | None]:
    """(name, value, stderr) of a task's first metric (lm-eval's `metric,filter` keys)."""
    for key, value in task_metrics.items():
        if "," in key and "_stderr" not in key and isinstance(value, (int, float)):
            stderr = task_metrics.get(key.replace(",", "_stderr,", 1))
            return key, float(value), float(stderr) if isinstance(stderr, (int, float)) else None
    raise ValueError(f"no numeric metric in {sorted(task_metrics)}")


def markdown_table(results: dict[str, dict[str, dict]], tasks: list[str]) -> str:
    """Rows = variants, columns = tasks, cells = primary metric ± stderr."""
    lines = ["| variant | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for variant, by_task in results.items():
        cells = []
        for task in tasks:
            if task not in by_task:
                cells.append("-")
                continue
            _, value, stderr = primary_metric(by_task[task])
            cells.append(f"{value:.3f}" + (f" ± {stderr:.3f}" if stderr is not None else ""))
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_reports(out: Path, recipe_name: str, results: dict, tasks: list[str], meta: dict) -> None:
    """Write results.json, report.md and report.png into `out`, each atomically."""
    table = markdown_table(results, tasks)
    atomic_write_bytes(out / "results.json", (json.dumps({**meta, "results": results}, indent=2) + "\n").encode())
    metric = primary_metric(next(iter(next(iter(results.values())).values())))[0] if results else ""
    atomic_write_bytes(out / "report.md", f"# {recipe_name}\n\nMetric: `{metric}` per task (± stderr).\n\n{table}".encode())
    atomic_write_bytes(out / "report.png", _bars(results, tasks, recipe_name))


def _bars(results: dict, tasks: list[str], title: str) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(results)
    width = 0.8 / max(1, len(variants))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(tasks) + 3.5), 4))
    for i, variant in enumerate(variants):
        vals, errs = [], []
        for task in tasks:
            _, v, e = primary_metric(results[variant][task]) if task in results[variant] else ("", 0.0, None)
            vals.append(v)
            errs.append(e or 0.0)
        ax.bar([t + i * width for t in range(len(tasks))], vals, width, yerr=errs, label=variant)
    ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks, rotation=20, ha="right")
    ax.set_ylabel("score")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never over a bar
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()

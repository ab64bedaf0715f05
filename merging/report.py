"""Reports of a recipe run: results.json, report.md (variants x tasks), report.png (grouped bars) and,
for swept families, sweep_TASK.png (score against the swept value)."""

from __future__ import annotations

import json
from pathlib import Path

from logitcomp.io import atomic_write_bytes

from .figures import figure_png
from .kinds import Variant
from .recipe import SelectSpec
from .sweeps import families, main_rows, select, sweep_figures


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


def markdown_table(results: dict[str, dict[str, dict]], tasks: list[str], rows: list[str] | None = None) -> str:
    """Rows = variants (`rows`, default all), columns = each task's metrics, cells = value ± stderr."""
    columns = metric_columns(results, tasks)
    lines = ["| variant | " + " | ".join(label for *_, label in columns) + " |", "|---|" + "---|" * len(columns)]
    for variant in rows or list(results):
        by_task = results[variant]
        cells = []
        for task, key, _ in columns:
            cell = _cell(by_task.get(task, {}), key)
            cells.append("-" if cell is None else f"{cell[0]:.3f}" + (f" ± {cell[1]:.3f}" if cell[1] is not None else ""))
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main_table(results: dict, tasks: list[str], variants: list[Variant], chosen: dict) -> str:
    """The table a reader reads first: each swept family at its `chosen` value (`sweeps.select`), the
    validation tasks that chose left out (with no family chosen, every row and task; a recipe of validation
    tasks only, a probe, keeps them: the chosen rows' validation scores)."""
    if not chosen:
        return markdown_table(results, tasks)
    validation = {c["on"]["task"] for c in chosen.values()}
    shown = [t for t in tasks if t not in validation] or tasks
    table = markdown_table(results, shown, main_rows(variants, chosen))
    picks = "; ".join(f"{f}: {c['parameter']}={c['value']:g} ({c['on']['task']} {c['on']['metric']} {c['score']:.3f})"
                      for f, c in chosen.items())
    return f"{table}\nChosen on validation: {picks}\n"


def routing_section(routing: dict[str, dict]) -> str:
    """Per routed row: the λ and floors its run fitted, and per task the share of documents that kept each set of experts."""
    text = ""
    for row, described in routing.items():
        fit = described.get("fit")
        text += f"\n### {row}\n\n"
        if fit:
            floors = ", ".join(f"{e} {f:g}" for e, f in fit["floors"].items())
            exact = ", ".join(f"{s} {v:.2f}" for s, v in fit["exact"].items())
            text += (f"Fitted in the run: λ {fit['shrinkage']:g} (mean exact routing of the candidates: "
                     f"{', '.join(f'{k}: {v:.3f}' for k, v in fit['candidates'].items())}); floors {floors}; exact routing {exact}.\n\n")
        text += "| task | kept experts (share of its documents) |\n|---|---|\n"
        for task, kept in described.get("kept", {}).items():
            text += f"| {task} | {', '.join(f'{s} {v:.2f}' for s, v in kept.items())} |\n"
    return f"\n## Routing: which experts each task's prompts kept\n{text}" if text else ""


def write_reports(out: Path, recipe_name: str, results: dict, tasks: list[str], meta: dict, variants: list[Variant],
                  select_on: SelectSpec | None = None, routing: dict | None = None) -> str:
    """Write results.json, report.md, report.png and the sweep figures into `out`, each atomically; `routing`:
    row -> its record's routing (`merging.kinds.composed`'s describe). Returns the main table (what the run prints)."""
    chosen = select(results, variants, select_on)
    table = main_table(results, tasks, variants, chosen)
    selection = {"selection": {"on": select_on.model_dump() if select_on else None, "chosen": chosen}} if chosen else {}
    routed = {"routing": routing} if routing else {}
    atomic_write_bytes(out / "results.json", (json.dumps({**meta, **selection, **routed, "results": results}, indent=2) + "\n").encode())
    note = "Cells: lm-eval's metric ± its stderr (where lm-eval gives one); the plot shows the metrics that lie in [0, 1]."
    text = f"# {recipe_name}\n\n{note}\n\n{table}"
    if chosen:
        on = ", ".join(sorted({c["on"]["task"] for c in chosen.values()}))
        text += f"\n## Every configuration (the swept values too; {on} chose among them)\n\n{markdown_table(results, tasks)}"
    if set(families(variants)) - set(chosen):
        text += "\nNo `evaluate.select_on`: every swept value is shown; name a validation task to choose one.\n"
    text += routing_section(routing or {})
    atomic_write_bytes(out / "report.md", text.encode())
    main = {v: results[v] for v in main_rows(variants, chosen)}
    atomic_write_bytes(out / "report.png", _bars(main, tasks, recipe_name))
    if families(variants):
        for name, png in sweep_figures(results, variants, metric_columns(results, tasks), chosen).items():
            atomic_write_bytes(out / name, png)
    return table


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
    return figure_png(fig)

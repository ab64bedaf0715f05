"""Swept families: the value each one keeps (chosen on the validation task) and score-vs-value figures."""

from __future__ import annotations

import math

from .figures import figure_png
from .kinds import Variant
from .errors import RecipeError
from .recipe import SelectSpec


def families(variants: list[Variant]) -> dict[str, list[Variant]]:
    """Swept family name -> its rows in sweep order."""
    out: dict[str, list[Variant]] = {}
    for v in variants:
        if v.family:
            out.setdefault(v.family, []).append(v)
    return out


def selection_score(metrics: dict[str, dict], select_on: SelectSpec, field: str = "evaluate.select_on") -> float:
    """The row's score on the validation metric. Raises RecipeError naming `field` and the metrics there are."""
    by_task = metrics.get(select_on.task, {})
    keys = [k for k in by_task if "_stderr" not in k and (k == select_on.metric or k.split(",")[0] == select_on.metric)]
    if len(keys) != 1:
        reported = sorted(k for k in by_task if "," in k and "_stderr" not in k)
        raise RecipeError(f"{field}.metric: {select_on.task} reports {', '.join(reported) or 'no metrics'}; "
                          f"{'name one of them with its filter' if keys else 'got'} {select_on.metric!r}")
    value = float(by_task[keys[0]])
    return value if not math.isnan(value) else -math.inf if select_on.higher_is_better else math.inf


def select(results: dict[str, dict], variants: list[Variant], select_on: SelectSpec | None) -> dict[str, dict]:
    """Family -> the chosen row: the best score on the family's own `select_on`, else the recipe's
    (ties: the first value listed). A family with neither is not chosen: every value is then shown."""
    chosen = {}
    for family, rows in families(variants).items():
        on = rows[0].select_on or select_on
        if on is None:
            continue
        field = f"variants: {family}: select_on" if rows[0].select_on else "evaluate.select_on"
        scores = [selection_score(results[r.name], on, field) for r in rows]
        sign = 1 if on.higher_is_better else -1
        best = max(range(len(rows)), key=lambda i: (sign * scores[i], -i))
        parameter, value = rows[best].swept
        chosen[family] = {"variant": rows[best].name, "parameter": parameter, "value": value, "score": scores[best],
                          "scores": {str(r.swept[1]): s for r, s in zip(rows, scores)}, "on": on.model_dump()}
    return chosen


def main_rows(variants: list[Variant], chosen: dict[str, dict]) -> list[str]:
    """Unswept rows, and each chosen family's chosen row in place of the family (a family not chosen: every row)."""
    return [v.name for v in variants if not v.family or v.family not in chosen or v.name == chosen[v.family]["variant"]]


def sweep_figures(results: dict[str, dict], variants: list[Variant], columns: list[tuple[str, str, str]],
                  chosen: dict[str, dict]) -> dict[str, bytes]:
    """`sweep_TASK.png` -> one figure per task: each metric of the task against the swept value, one line
    per family (the chosen value circled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = families(variants)
    figures = {}
    for task in dict.fromkeys(t for t, *_ in columns):
        metrics = [(key, label) for t, key, label in columns if t == task]
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics) + 1.5, 3.6), squeeze=False)
        for ax, (key, label) in zip(axes[0], metrics):
            for family, rows in groups.items():
                points = [(r.swept[1], results[r.name].get(task, {}).get(key)) for r in rows]
                points = [(x, float(y)) for x, y in points if isinstance(y, (int, float))]
                if not points:
                    continue
                line, = ax.plot(*zip(*points), marker="o", label=f"{family} ({rows[0].swept[0]})")
                pick = chosen.get(family)
                if pick and results[pick["variant"]].get(task, {}).get(key) is not None:
                    ax.plot(pick["value"], results[pick["variant"]][task][key], "o", ms=13, mfc="none", color=line.get_color())
            ax.set_xlabel("swept value")
            ax.set_title(label, fontsize=9)
        axes[0][0].set_ylabel("score")
        axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        safe = "".join(c if c.isalnum() or c in "_-." else "_" for c in task)
        figures[f"sweep_{safe}.png"] = figure_png(fig, dpi=100)
    return figures

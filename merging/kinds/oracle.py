"""The `oracle` row: each task scored by the model that should answer it (its own expert), the upper bound a
router over the experts can reach. Nothing is evaluated: the row takes each task's metrics from that
expert's row of the same run (or the base's), so the `experts` (and `base`) rows must come before it.

    - {name: oracle, kind: oracle, tasks: {smol_math: math, smol_code: code, smol_shout: shout}}

A task left out of `tasks` has no oracle cell (a task that needs several skills has no single own expert).
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from .kind import Kind, Options, Variant


class OracleOptions(Options):
    tasks: dict[str, str] = Field(min_length=1)  # task -> the expert (or "base") whose row scores it


class OracleKind(Kind):
    name = "oracle"
    options = OracleOptions
    derives = True

    def check_sweep(self, key: str) -> str | None:
        return "sweep: an oracle variant has nothing to sweep"

    def row(self, row: Variant, spec, recipe) -> Variant:
        tasks = dict(spec.options.tasks)
        for task, source in tasks.items():
            if task not in recipe.evaluate.tasks:
                raise ValueError(f"tasks: {task!r} is not a task of evaluate.tasks {list(recipe.evaluate.tasks)}")
            if source != "base" and source not in recipe.experts:
                raise ValueError(f"tasks.{task}: expected an expert ({', '.join(recipe.experts)}) or 'base', got {source!r}")
        needed = {"experts"} | ({"base"} if "base" in tasks.values() else set())
        before = [v if isinstance(v, str) else v.kind for v in recipe.variants[:_position(recipe, spec)]]
        missing = sorted(needed - set(before))
        if missing:
            raise ValueError(f"kind: an oracle row takes its scores from the {missing[0]!r} rows: list {missing[0]} before it in variants")
        return replace(row, parameters={"tasks": tasks}, weights={})

    def inputs(self, row: Variant, recipe) -> list[str]:
        return sorted({e for e in row.parameters["tasks"].values() if e != "base"})

    def derive(self, row: Variant, results: dict) -> dict:
        return {task: results[source][task] for task, source in row.parameters["tasks"].items() if task in results[source]}


def _position(recipe, spec) -> int:
    return next(i for i, v in enumerate(recipe.variants) if not isinstance(v, str) and v.name == spec.name)

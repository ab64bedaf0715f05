"""The `merged` rows: a mergekit merge of the experts into the base (task arithmetic by default).

A named row takes a mergekit `method` and its `parameters` (default: the recipe's `merge:`); its
sweep is a parameter of that method (λ is mergekit's own `lambda`, the merged task vector's scale).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from .kind import Kind, Options, Variant


class MergedOptions(Options):
    method: str | None = None
    parameters: dict[str, Any] | None = None


class MergedKind(Kind):
    name = "merged"
    options = MergedOptions
    default = True
    merges = True
    combines = True

    def row(self, row: Variant, spec, recipe) -> Variant:
        own = spec.options
        parameters = dict(recipe.merge.parameters if own.parameters is None else own.parameters)
        if row.swept:  # check() refuses a method without this parameter
            parameters[row.swept[0]] = row.swept[1]
        weights = {n: recipe.experts[n].weight for n in row.experts}  # a swept λ is mergekit's, not a scale of the weights
        return replace(row, method=own.method or recipe.merge.method, parameters=parameters, weights=weights)

    def check(self, rows: list[Variant], recipe, paths) -> None:
        """Each row's mergekit method and parameter names (a sweep's too) against mergekit's registry."""
        import bridge

        methods = bridge.merge_methods()
        for row in rows:
            field = "merge" if row.name == self.name and not row.family else f"variants: {row.family or row.name}"
            if row.method not in methods:
                raise ValueError(f"{field}.method: unknown merge method {row.method!r}; mergekit has {sorted(methods)}")
            takes = [p.name for p in methods[row.method].spec.parameters if p.name != "weight"]
            for key in row.parameters:
                if key not in takes:
                    what = "sweep" if row.swept and row.swept[0] == key else "parameters"
                    raise ValueError(f"{field}.{what}: mergekit's {row.method} takes {', '.join(takes) or 'no parameters'}"
                                     f"{' (each expert weight is experts.NAME.weight)' if key == 'weight' else ''}, got {key!r}")

    def build(self, row: Variant, recipe, paths, lora_cache: Path | None = None, folder: Path | None = None) -> Path:
        import bridge

        experts = {n: paths.experts[n] for n in row.experts}
        return bridge.task_arithmetic(paths.base, experts, folder or paths.output / "models" / row.name, row.weights, row.method,
                                      row.parameters, device=recipe.evaluate.device, lora_cache=lora_cache,
                                      options=recipe.merge.options.model_dump())

    @contextmanager
    def model(self, row: Variant, pool):
        yield pool.load(row.name, pool.merge(self, row))

    def export(self, row: Variant, pool, out: Path, self_contained: bool = False) -> None:
        self.build(row, pool.recipe, pool.paths, folder=out)

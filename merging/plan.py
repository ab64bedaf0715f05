"""The rows of a comparison: a recipe's `variants:` expanded into one `Variant` per evaluated model.

`experts` becomes one row per expert, and a swept variant one row per value, named `NAME[PARAM=VALUE]`
and tagged with its family (NAME) so that the runner can pick one value on the validation task.
Each row carries everything its model is built from (composition config, merge method, weights),
so the builders never look back at the recipe's defaults. Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from logitcomp.config import RULE_PARAMS, CompositionConfig

from .recipe import SWEEP_KEY, Recipe, VariantSpec, _composition


@dataclass(frozen=True)
class Variant:
    """One row: `kind` is base, expert, composed, merged or merged_lora."""

    name: str
    kind: str
    family: str | None = None  # a swept row's variant name in the recipe
    swept: tuple[str, float] | None = None  # (parameter, value) of a swept row
    config: CompositionConfig | None = None  # composed
    method: str | None = None  # merged: mergekit's method and its method-level parameters
    parameters: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)  # composed, merged, merged_lora: expert -> weight


def plan(recipe: Recipe) -> list[Variant]:
    """The recipe's rows in order. Raises ValueError naming the variant whose options do not hold."""
    weights = {n: e.weight for n, e in recipe.experts.items()}
    rows = []
    for item in recipe.variants:
        if item == "experts":
            rows += [Variant(n, "expert") for n in recipe.experts]
        elif item == "base":
            rows.append(Variant("base", "base"))
        elif isinstance(item, str):  # composed, merged, merged_lora with the recipe's own blocks
            rows.append(_row(VariantSpec(name=item, kind=item), recipe, weights, None))
        else:
            values = next(iter(item.sweep.items())) if item.sweep else None
            for swept in [(values[0], v) for v in values[1]] if values else [None]:
                try:
                    rows.append(_row(item, recipe, weights, swept))
                except ValueError as exc:
                    raise ValueError(f"variants: {item.name}: {exc}") from None
    return rows


def _row(spec: VariantSpec, recipe: Recipe, weights: dict, swept: tuple[str, float] | None) -> Variant:
    key, value = swept or (None, None)
    scale = value if key == SWEEP_KEY else 1.0
    scaled = {n: w * scale for n, w in weights.items()}
    name = f"{spec.name}[{key}={value:g}]" if swept else spec.name
    row = Variant(name, spec.kind, spec.name if swept else None, swept, weights=scaled)
    if spec.kind == "composed":
        return dataclasses.replace(row, config=_config(spec, recipe, scaled, key, value))
    if spec.kind == "merged":
        parameters = dict(recipe.merge.parameters if spec.parameters is None else spec.parameters)
        if swept:  # λ is mergekit's own `lambda` (the merged task vector's scale); check_inputs checks the method has it
            parameters[key] = value
        return dataclasses.replace(row, method=spec.method or recipe.merge.method, parameters=parameters, weights=weights)
    return row  # merged_lora: task arithmetic with the scaled weights


def _config(spec: VariantSpec, recipe: Recipe, weights: dict, key: str | None, value: float | None) -> CompositionConfig:
    options = {**recipe.compose, **spec.compose}
    if "rule" in spec.compose and "rule_params" not in spec.compose:
        options["rule_params"] = {}  # the recipe's parameters belong to the recipe's rule
    if key not in (None, SWEEP_KEY):
        rule = options["rule"]
        if key not in RULE_PARAMS[rule]:
            takes = ", ".join(RULE_PARAMS[rule]) or "no parameters"
            raise ValueError(f"sweep: a composed variant sweeps {SWEEP_KEY} or a parameter of its rule {rule} ({takes}), got {key!r}")
        options["rule_params"] = {**options["rule_params"], key: value}
    return _composition(options, weights)

"""What every variant kind is: `Kind` (the interface a kind implements) and `Variant` (one planned row).

A kind is named in a recipe's `variants:` list, alone (`composed`) or as a mapping with its own
options (`{name: ties, kind: merged, method: ties}`); it expands into rows (one per swept value),
checks what can be checked without a model, and builds each row's model from the run's `ModelPool`.
Torch-free: the recipe schema reads the kinds' options.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from ..errors import unknown_key

SWEEP_KEY = "lambda"  # the sweep every kind takes: each expert's weight times λ (merged: mergekit's `lambda`)


@dataclass(frozen=True)
class Variant:
    """One row of a comparison: everything its model is built from, so no builder looks back at the recipe."""

    name: str
    kind: str  # a name of merging.kinds.KINDS
    family: str | None = None  # a swept row's variant name in the recipe
    swept: tuple[str, float] | None = None  # (parameter, value) of a swept row
    config: Any = None  # composed: its CompositionConfig
    method: str | None = None  # merged: mergekit's method
    parameters: dict = field(default_factory=dict)  # the kind's own parameters (merged: the method's)
    weights: dict = field(default_factory=dict)  # expert -> weight, for kinds that combine experts
    experts: tuple[str, ...] = ()  # the experts a combining row is made from (its `experts:`, else every expert)
    select_on: Any = None  # a swept row's own SelectSpec (None: the recipe's evaluate.select_on)


class Options(BaseModel):
    """Base of a kind's options (the keys a named row of that kind may hold besides name, kind and sweep)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        return known_keys(cls, data)


def known_keys(model: type[BaseModel], data: Any) -> Any:
    """`data` unchanged; raises ValueError naming its first key that is not a field of `model` (the nearest field,
    the allowed ones) instead of pydantic's "Extra inputs are not permitted"."""
    unknown = [k for k in data if k not in model.model_fields] if isinstance(data, dict) else []
    if unknown:
        raise ValueError(unknown_key(unknown[0], model.model_fields))
    return data


class Kind:
    """A variant kind. Subclasses set `name` and override what they need; one instance is registered
    in `merging.kinds.KINDS`.

    Attributes:
        name: the word in a recipe (`variants: [NAME]`, or `kind: NAME` in a named row).
        options: the pydantic model of a named row's own options; None: the kind has no named rows.
        default: listed in a recipe that names no `variants:`.
        merges: builds a model folder from the experts (`logitcomp merge` builds these rows).
        combines: made from several experts; a named row may name a subset (`experts: [a, b]`).
        derives: evaluates nothing: `derive` makes its metrics from rows run before it.
    """

    name: str = ""
    options: type[Options] | None = None
    default: bool = False
    merges: bool = False
    combines: bool = False
    derives: bool = False

    # ---- recipe -------------------------------------------------------------------------------
    def normalise(self, data: dict) -> dict:
        """A named row's raw options before validation (e.g. flat `compose:` keys gathered)."""
        return data

    def unavailable(self, recipe) -> str | None:
        """Why this kind cannot be listed in `recipe` (one line naming the field), None when it can."""
        return None

    def check_sweep(self, key: str) -> str | None:
        """Why a named row of this kind cannot sweep `key` on its own terms, None when it may (later
        checks, with the row's options, may still refuse the value)."""
        return None

    # ---- plan ---------------------------------------------------------------------------------
    def rows(self, spec, recipe) -> list[Variant]:
        """The rows of one `variants:` item (spec: a VariantSpec): one per swept value, each named
        `NAME[PARAM=VALUE]` and tagged with its family. Raises ValueError naming what does not hold."""
        names = tuple(spec.experts or recipe.experts)
        base_weights = {n: recipe.experts[n].weight for n in names}
        if not spec.sweep:
            return [self.row(Variant(spec.name, self.name, weights=base_weights, experts=names), spec, recipe)]
        (key, values), = spec.sweep.items()
        rows = []
        for value in values:
            scale = value if key == SWEEP_KEY else 1.0
            row = Variant(f"{spec.name}[{key}={value:g}]", self.name, spec.name, (key, value),
                          weights={n: w * scale for n, w in base_weights.items()}, experts=names, select_on=spec.select_on)
            rows.append(self.row(row, spec, recipe))
        return rows

    def row(self, row: Variant, spec, recipe) -> Variant:
        """One row with the kind's own settings filled in (row.weights are already scaled by a swept λ)."""
        return row

    # ---- checks and inputs --------------------------------------------------------------------
    def check(self, rows: list[Variant], recipe, paths) -> None:
        """Refuse (ValueError, one line naming the field) what can be known wrong before a model loads."""

    def inputs(self, row: Variant, recipe) -> list[str]:
        """The experts whose folders the row's model is made from (the base always is)."""
        return list(row.experts or recipe.experts)

    def input_files(self, row: Variant, paths) -> dict[str, Path]:
        """Files or folders besides the base, the experts and the tasks that the row's model is made from, by field."""
        return {}

    def tasks(self, row: Variant) -> list[str]:
        """The lm-eval tasks the row's model is built from besides evaluate.tasks (a routed row's validation tasks)."""
        return []

    # ---- models -------------------------------------------------------------------------------
    def build(self, row: Variant, recipe, paths, lora_cache: Path | None = None, folder: Path | None = None) -> Path:
        """Merging kinds: write the row's model into `folder` (default OUTPUT/models/NAME) and return that folder."""
        raise NotImplementedError(f"{self.name} rows build no model folder")

    def export(self, row: Variant, pool, out: Path, self_contained: bool = False) -> dict | None:
        """Write the row's model into the empty folder `out` (`logitcomp export`); returns what its routing fitted, if any.
        `self_contained`: the folder holds everything it loads (the base too)."""
        raise ValueError(f"row: {row.name} is a {self.name} row, which writes no model of its own; export a composed, routed, "
                         "merged or merged_lora row")

    def model(self, row: Variant, pool) -> AbstractContextManager:
        """A context holding the row's model, ready for lm-eval, built from the run's ModelPool."""
        raise NotImplementedError

    def describe(self, row: Variant, model, pool, outputs: Path) -> dict:
        """What the row's record holds besides its metrics, from its model and lm-eval's outputs (a folder)."""
        return {}

    def derive(self, row: Variant, results: dict) -> dict:
        """Deriving kinds: the row's metrics {task: metrics} from the metrics of the rows run before it."""
        raise NotImplementedError(f"{self.name} rows are evaluated, not derived")

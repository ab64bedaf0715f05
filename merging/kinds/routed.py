"""The `routed` rows: one composed model of the row's experts, each expert composed exactly where the prompt shows
its skill, with every routing value fitted in the run (nothing copied into the recipe by hand).

Its defaults are the configuration docs/routing.md found best: token-level discriminant detectors (`score:
discriminant, pool: max`), binary gates held from the prompt (`gates: binary, update: false`, θ 0), each
expert's floor and the covariance's shrinkage λ (among 0.1, 1, 10) fitted on labelled prompts
(`logitcomp.routing_fit`): the recipe's `route.validation` tasks (task -> the experts its prompts need, e.g.
`smol_math_xml_val: math+xml`), else each expert's own example prompts. The example prompts are each expert's
`prompts:` in the recipe (a JSONL file, a list, or `{task: NAME}`), else the `prompts.jsonl` in its folder.

    route:                                  # the recipe's block, read by every routed row
      validation: {smol_math_val: math, smol_xml_val: xml, smol_math_xml_val: math+xml}
    variants: [experts, routed]             # or {name: r3, kind: routed, experts: [a, b, c], route: {...}}

A named row's `route:` keys replace the recipe's. The fitted λ and floors and, per task, the share of documents
that kept each set of experts are in the row's record, results.json and report.md.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from logitcomp.config import ROUTING_GATES, ROUTING_POOLS, ROUTING_SCORES

from .composed import ComposedKind, Floors, RouteOptions, Shrinkage
from .kind import Options

FIT_SHRINKAGES = [0.1, 1.0, 10.0]  # the λ a routed row chooses among (docs/routing.md)


class RoutedRoute(RouteOptions):
    """`RouteOptions` with the defaults of a `routed` row (the module's docstring)."""

    score: Literal[ROUTING_SCORES] = "discriminant"
    pool: Literal[ROUTING_POOLS] = "max"
    gates: Literal[ROUTING_GATES] = "binary"
    update: bool = False
    shrinkage: Shrinkage = Field(default_factory=lambda: list(FIT_SHRINKAGES))
    floors: Floors = "fit"


class RoutedOptions(Options):
    compose: dict[str, Any] = Field(default_factory=dict)
    route: RoutedRoute | None = None  # its keys replace the recipe's `route:` ones


class RoutedKind(ComposedKind):
    name = "routed"
    options = RoutedOptions
    default = False
    combines = True

    def route(self, spec, recipe) -> dict:
        own = spec.options.route.model_dump(exclude_unset=True) if spec.options.route else {}
        return RoutedRoute(**{**recipe.route.model_dump(exclude_unset=True), **own}).model_dump()

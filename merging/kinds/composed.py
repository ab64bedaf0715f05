"""The `composed` rows: every expert composed with the base in probability space (logitcomp).

A named row takes any `compose:` option (eos_policy, rule, rule_params, ...) over the recipe's block,
flat or under `compose:`; it sweeps λ (every expert's weight times λ) or a parameter of its rule.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import fields, replace
from typing import Any

from pydantic import Field

from logitcomp.config import CompositionConfig
from logitcomp.rules import get_rule

from ..errors import not_a_number
from .kind import SWEEP_KEY, Kind, Options, Variant

# `compose:` holds CompositionConfig's options; weights live with each expert, tracing is for `generate --trace`
COMPOSE_KEYS = tuple(f.name for f in fields(CompositionConfig) if f.name not in ("weights", "trace"))


def composition_config(compose: dict, weights: dict | None = None) -> CompositionConfig:
    """The CompositionConfig of a `compose:` block: the runtime's own checks, not a copy of them."""
    unknown = [k for k in compose if k not in COMPOSE_KEYS]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; allowed keys: {', '.join(COMPOSE_KEYS)}")
    if isinstance(compose.get("floor"), str):
        raise ValueError(f"floor: {not_a_number(compose['floor'])}")
    return CompositionConfig(**compose, weights=dict(weights or {}))


class ComposedOptions(Options):
    compose: dict[str, Any] = Field(default_factory=dict)


class ComposedKind(Kind):
    name = "composed"
    options = ComposedOptions
    default = True
    combines = True

    def normalise(self, data: dict) -> dict:
        flat = {k: v for k, v in data.items() if k in COMPOSE_KEYS}
        compose = {**(data.get("compose") or {}), **flat}
        return {k: v for k, v in data.items() if k not in COMPOSE_KEYS} | ({"compose": compose} if compose else {})

    def row(self, row: Variant, spec, recipe) -> Variant:
        own = spec.options.compose
        options = {**recipe.compose, **own}
        if "rule" in own and "rule_params" not in own:
            options["rule_params"] = {}  # the recipe's parameters belong to the recipe's rule
        if row.swept and row.swept[0] != SWEEP_KEY:
            key, value = row.swept
            rule = get_rule(options["rule"])
            if key not in rule.params:
                takes = ", ".join(rule.params) or "no parameters"
                raise ValueError(f"sweep: a composed variant sweeps {SWEEP_KEY} or a parameter of its rule {rule.name} ({takes}), got {key!r}")
            options["rule_params"] = {**options["rule_params"], key: value}
        return replace(row, config=composition_config(options, row.weights))

    @contextmanager
    def model(self, row: Variant, pool):
        from logitcomp import ComposedModelForCausalLM

        peft = pool.peft()
        full = {n: pool.full_expert(n) for n in row.experts if n not in pool.lora}
        sources = {"base": str(pool.paths.base), "full": {n: str(pool.paths.experts[n]) for n in full}}
        yield ComposedModelForCausalLM(peft if peft is not None else pool.base(), list(row.experts), full, row.config, sources)

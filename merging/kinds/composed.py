"""The `composed` rows: every expert composed with the base in probability space (logitcomp).

A named row takes any `compose:` option (eos_policy, rule, rule_params, ...) over the recipe's block,
flat or under `compose:`; it sweeps λ (every expert's weight times λ) or a parameter of its rule.
With `route:` its experts' weights are gated per position by hidden-state routing (`logitcomp.routing`):
each expert's centroid from prompts of its skill, by default the `prompts.jsonl` its trainer left in its
folder (one JSON object with a "prompt" string per line; the first `limit` are read); `score:
discriminant` detects each expert on its own (`shrinkage` λ of the covariance) instead of the cosine
posteriors; `pool: max` (with `score: discriminant`) detects each expert on single tokens, keeping each
detector's maximum over the tokens so far; `floors` (expert -> score) holds an expert's detector to its own bar;
`gates: binary` composes the kept experts at their full weights; `set_weights` (a list of {experts, weight})
multiplies the gates where exactly those experts are kept by the weight (a pair's validated λ);
`update: false` holds the prompt's gates while decoding; it then also sweeps `tau`, `threshold` or `shrinkage`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import fields, replace
from typing import Annotated, Any, Literal

from pydantic import Field

from logitcomp.config import MAX_WEIGHT, ROUTING_GATES, ROUTING_POOLS, ROUTING_SCORES, CompositionConfig, check_set_weights
from logitcomp.rules import get_rule

from ..errors import not_a_number, unknown_key
from .kind import SWEEP_KEY, Kind, Options, Variant

# `compose:` holds CompositionConfig's options; weights live with each expert, tracing is for `generate --trace`,
# routing's centroids are computed from a row's `route:` prompts
COMPOSE_KEYS = tuple(f.name for f in fields(CompositionConfig) if f.name not in ("weights", "trace", "routing"))
ROUTE_SWEEPS = ("tau", "threshold", "shrinkage")
PROMPTS_FILE = "prompts.jsonl"  # an expert's own routing prompts, in its folder


def composition_config(compose: dict, weights: dict | None = None) -> CompositionConfig:
    """The CompositionConfig of a `compose:` block: the runtime's own checks, not a copy of them."""
    unknown = [k for k in compose if k not in COMPOSE_KEYS]
    if unknown:
        raise ValueError(unknown_key(unknown[0], COMPOSE_KEYS))
    if isinstance(compose.get("floor"), str):
        raise ValueError(f"floor: {not_a_number(compose['floor'])}")
    return CompositionConfig(**compose, weights=dict(weights or {}))


class SetWeight(Options):
    """One kept set of experts and the factor of its gates (`logitcomp.routing`'s set_weights)."""

    experts: list[str] = Field(min_length=1)
    weight: float = Field(ge=-MAX_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)


class RouteOptions(Options):
    """Hidden-state routing of a composed row (`logitcomp.routing`)."""

    prompts: dict[str, str] = Field(default_factory=dict)  # expert -> JSONL of prompts (relative to the recipe); default: its prompts.jsonl
    tau: float = Field(default=0.1, gt=0, le=100, allow_inf_nan=False)
    threshold: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    score: Literal[ROUTING_SCORES] = "cosine"  # cosine posteriors of centroids, or per-expert discriminant detectors
    shrinkage: float = Field(default=1.0, gt=0, le=1e6, allow_inf_nan=False)  # λ of the discriminant's covariance
    gates: Literal[ROUTING_GATES] = "scaled"  # a kept expert's gate: its evidence over the top one's, or 1
    update: bool = True  # false: decoding holds the gates of the prompt
    pool: Literal[ROUTING_POOLS] = "mean"  # the detectors read the mean hidden state so far, or each token (their maximum)
    # expert -> the detector score it needs to count as evidence (score discriminant; chosen on validation prompts)
    floors: dict[str, Annotated[float, Field(allow_inf_nan=False)]] = Field(default_factory=dict)
    # where the gates keep exactly these experts, their gates times the weight (chosen on validation prompts)
    set_weights: list[SetWeight] = Field(default_factory=list)
    limit: int = Field(default=200, ge=1)


class ComposedOptions(Options):
    compose: dict[str, Any] = Field(default_factory=dict)
    route: RouteOptions | None = None


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
        route = spec.options.route.model_dump() if spec.options.route else None
        if row.swept and row.swept[0] != SWEEP_KEY:
            key, value = row.swept
            rule = get_rule(options["rule"])
            if route and key in ROUTE_SWEEPS:
                route[key] = value
                RouteOptions(**route)  # the swept value in range
            elif key not in rule.params:
                takes = ", ".join([*rule.params, *(ROUTE_SWEEPS if route else ())]) or "no parameters"
                raise ValueError(f"sweep: a composed variant sweeps {SWEEP_KEY} or a parameter of its rule {rule.name} ({takes}), got {key!r}")
            else:
                options["rule_params"] = {**options["rule_params"], key: value}
        if route:
            if route["pool"] == "max" and route["score"] != "discriminant":
                raise ValueError("route.pool: max needs score: discriminant (token-level detectors), got score: cosine")
            if route["floors"] and route["score"] != "discriminant":
                raise ValueError("route.floors: need score: discriminant (a floor is a detector's score), got score: cosine")
            for key in ("prompts", "floors"):
                if unknown := sorted(set(route[key]) - set(row.experts)):
                    raise ValueError(f"route.{key}: {unknown[0]!r} is not an expert of this row; its experts are {list(row.experts)}")
            route["set_weights"] = check_set_weights(route["set_weights"], list(row.experts), "route.set_weights")
        return replace(row, config=composition_config(options, row.weights), parameters={"route": route} if route else {})

    def check(self, rows: list[Variant], recipe, paths) -> None:
        for row in rows:
            for name, path in _prompt_files(row, paths).items():
                if isinstance(path, str):
                    continue  # an expert on the hub: its prompts are read once it is fetched
                if not path.is_file():
                    raise ValueError(f"variants: {row.family or row.name}: route.prompts.{name}: {path} is not a file "
                                     f"(a JSONL of {{\"prompt\": ...}} lines; an expert's default is its {PROMPTS_FILE})")

    @contextmanager
    def model(self, row: Variant, pool):
        from logitcomp import ComposedModelForCausalLM
        from logitcomp.routing import routing_config

        peft = pool.peft()
        full = {n: pool.full_expert(n) for n in row.experts if n not in pool.lora}
        sources = {"base": str(pool.paths.base), "full": {n: str(pool.paths.experts[n]) for n in full}}
        config = row.config
        if row.parameters.get("route"):
            route = row.parameters["route"]
            states = pool.prompt_states(_prompt_files(row, pool.paths), route["limit"], route["pool"])
            config = config.with_routing(routing_config(states, route["tau"], route["threshold"], route["score"],
                                                        route["shrinkage"], route["gates"], route["update"], route["pool"],
                                                        route["floors"], route["set_weights"]))
        yield ComposedModelForCausalLM(peft if peft is not None else pool.base(), list(row.experts), full, config, sources)


def _prompt_files(row: Variant, paths) -> dict:
    """Expert -> the JSONL of its routing prompts (a hub expert's default stays a string until fetched)."""
    route = row.parameters.get("route")
    if not route:
        return {}
    own = {n: (paths.root / p).resolve() for n, p in route["prompts"].items()}
    default = lambda n: paths.experts[n] if isinstance(paths.experts[n], str) else paths.experts[n] / PROMPTS_FILE  # noqa: E731
    return {n: own.get(n) or default(n) for n in row.experts}

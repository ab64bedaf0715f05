"""The `composed` rows: every expert composed with the base in probability space (logitcomp).

A named row takes any `compose:` option (eos_policy, rule, rule_params, ...) over the recipe's block,
flat or under `compose:`; it sweeps λ (every expert's weight times λ) or a parameter of its rule.
With `route:` its experts' weights are gated per position by hidden-state routing (`logitcomp.routing`):
each expert's centroid from its example prompts (`route.prompts`, else the recipe's `experts.NAME.prompts`, else
the `prompts.jsonl` its trainer left in its folder: a JSONL file of {"prompt": ...} lines, a list, or `{task:
NAME}`; the first `limit`); `score:
discriminant` detects each expert on its own (`shrinkage` λ of the covariance) instead of the cosine
posteriors; `pool: max` (with `score: discriminant`) detects each expert on single tokens, keeping each
detector's maximum over the tokens so far; `floors` (expert -> score) holds an expert's detector to its own bar;
`gates: binary` composes the kept experts at their full weights; `set_weights` (a list of {experts, weight})
multiplies the gates where exactly those experts are kept by the weight (a pair's validated λ);
`update: false` holds the prompt's gates while decoding; `floors: fit` fits the floors (and λ among a list of
`shrinkage` values) in the run on the `validation` tasks' prompts (`logitcomp.routing_fit`; the `routed` kind's
default). A routed row also sweeps `tau`, `threshold` or `shrinkage`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from logitcomp.config import MAX_WEIGHT, ROUTING_GATES, ROUTING_POOLS, ROUTING_SCORES, CompositionConfig, check_set_weights
from logitcomp.prompts import PROMPTS_FILE, read_prompts
from logitcomp.rules import get_rule

from ..errors import not_a_number, unknown_key
from .kind import SWEEP_KEY, Kind, Options, Variant

# `compose:` holds CompositionConfig's options; weights live with each expert, tracing is for `generate --trace`,
# routing's centroids are computed from a row's `route:` prompts
COMPOSE_KEYS = tuple(f.name for f in fields(CompositionConfig) if f.name not in ("weights", "trace", "routing"))
ROUTE_SWEEPS = ("tau", "threshold", "shrinkage")


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


class TaskPrompts(Options):
    """An lm-eval task whose documents' prompts (lm-eval's contexts) are an expert's example prompts."""

    task: str


# an expert's example prompts: a JSONL file of {"prompt": ...} lines (relative to the recipe), a list, or a task's
PromptSource = str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | TaskPrompts


_Lambda = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
Shrinkage = _Lambda | Annotated[list[_Lambda], Field(min_length=1)]
Floors = dict[str, Annotated[float, Field(allow_inf_nan=False)]] | Literal["fit"]


def _needs(value):
    """A validation task's experts: `a+b` or [a, b] -> [a, b]."""
    return value.split("+") if isinstance(value, str) else value


class RouteOptions(Options):
    """Hidden-state routing of a composed row (`logitcomp.routing`)."""

    prompts: dict[str, PromptSource] = Field(default_factory=dict)  # expert -> its example prompts; default: the expert's
    tau: float = Field(default=0.1, gt=0, le=100, allow_inf_nan=False)
    threshold: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    score: Literal[ROUTING_SCORES] = "cosine"  # cosine posteriors of centroids, or per-expert discriminant detectors
    shrinkage: Shrinkage = 1.0  # λ of the discriminant's covariance; a list: the candidates `floors: fit` chooses among
    gates: Literal[ROUTING_GATES] = "scaled"  # a kept expert's gate: its evidence over the top one's, or 1
    update: bool = True  # false: decoding holds the gates of the prompt
    pool: Literal[ROUTING_POOLS] = "mean"  # the detectors read the mean hidden state so far, or each token (their maximum)
    # expert -> the detector score it needs to count as evidence (score discriminant), or `fit`: chosen in the run on
    # the `validation` tasks' prompts (none: on each expert's own prompts), with λ among `shrinkage`'s values
    floors: Floors = Field(default_factory=dict)
    # lm-eval task -> the experts its prompts need (`math`, `math+xml` or a list): what `floors: fit` is fitted on
    validation: dict[str, Annotated[list[str], Field(min_length=1)] | str] = Field(default_factory=dict)
    # where the gates keep exactly these experts, their gates times the weight (chosen on validation prompts)
    set_weights: list[SetWeight] = Field(default_factory=list)
    limit: int = Field(default=200, ge=1)  # the first `limit` example prompts of each expert


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

    def route(self, spec, recipe) -> dict | None:
        """The row's `route:` options (None: not routed)."""
        return spec.options.route.model_dump() if spec.options.route else None

    def row(self, row: Variant, spec, recipe) -> Variant:
        own = spec.options.compose
        options = {**recipe.compose, **own}
        if "rule" in own and "rule_params" not in own:
            options["rule_params"] = {}  # the recipe's parameters belong to the recipe's rule
        route = self.route(spec, recipe)
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
            fitting = route["floors"] == "fit"
            if isinstance(route["shrinkage"], list) and len(route["shrinkage"]) > 1 and not fitting:
                raise ValueError("route.shrinkage: a list of values is chosen among by `floors: fit`; give one value or fit the floors")
            if route["validation"] and not fitting:
                raise ValueError("route.validation: its tasks fit the floors; add `floors: fit`")
            route["validation"] = {task: _needs(need) for task, need in route["validation"].items()}
            needed = [e for need in route["validation"].values() for e in need]
            for key, names in (("prompts", route["prompts"]), ("floors", {} if fitting else route["floors"]), ("validation", needed)):
                if unknown := sorted(set(names) - set(row.experts)):
                    raise ValueError(f"route.{key}: {unknown[0]!r} is not an expert of this row; its experts are {list(row.experts)}")
            route["set_weights"] = check_set_weights(route["set_weights"], list(row.experts), "route.set_weights")
        return replace(row, config=composition_config(options, row.weights), parameters={"route": route} if route else {})

    def check(self, rows: list[Variant], recipe, paths) -> None:
        for row in rows:
            for field, path in self.input_files(row, paths).items():  # every line read: an empty file or a wrong key is refused now
                read_prompts(f"variants: {row.family or row.name}: {field}", path)

    def input_files(self, row: Variant, paths) -> dict[str, Path]:
        if not row.parameters.get("route"):
            return {}
        return {f"the example prompts of {n}": s for n, s in prompt_sources(row, paths).items() if isinstance(s, Path)}

    def tasks(self, row: Variant) -> list[str]:
        """The lm-eval tasks a row reads besides evaluate.tasks: its validation tasks and example-prompt tasks."""
        route = row.parameters.get("route") or {}
        own = [p["task"] for p in route.get("prompts", {}).values() if isinstance(p, dict)]
        return [*route.get("validation", {}), *own]

    @contextmanager
    def model(self, row: Variant, pool):
        from logitcomp import ComposedModelForCausalLM
        from logitcomp.routing_fit import fitted_routing

        peft = pool.peft()
        full = {n: pool.full_expert(n) for n in row.experts if n not in pool.lora}
        sources = {"base": str(pool.paths.base), "full": {n: str(pool.paths.experts[n]) for n in full}}
        config = row.config
        route = row.parameters.get("route")
        if route:
            fitting = route["floors"] == "fit"
            states = pool.prompt_states(prompt_sources(row, pool.paths), route["limit"], "max" if fitting else route["pool"])
            labelled = {task: (pool.task_states(task), need) for task, need in route["validation"].items()}
            routing, fit = fitted_routing(states, route["tau"], route["threshold"], route["score"], route["shrinkage"],
                                          route["gates"], route["update"], route["pool"], route["floors"],
                                          route["set_weights"], labelled)
            pool.fits[row.name] = fit
            config = config.with_routing(routing)
        yield ComposedModelForCausalLM(peft if peft is not None else pool.base(), list(row.experts), full, config, sources)

    def export(self, row: Variant, pool, out: Path, self_contained: bool = False) -> dict | None:
        with self.model(row, pool) as model:
            model.save_pretrained(out, self_contained=self_contained)
        return pool.fits.get(row.name)

    def describe(self, row: Variant, model, pool, outputs: Path) -> dict:
        """A routed row's routing: what was fitted in the run, and per task the share of documents per kept set."""
        if not row.parameters.get("route"):
            return {}
        from ..harness.evaluate import sample_contexts

        experts = list(row.experts)
        kept = {task: pool.kept_sets(model.composition.routing, experts, contexts)
                for task, contexts in sample_contexts(outputs).items()}
        return {"routing": {"fit": pool.fits.get(row.name), "kept": kept}}


def prompt_sources(row: Variant, paths) -> dict:
    """Expert -> its example prompts: the row's `route.prompts`, else `expert_prompts`'."""
    return expert_prompts(row.experts, paths, row.parameters["route"]["prompts"])


def expert_prompts(experts, paths, own: dict | None = None) -> dict:
    """Expert -> its example prompts: `own`'s, else the recipe's `experts.NAME.prompts`, else the `prompts.jsonl` in
    its folder (a file as a Path; a hub expert's stays a string until fetched), a list of strings or {"task": NAME}."""
    out = {}
    for name in experts:
        source = (own or {}).get(name) or paths.prompts.get(name)
        if source is None:
            folder = paths.experts[name]
            source = folder if isinstance(folder, str) else folder / PROMPTS_FILE
        elif isinstance(source, str):
            source = (paths.root / source).resolve()
        out[name] = source
    return out

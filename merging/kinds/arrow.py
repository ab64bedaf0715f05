"""The `arrow` rows: peft's own Arrow routing over the LoRA experts (`peft.create_arrow_model`), what a
peft user would pick instead of a composition. Per token and layer, Arrow scores each adapter's top
right-singular direction against the hidden state and mixes the `top_k` best adapters' updates with
softmax(score / router_temperature) coefficients, from the adapters' weights alone (no training).

A named row takes `top_k` (default: peft's 3, at most the number of experts), `router_temperature`
and `rng_seed` (peft's ArrowConfig fields) and sweeps either of the first two; `variants: [arrow]`
is the row with these defaults. Every expert must be a LoRA adapter, all of one rank and one set of target
modules (peft's own requirement, checked here before a model loads).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

from pydantic import Field

from logitcomp.inputs import check_adapter_config, expert_kind

from .kind import Kind, Options, Variant

SWEEPS = ("top_k", "router_temperature")


class ArrowOptions(Options):
    top_k: int | None = Field(default=None, ge=1)  # None: peft's default 3, at most the number of experts
    router_temperature: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    rng_seed: int = 0  # seeds the power iteration for each adapter's top direction (peft's None is unseeded): repeatable runs


class ArrowKind(Kind):
    name = "arrow"
    options = ArrowOptions
    combines = True

    def check_sweep(self, key: str) -> str | None:
        return None if key in SWEEPS else f"sweep: an arrow variant sweeps {' or '.join(SWEEPS)}, got {key!r}"

    def row(self, row: Variant, spec, recipe) -> Variant:
        parameters = spec.options.model_dump()
        if row.swept:
            key, value = row.swept
            if (key == "top_k" and value != int(value)) or value <= 0:
                raise ValueError(f"sweep: {key} takes {'whole numbers >= 1' if key == 'top_k' else 'numbers > 0'}, got {value:g}")
            parameters[key] = int(value) if key == "top_k" else value
        experts = len(row.experts)
        if parameters["top_k"] is None:
            parameters["top_k"] = min(3, experts)
        if parameters["top_k"] > experts:
            raise ValueError(f"top_k: {parameters['top_k']} is more than the {experts} experts Arrow routes between")
        return replace(row, parameters=parameters, weights={})

    def check(self, rows: list[Variant], recipe, paths) -> None:
        seen = {}
        for name, path in ((n, paths.experts[n]) for n in dict.fromkeys(n for row in rows for n in row.experts)):
            if isinstance(path, str):
                continue  # a hub reference, checked by peft once fetched
            if expert_kind(name, path) != "lora":
                raise ValueError(f"variants: {rows[0].family or rows[0].name}: peft's Arrow routes LoRA experts only; {name} is a full model")
            config = check_adapter_config(f"experts.{name}", path)
            targets = config.get("target_modules")
            seen[name] = (config.get("r"), tuple(sorted(targets)) if isinstance(targets, list) else targets)
        first = next(iter(seen.items()), None)
        other = next(((n, s) for n, s in seen.items() if s != first[1]), None) if first else None
        if other:
            raise ValueError(f"variants: {rows[0].family or rows[0].name}: peft's Arrow needs LoRA experts of one rank and one set of "
                             f"target modules; {first[0]} has r={first[1][0]} on {first[1][1]}, {other[0]} r={other[1][0]} on {other[1][1]}")

    @contextmanager
    def model(self, row: Variant, pool):
        from peft import ArrowConfig, create_arrow_model

        config = ArrowConfig(**row.parameters)
        paths = [str(pool.paths.experts[n]) for n in row.experts]
        yield create_arrow_model(pool.load("base", pool.paths.base), paths, config).eval()

    def export(self, row: Variant, pool, out, self_contained: bool = False) -> None:
        from logitcomp.persistence import save_arrow

        save_arrow(out, pool.paths.base, {n: pool.paths.experts[n] for n in row.experts}, row.parameters, self_contained)

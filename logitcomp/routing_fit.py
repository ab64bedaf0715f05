"""Routing fitted to a composition's experts (`fit_routing`, `fitted_routing`): from each expert's example prompts,
`logitcomp.routing`'s centroids or detectors, and with `floors="fit"` the detectors' shrinkage λ and each expert's
floor, chosen where the kept experts agree best with the experts each labelled prompt needs.

A labelled set is prompts with the experts they need: a validation task's prompts (`{"math": ...}` one skill,
`math+xml` two), or by default each expert's own example prompts (it alone). For every candidate λ:

    detectors   fitted on the experts' example prompts (`routing_config`, score "discriminant", no floors)
    z           each labelled prompt's score (n, k): pool "max" the maximum over its tokens, "mean" of its mean
    floor f_i   the value maximising the mean over the labelled sets of the share of prompts on which z_i > f_i
                agrees with "the set needs expert i" (candidates: midpoints between consecutive observed scores
                and one below them all; ties: the candidate nearest 0.5, halfway between others' and its own)
    exact       the mean over the labelled sets of the share of prompts whose kept experts (binary gates at the
                threshold, the floors applied) are exactly the ones the set needs

and the λ of the highest mean exact is taken (ties: the largest λ, the most shrunk covariance).
"""

from __future__ import annotations

import torch

from .prompts import as_prompts
from .routing import Router, expert_prompt_states, prompt_tokens, routing_config, threshold_gates


def prompt_scores(routing: dict, experts: list[str], tokens: list[torch.Tensor]) -> torch.Tensor:
    """The detectors' scores z (n, k) of prompts given as their token states (a list of (T_i, d)): the maximum
    over the tokens (pool "max") or the score of the tokens' mean."""
    router = Router.from_config(routing, experts)
    if routing["pool"] == "max":
        return torch.stack([router.scores(h).amax(0) for h in tokens])  # (n, k)
    return router.scores(torch.stack([h.mean(0) for h in tokens]))  # (n, k)


def prompt_gates(routing: dict, experts: list[str], tokens: list[torch.Tensor]) -> torch.Tensor:
    """The gates (n, k) a routed composition gives each prompt (token states (T_i, d)) at its last token: the
    router's own step over the prompt's tokens (floors, threshold, binary gates and set weights included)."""
    router = Router.from_config(routing, experts)
    return torch.cat([router.step_gates(h[None].float(), None, None, 1)[0][:, 0] for h in tokens])  # (n, k)


def fit_floors(scores: dict[str, torch.Tensor], wanted: dict[str, list[int]], experts: list[str]) -> dict[str, float]:
    """Expert -> its floor (the module's formula) from each labelled set's scores (n, k) and the indices of the
    experts it needs."""
    floors = {}
    for i, name in enumerate(experts):
        values = torch.cat([scores[s][:, i] for s in scores]).unique()  # sorted
        candidates = torch.cat([values[:1] - 1, (values[1:] + values[:-1]) / 2])  # (c,)
        agree = torch.stack([((scores[s][:, i, None] > candidates) == (i in wanted[s])).float().mean(0) for s in scores]).mean(0)  # (c,)
        best = candidates[agree == agree.max()]
        floors[name] = round(float(best[(best - 0.5).abs().argmin()]), 4)
    return floors


def exact_shares(scores: dict[str, torch.Tensor], wanted: dict[str, list[int]], floors: list[float],
                 threshold: float) -> dict[str, float]:
    """Labelled set -> the share of its prompts whose kept experts are exactly the ones it needs."""
    floor = torch.tensor(floors, dtype=torch.float32)  # (k,)
    out = {}
    for name, z in scores.items():
        kept = threshold_gates((z.float() - floor).clamp(min=0), threshold) > 0  # (n, k)
        need = torch.zeros(z.shape[-1], dtype=torch.bool)
        need[wanted[name]] = True
        out[name] = round(float((kept == need).all(-1).float().mean()), 4)
    return out


def fit(states: dict[str, list[torch.Tensor]], labelled: dict[str, tuple[list[torch.Tensor], list[str]]],
        shrinkages: list[float], pool: str = "max", threshold: float = 0.0) -> dict:
    """The λ and floors of the module's formula.

    Args:
        states: expert -> its example prompts' token states (a list of (T_i, d)), the experts in routing order.
        labelled: set name -> (its prompts' token states, the experts it needs).
        shrinkages: the candidate λ.
        pool: "max" (token-level detectors) or "mean".
    Returns:
        {"shrinkage": λ, "floors": {expert: f}, "exact": {set: share} at λ, "candidates": {λ: mean exact}}.
    """
    experts = list(states)
    unknown = sorted({e for _, need in labelled.values() for e in need} - set(experts))
    if unknown:
        raise ValueError(f"routing fit: {unknown[0]!r} is not a routed expert; expected names from {experts}")
    wanted = {name: [experts.index(e) for e in need] for name, (_, need) in labelled.items()}
    pooled = states if pool == "max" else {e: torch.stack([h.mean(0) for h in hs]) for e, hs in states.items()}  # (n_e, d) means
    fitted = {}
    for value in shrinkages:
        routing = routing_config(pooled, score="discriminant", shrinkage=value, pool=pool)
        scores = {name: prompt_scores(routing, experts, tokens) for name, (tokens, _) in labelled.items()}
        floors = fit_floors(scores, wanted, experts)
        exact = exact_shares(scores, wanted, [floors[e] for e in experts], threshold)
        fitted[value] = {"shrinkage": value, "floors": floors, "exact": exact}
    means = {value: sum(f["exact"].values()) / len(f["exact"]) for value, f in fitted.items()}
    best = max(means.values())
    chosen = max(value for value, mean in means.items() if mean == best)
    return fitted[chosen] | {"candidates": {f"{value:g}": round(mean, 4) for value, mean in means.items()}}


def fit_routing(composed, tokenizer, prompts: dict, tau: float = 0.1, threshold: float = 0.0,
                batch_size: int = 8, score: str = "cosine", shrinkage: float | list[float] = 1.0, gates: str = "scaled",
                update: bool = True, pool: str = "mean", floors: dict[str, float] | str | None = None,
                set_weights: list[dict] | None = None, validation: dict[str, tuple] | None = None) -> dict | None:
    """Route `composed` (a `ComposedModelForCausalLM`) by the hidden states of these prompts (expert name ->
    its example prompts: a list of strings or the path of a JSONL file of `{"prompt": ...}` lines, every composed
    expert), computed by its base with the adapters disabled: cosine posteriors of centroids, or (score
    "discriminant") per-expert detectors of the prompts' mean or (`pool` "max") of their tokens (each read less its
    expert's floor in `floors`), with `gates` "scaled" or "binary" (a kept expert at its full weight), `update`
    False to hold the prompt's gates while decoding, and `set_weights` ([{"experts": [...], "weight": λ_S}]: the
    gates where exactly those experts are kept times λ_S); sets its `composition.routing` (saved with it by
    `save_pretrained`).

    `floors="fit"` (score "discriminant") fits the floors, and with a list of `shrinkage` values λ too, on
    labelled prompts (`logitcomp.routing_fit`): `validation` ({name: (prompts, [experts it needs])}), by default
    each expert's own prompts. Returns the fit ({"shrinkage", "floors", "exact", "candidates"}), else None.

    Raises:
        TypeError: `prompts` not a mapping, or an expert's prompts neither a list nor a path (never read as characters).
    """
    from contextlib import nullcontext

    from peft import PeftModel

    if not isinstance(prompts, dict):
        raise TypeError(f"prompts: expected a mapping of expert name -> its prompts, got {type(prompts).__name__}")
    texts = {name: as_prompts(f"prompts[{name!r}]", value) for name, value in prompts.items()}
    labelled = {name: (as_prompts(f"validation[{name!r}]", p), list(need)) for name, (p, need) in (validation or {}).items()}
    if validation and floors != "fit":
        raise ValueError("validation: labelled prompts fit the floors; pass floors=\"fit\" with them")
    tokens = floors == "fit" or pool == "max"
    with composed.model.disable_adapter() if isinstance(composed.model, PeftModel) else nullcontext():
        base = composed._hf_model
        states = expert_prompt_states(base, tokenizer, texts, batch_size, "max" if tokens else "mean")
        sets = {name: (prompt_tokens(base, tokenizer, p, batch_size), need) for name, (p, need) in labelled.items()}
    routing, result = fitted_routing(states, tau, threshold, score, shrinkage, gates, update, pool, floors, set_weights, sets)
    composed.composition = composed.composition.with_routing(routing)
    return result


def fitted_routing(states: dict[str, torch.Tensor | list[torch.Tensor]], tau: float = 0.1, threshold: float = 0.0,
                   score: str = "cosine", shrinkage: float | list[float] = 1.0, gates: str = "scaled", update: bool = True,
                   pool: str = "mean", floors: dict[str, float] | str | None = None, set_weights: list[dict] | None = None,
                   labelled: dict[str, tuple[list[torch.Tensor], list[str]]] | None = None) -> tuple[dict, dict | None]:
    """`routing_config`, with `floors="fit"` the floors and λ fitted first (`logitcomp.routing_fit.fit`) on the
    `labelled` prompts' token states ({name: (a list of (T_i, d), [experts it needs])}; none: each expert's own
    prompts). `states`: each expert's prompts' token states (a list of (T_i, d)), or without fitting and with pool
    "mean" their means (n_i, d). Returns (the routing, the fit or None)."""
    fitting = floors == "fit"
    if isinstance(floors, str) and not fitting:
        raise ValueError(f"floors: expected a mapping of expert -> floor or \"fit\", got {floors!r}")
    if fitting and score != "discriminant":
        raise ValueError("floors: \"fit\" needs score \"discriminant\" (a floor is a detector's score)")
    shrinkages = list(shrinkage) if isinstance(shrinkage, (list, tuple)) else [shrinkage]
    if len(shrinkages) != 1 and not fitting:
        raise ValueError("shrinkage: a list of values is chosen among by floors=\"fit\"; give one value or fit the floors")
    result = None
    if fitting:
        own = {f"prompts[{n!r}]": (hs, [n]) for n, hs in states.items()}
        result = fit(states, labelled or own, shrinkages, pool, threshold)
        floors, shrinkages = result["floors"], [result["shrinkage"]]
    if pool != "max":
        states = {n: torch.stack([h.mean(0) for h in hs]) if isinstance(hs, list) else hs for n, hs in states.items()}
    return routing_config(states, tau, threshold, score, shrinkages[0], gates, update, pool, floors, set_weights), result

"""Hidden-state routing: each expert's weight at each position scaled by a posterior over the experts,
from evidence the experts' training prompts leave in the base model, training-free and without task labels
at inference.

    h̄_t   = mean of h_s over the tokens s ≤ t of the row (padding left out)    h_s: the base's last hidden state
    s_i,t = cos(h̄_t − μ, c_i − μ)                                              c_i: expert i's centroid, μ = mean_i c_i
    π_t   = softmax_i(s_i,t / τ)
    g_i,t = π_i,t / max_j π_j,t   where π_i,t ≥ θ · max_j π_j,t, else 0

and the composition rule runs with weights w_i · g_i,t. A centroid is the mean h̄ (at the last token) of
prompts of the expert's skill, e.g. a sample of its training prompts (`routing_config`). Centring on μ
removes the direction every prompt shares (mean-pooled hidden states are all close in cosine).

With `detectors` (score "discriminant", `discriminants`) each expert is detected on its own instead of the
experts competing in one softmax, so a prompt that needs two skills can keep both:

    z_i,t = (h̄_t − μ) · v_i − o_i        v_i = Σ_λ⁻¹ (c_i − μ) / s_i,  Σ_λ = Σ + λ · mean(diag Σ) · I
    g_i,t = z⁺_i,t / max_j z⁺_j,t  where z⁺_i,t > 0 and z⁺_i,t ≥ θ · max_j z⁺_j,t, else 0       z⁺ = max(z, 0)

Σ is the experts' prompts' pooled within-expert covariance (the linear discriminant of Gaussian classes
with one shared covariance, shrunk by λ), and s_i, o_i scale z_i to 1 on average over expert i's prompts
and 0 over the other experts' prompts. Whitening by Σ weighs the directions that tell the experts'
prompts apart (an instruction, "Answer in XML:") over those their content varies along. No expert
detected (every z ≤ 0) gives every gate 0: the product rule is then the base.

With `floors` (expert -> f_i, chosen on validation prompts) each detector is read less its floor, z_i − f_i in
place of z_i above and below: expert i is evidence only where z_i > f_i, so that an expert whose detector fires a
little on the other experts' prompts (a style instruction's shared words) can be held to a higher bar than the
others; with θ = 0 and binary gates, exactly the experts above their floors are composed.

With `gates: binary` every kept expert's gate is 1 (g_i,t = 1 where the rule above keeps expert i, else 0): the
experts the evidence keeps are composed at their full weights, as a composition of exactly those experts.

With `set_weights` (a set of experts S -> λ_S, chosen on validation prompts that need those skills together) the
gates of a position whose kept set is exactly S are multiplied by λ_S:

    g_i,t ← λ_S · g_i,t   where {j : g_j,t > 0} = S

so that where the evidence keeps several experts they are composed at the weight a composition of those experts
alone validates (the 2-expert composition at its validated λ), while a position that keeps any other set, one
expert alone included, is left as it is. λ_S = 1 for every S leaves the gates unchanged.

With `pool: max` (detectors only) each detector reads single tokens instead of the running mean, and an expert
is kept from the first token that shows its skill on (an instruction "Answer in XML" at the end of a word problem
is a few tokens of a long prompt, and its evidence would be averaged away):

    z_i,t = max_{s ≤ t} (h_s − μ) · v_i − o_i        (padding left out)

with v_i, o_i fitted on every token of the experts' prompts (each token labelled with its prompt's expert) and
rescaled so that the maximum over a prompt's tokens is 1 on average over expert i's prompts and 0 over the other
experts' (`peak_detectors`); the gates follow from z as above.

With `update: false` the gates stop following the tokens a model generates: a forward that continues a cache
(each decoding step of `generate`) uses the gates of the mean (with `pool: max`, the maximum) over the tokens of the
cache's first forward (the prompt), the prompt posterior of Branch-Train-Merge without its per-token update. A sequence scored in one
forward is routed position by position as above either way (each position's prefix is its prompt), so with
`update: false` a generated token's decoding log-probs are those of the prompt's gates, not of its prefix's.

Reductions: all posteriors equal → every g = 1 → the rule with its fixed weights; one expert certain
(π = e_j) → only expert j applies (with the product rule and w_j = 1, exactly expert j). θ = 1 keeps
only the top expert at each position. The running mean and maximum are causal, so (with `update`, the default) scoring a
sequence in one forward and decoding it token by token through the cache give the same gates.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F

from .config import ROUTING_POOLS, ROUTING_SCORES

# a row's tokens so far: pool "mean": (sum of hidden states (B, d), token count (B, 1)); "max": each detector's maximum (B, k)
RouteState = tuple[torch.Tensor, torch.Tensor] | torch.Tensor


class Router(torch.nn.Module):
    """The gates of `CompositionConfig.routing` (centroids in the composition's expert order), on the model's device."""

    def __init__(self, centroids: torch.Tensor, tau: float, threshold: float,
                 detectors: tuple[torch.Tensor, torch.Tensor] | None = None, binary: bool = False, update: bool = True,
                 pool: str = "mean", set_weights: tuple[torch.Tensor, torch.Tensor] | None = None):
        """`detectors`: None (cosine posteriors), or (v (k, d), o (k,)) of the discriminant scores; `binary`: a
        kept expert's gate is 1 instead of its evidence over the top one's; `update`: False holds the prompt's
        gates over the forwards that continue a cache; `pool` (ROUTING_POOLS): "max" scores each token with the
        detectors and keeps each one's running maximum; `set_weights`: None, or (sets (m, k) bool, λ (m,)), the
        distinct kept sets whose gates are multiplied by their λ."""
        super().__init__()
        if pool not in ROUTING_POOLS or (pool == "max" and detectors is None):
            raise ValueError(f"routing.pool: expected one of {list(ROUTING_POOLS)} (max with detectors), got {pool!r}")
        self.tau, self.threshold, self.binary, self.update, self.pool = tau, threshold, binary, update, pool
        centre = centroids.mean(0)  # (d,)
        # (k, d) unit directions of the centred centroids; a zero direction (a single expert) scores 0
        self.register_buffer("directions", F.normalize(centroids - centre, dim=-1), persistent=False)
        self.register_buffer("centre", centre, persistent=False)
        self.discriminant = detectors is not None
        if detectors is not None:
            self.register_buffer("detector_directions", detectors[0].to(centre.dtype), persistent=False)  # (k, d)
            self.register_buffer("detector_offsets", detectors[1].to(centre.dtype), persistent=False)  # (k,)
        sets, weights = set_weights if set_weights is not None else (torch.zeros(0, len(centroids), dtype=torch.bool), torch.zeros(0))
        self.register_buffer("sets", sets.bool(), persistent=False)  # (m, k)
        self.register_buffer("set_weights", weights.float(), persistent=False)  # (m,)

    @classmethod
    def from_config(cls, routing: dict, experts: list[str], dtype=torch.float32) -> Router:
        centroids = torch.tensor([routing["centroids"][e] for e in experts], dtype=dtype)  # (k, d)
        detectors = routing.get("detectors")
        if detectors is not None:
            detectors = (torch.tensor([detectors[e]["direction"] for e in experts], dtype=dtype),  # (k, d)
                         torch.tensor([detectors[e]["offset"] for e in experts], dtype=dtype))  # (k,)
        named = routing.get("set_weights", [])
        set_weights = (torch.tensor([[e in s["experts"] for e in experts] for s in named], dtype=torch.bool).view(len(named), len(experts)),  # (m, k)
                       torch.tensor([s["weight"] for s in named], dtype=torch.float32))  # (m,)
        return cls(centroids, routing["tau"], routing["threshold"], detectors, routing["gates"] == "binary", routing["update"],
                   routing["pool"], set_weights)

    def posterior(self, means: torch.Tensor) -> torch.Tensor:
        """π (..., k) from mean hidden states (..., d)."""
        x = F.normalize(means.to(self.centre.dtype) - self.centre, dim=-1)  # (..., d)
        return torch.softmax(x @ self.directions.T / self.tau, dim=-1)  # (..., k)

    def scores(self, means: torch.Tensor) -> torch.Tensor:
        """The detectors' scores z (..., k) from mean hidden states (..., d), before the clamp at 0."""
        return (means.to(self.centre.dtype) - self.centre) @ self.detector_directions.T - self.detector_offsets  # (..., k)

    def evidence(self, means: torch.Tensor) -> torch.Tensor:
        """Each expert's evidence (..., k) ≥ 0 from mean hidden states (..., d): π, or z⁺ with detectors."""
        return self.scores(means).clamp(min=0) if self.discriminant else self.posterior(means)

    def gates(self, means: torch.Tensor) -> torch.Tensor:
        """g (..., k) from mean hidden states (..., d): `threshold_gates` of the evidence, scaled by `set_weights`."""
        return scale_sets(threshold_gates(self.evidence(means), self.threshold, self.binary), self.sets, self.set_weights)

    def step_gates(self, hidden: torch.Tensor | None, mask: torch.Tensor | None, state: RouteState | None,
                   width: int) -> tuple[torch.Tensor, RouteState]:
        """The gates (B, width, k) of a forward's last `width` positions and the state to continue from.

        Args:
            hidden: (B, T, d) the forward's last hidden states; None holds the routing (`update: false`): every
                position takes the gates of `state` (the cache's first forward), left as it is.
            mask: (B, T) 1 on real tokens, 0 on padding (None: all real).
            state: the row's previous tokens (RouteState), None at its start.
        """
        if hidden is None:
            pooled = _held(state).unsqueeze(1).expand(-1, width, -1)  # (B, width, d or k)
        elif self.pool == "max":
            pooled, state = running_peaks(self.scores(hidden), mask, state)  # (B, T, k)
        else:
            pooled, state = running_means(hidden, mask, state)  # (B, T, d)
        pooled = pooled[:, -width:]
        evidence = pooled.clamp(min=0) if self.pool == "max" else self.evidence(pooled)  # (B, width, k): maxima are z already
        return scale_sets(threshold_gates(evidence, self.threshold, self.binary), self.sets, self.set_weights), state


def threshold_gates(evidence: torch.Tensor, threshold: float, binary: bool = False) -> torch.Tensor:
    """g (..., k) from evidence (..., k) ≥ 0: each evidence over the top one (binary: 1), 0 below θ · the top one
    and where an expert has no evidence (every gate 0 where no expert has any)."""
    top = evidence.amax(-1, keepdim=True)  # (..., 1)
    keep = (evidence >= threshold * top) & (evidence > 0)
    if binary:
        return keep.float()
    return torch.where(keep, evidence / top.clamp(min=torch.finfo(evidence.dtype).tiny), torch.zeros_like(evidence)).float()


def scale_sets(gates: torch.Tensor, sets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The gates (..., k) with each position whose kept set (gates > 0) is exactly sets[j] (m, k) multiplied by
    weights[j] (m,); the sets are distinct, so at most one matches a position."""
    if not len(sets):
        return gates
    match = ((gates > 0).unsqueeze(-2) == sets).all(-1).float()  # (..., m)
    return gates * (1.0 + match @ (weights - 1.0)).unsqueeze(-1)  # (..., k)


def running_means(hidden: torch.Tensor, mask: torch.Tensor | None, state: RouteState | None) -> tuple[torch.Tensor, RouteState]:
    """The mean hidden state over each row's tokens so far at every new position, and the state to continue from.

    Args:
        hidden: (B, T, d) the new positions' last hidden states.
        mask: (B, T) 1 on real tokens, 0 on padding (None: all real).
        state: the previous positions' (sum (B, d), count (B, 1)), None at a row's start.
    """
    hidden = hidden.float()
    real = torch.ones(hidden.shape[:2], device=hidden.device) if mask is None else mask.to(hidden.device, torch.float32)  # (B, T)
    sums = torch.cumsum(hidden * real.unsqueeze(-1), dim=1)  # (B, T, d)
    counts = torch.cumsum(real, dim=1).unsqueeze(-1)  # (B, T, 1)
    if state is not None:
        sums, counts = sums + state[0].unsqueeze(1), counts + state[1].unsqueeze(1)
    means = sums / counts.clamp(min=1.0)  # (B, T, d); a row of padding only so far: 0
    return means, (sums[:, -1], counts[:, -1])


def running_peaks(scores: torch.Tensor, mask: torch.Tensor | None, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each detector's maximum score over each row's tokens so far at every new position, and the state to continue from.

    Args:
        scores: (B, T, k) the new positions' detector scores z.
        mask: (B, T) 1 on real tokens, 0 on padding (None: all real).
        state: the previous positions' maxima (B, k), None at a row's start.
    """
    scores, length = scores.float(), scores.shape[1]
    if mask is not None:  # padding never raises a maximum (a row of padding only so far: -inf, no evidence)
        scores = scores.masked_fill(~mask.to(scores.device, torch.bool).unsqueeze(-1), float("-inf"))
    if state is not None:
        scores = torch.cat([state.unsqueeze(1), scores], dim=1)  # (B, 1 + T, k)
    peaks = torch.cummax(scores, dim=1).values[:, -length:]  # (B, T, k)
    return peaks, peaks[:, -1]


def _held(state: RouteState) -> torch.Tensor:
    """What a held routing routes by: the mean hidden state (B, d) or the detectors' maxima (B, k) of the state."""
    if isinstance(state, torch.Tensor):
        return state
    sums, counts = state
    return sums / counts.clamp(min=1.0)


def last_hidden(output) -> torch.Tensor:
    """The last hidden states (N, T, d) of a transformers forward called with `output_hidden_states=True`."""
    return output.hidden_states[-1]


@torch.no_grad()
def prompt_hidden(model, tokenizer, prompts: Iterable[str], batch_size: int = 8) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The prompts' last hidden states from `model`, batch by batch: (hidden (b, T, d), mask (b, T)), right-padded
    (id 0 under a zero mask: no pad token needed)."""
    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    if not encoded or not all(encoded):
        raise ValueError("prompts: expected at least one prompt, each of at least one token")
    device = next(model.parameters()).device
    for start in range(0, len(encoded), batch_size):
        rows = encoded[start:start + batch_size]
        width = max(map(len, rows))
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=device)  # (b, T)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=device)  # (b, T)
        # logits_to_keep=1: the head runs on one position only (the hidden states of every position are kept)
        yield last_hidden(model(input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=1)), mask


def prompt_means(model, tokenizer, prompts: Iterable[str], batch_size: int = 8) -> torch.Tensor:
    """Each prompt's mean last hidden state over its tokens (n, d) fp32, from `model` (the base: call it
    with the adapters disabled), batched by `prompt_hidden`."""
    out = []
    for hidden, mask in prompt_hidden(model, tokenizer, prompts, batch_size):
        means, _ = running_means(hidden, mask, None)  # (b, T, d)
        out.append(means[torch.arange(len(mask)), mask.sum(-1) - 1])  # (b, d): the mean at each row's last token
    return torch.cat(out)


def prompt_tokens(model, tokenizer, prompts: Iterable[str], batch_size: int = 8) -> list[torch.Tensor]:
    """Each prompt's last hidden states over its tokens (T_i, d) fp32, from `model`, batched by `prompt_hidden`."""
    return [h[m.bool()].float() for hidden, mask in prompt_hidden(model, tokenizer, prompts, batch_size) for h, m in zip(hidden, mask)]


def expert_prompt_states(model, tokenizer, prompts: dict[str, list[str]], batch_size: int = 8,
                         pool: str = "mean") -> dict[str, torch.Tensor | list[torch.Tensor]]:
    """Expert name -> what `routing_config` fits its routing on: `prompt_means` (n, d) of its prompts, or with
    `pool` "max" their `prompt_tokens` (a list of (T_i, d))."""
    states = prompt_tokens if pool == "max" else prompt_means
    return {name: states(model, tokenizer, texts, batch_size) for name, texts in prompts.items()}


def discriminants(means: dict[str, torch.Tensor], shrinkage: float = 1.0) -> dict[str, dict]:
    """Expert name -> {"direction": v_i, "offset": o_i} of the discriminant scores (see the module's formula)
    from each expert's prompt means (n_i, d), as `routing.detectors` takes them; computed in float64.

    Raises:
        ValueError: an expert whose prompts score no higher than the other experts' (nothing tells them apart).
    """
    names = list(means)
    x = {n: m.double() for n, m in means.items()}
    centroids = torch.stack([x[n].mean(0) for n in names])  # (k, d)
    centre = centroids.mean(0)  # (d,)
    if len(names) == 1:  # nothing to tell apart: the one expert is always detected (z = 1)
        return {names[0]: {"direction": [0.0] * centre.numel(), "offset": -1.0}}
    within = torch.cat([x[n] - centroids[i] for i, n in enumerate(names)])  # (N, d)
    cov = within.T @ within / len(within)  # (d, d)
    cov = cov + shrinkage * cov.diagonal().mean() * torch.eye(len(cov), dtype=cov.dtype)
    raw = torch.linalg.solve(cov, (centroids - centre).T).T  # (k, d): Σ_λ⁻¹ (c_i − μ)
    out = {}
    for i, name in enumerate(names):
        own = ((x[name] - centre) @ raw[i]).mean()
        other = torch.cat([(x[m] - centre) @ raw[i] for m in names if m != name]).mean()
        if not own > other:
            raise ValueError(f"routing: expert {name!r}'s prompts score no higher than the other experts' ({own:.3g} <= {other:.3g})")
        out[name] = {"direction": (raw[i] / (own - other)).tolist(), "offset": float(other / (own - other))}
    return out


def peak_detectors(tokens: dict[str, list[torch.Tensor]], shrinkage: float = 1.0) -> dict[str, dict]:
    """Expert name -> {"direction", "offset"} of the token-level detectors of `pool: max` from each expert's
    prompts' token states (a list of (T_i, d)): `discriminants` of every token, rescaled so that a prompt's
    maximum score is 1 on average over the expert's own prompts and 0 over the other experts' (a positive affine
    map commutes with the maximum, so the rescaled detector is still one direction and one offset).

    Raises:
        ValueError: an expert whose prompts' maxima score no higher than the other experts'.
    """
    flat = {n: torch.cat(ts) for n, ts in tokens.items()}  # (N_n, d): every token of the expert's prompts
    detectors = discriminants(flat, shrinkage)
    if len(tokens) == 1:
        return detectors
    names = list(tokens)
    centre = torch.stack([flat[n].double().mean(0) for n in names]).mean(0)  # (d,)
    v = torch.tensor([detectors[n]["direction"] for n in names], dtype=torch.float64)  # (k, d)
    o = torch.tensor([detectors[n]["offset"] for n in names], dtype=torch.float64)  # (k,)
    # each prompt's maximum score of every detector over its tokens: (n_m, k) per expert m
    peaks = {m: torch.stack([((t.double() - centre) @ v.T - o).amax(0) for t in ts]) for m, ts in tokens.items()}
    out = {}
    for i, name in enumerate(names):
        own, other = peaks[name][:, i].mean(), torch.cat([p[:, i] for m, p in peaks.items() if m != name]).mean()
        if not own > other:
            raise ValueError(f"routing: expert {name!r}'s prompts' maxima score no higher than the other experts' ({own:.3g} <= {other:.3g})")
        out[name] = {"direction": (v[i] / (own - other)).tolist(), "offset": float((o[i] + other) / (own - other))}
    return out


def with_floors(detectors: dict[str, dict], floors: dict[str, float]) -> dict[str, dict]:
    """The detectors with each named expert's score read less its floor, z_i − f_i (its offset raised by f_i), so
    that it is evidence only above f_i; an expert not named keeps floor 0."""
    if unknown := sorted(set(floors) - set(detectors)):
        raise ValueError(f"routing floors: {unknown[0]!r} is not a routed expert; expected names from {sorted(detectors)}")
    return {n: {"direction": d["direction"], "offset": d["offset"] + float(floors.get(n, 0.0))} for n, d in detectors.items()}


def routing_config(states: dict[str, torch.Tensor | list[torch.Tensor]], tau: float = 0.1, threshold: float = 0.0,
                   score: str = "cosine", shrinkage: float = 1.0, gates: str = "scaled", update: bool = True,
                   pool: str = "mean", floors: dict[str, float] | None = None,
                   set_weights: list[dict] | None = None) -> dict:
    """`CompositionConfig.routing` from each expert's prompts (`expert_prompt_states`: their means (n_i, d), or with
    `pool` "max" their token states): centroids, τ, θ, the gates' kind (ROUTING_GATES), whether decoding updates
    them, the pooling, with score "discriminant" the detectors (`discriminants`, `peak_detectors` with max),
    each read less its expert's floor in `floors` (`with_floors`), and `set_weights` ([{"experts": [...],
    "weight": λ_S}, ...]: the gates of a position that keeps exactly those experts times λ_S)."""
    if score not in ROUTING_SCORES:
        raise ValueError(f"routing score: expected one of {list(ROUTING_SCORES)}, got {score!r}")
    if pool not in ROUTING_POOLS or (pool == "max" and score != "discriminant"):
        raise ValueError(f"routing pool: expected one of {list(ROUTING_POOLS)} (max with score discriminant), got {pool!r}")
    if floors and score != "discriminant":
        raise ValueError("routing floors: need score discriminant (a floor is a detector's score)")
    flat = {n: torch.cat(m) if pool == "max" else m for n, m in states.items()}  # (N_i, d): prompts' means or tokens
    routing = {"centroids": {n: m.mean(0).tolist() for n, m in flat.items()}, "tau": tau, "threshold": threshold,
               "gates": gates, "update": update, "pool": pool} | ({"set_weights": set_weights} if set_weights else {})
    if score == "cosine":
        return routing
    detectors = peak_detectors(states, shrinkage) if pool == "max" else discriminants(states, shrinkage)
    return routing | {"detectors": with_floors(detectors, floors or {})}

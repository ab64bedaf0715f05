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
    g_i,t = z⁺_i,t / max_j z⁺_j,t  where z⁺_i,t ≥ θ · max_j z⁺_j,t > 0, else 0       z⁺ = max(z, 0)

Σ is the experts' prompts' pooled within-expert covariance (the linear discriminant of Gaussian classes
with one shared covariance, shrunk by λ), and s_i, o_i scale z_i to 1 on average over expert i's prompts
and 0 over the other experts' prompts. Whitening by Σ weighs the directions that tell the experts'
prompts apart (an instruction, "Answer in XML:") over those their content varies along. No expert
detected (every z ≤ 0) gives every gate 0: the product rule is then the base.

With `gates: binary` every kept expert's gate is 1 (g_i,t = 1 where the rule above keeps expert i, else 0): the
experts the evidence keeps are composed at their full weights, as a composition of exactly those experts.

With `update: false` the gates stop following the tokens a model generates: a forward that continues a cache
(each decoding step of `generate`) uses the gates of the mean over the tokens of the cache's first forward (the
prompt), the prompt posterior of Branch-Train-Merge without its per-token update. A sequence scored in one
forward is routed position by position as above either way (each position's prefix is its prompt), so with
`update: false` a generated token's decoding log-probs are those of the prompt's gates, not of its prefix's.

Reductions: all posteriors equal → every g = 1 → the rule with its fixed weights; one expert certain
(π = e_j) → only expert j applies (with the product rule and w_j = 1, exactly expert j). θ = 1 keeps
only the top expert at each position. The running mean is causal, so (with `update`, the default) scoring a
sequence in one forward and decoding it token by token through the cache give the same gates.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F

from .config import ROUTING_SCORES

RouteState = tuple[torch.Tensor, torch.Tensor]  # (sum of hidden states (B, d), token count (B, 1)) of a row's tokens so far


class Router(torch.nn.Module):
    """The gates of `CompositionConfig.routing` (centroids in the composition's expert order), on the model's device."""

    def __init__(self, centroids: torch.Tensor, tau: float, threshold: float,
                 detectors: tuple[torch.Tensor, torch.Tensor] | None = None, binary: bool = False, update: bool = True):
        """`detectors`: None (cosine posteriors), or (v (k, d), o (k,)) of the discriminant scores; `binary`: a
        kept expert's gate is 1 instead of its evidence over the top one's; `update`: False holds the prompt's
        gates over the forwards that continue a cache."""
        super().__init__()
        self.tau, self.threshold, self.binary, self.update = tau, threshold, binary, update
        centre = centroids.mean(0)  # (d,)
        # (k, d) unit directions of the centred centroids; a zero direction (a single expert) scores 0
        self.register_buffer("directions", F.normalize(centroids - centre, dim=-1), persistent=False)
        self.register_buffer("centre", centre, persistent=False)
        self.discriminant = detectors is not None
        if detectors is not None:
            self.register_buffer("detector_directions", detectors[0].to(centre.dtype), persistent=False)  # (k, d)
            self.register_buffer("detector_offsets", detectors[1].to(centre.dtype), persistent=False)  # (k,)

    @classmethod
    def from_config(cls, routing: dict, experts: list[str], dtype=torch.float32) -> Router:
        centroids = torch.tensor([routing["centroids"][e] for e in experts], dtype=dtype)  # (k, d)
        detectors = routing.get("detectors")
        if detectors is not None:
            detectors = (torch.tensor([detectors[e]["direction"] for e in experts], dtype=dtype),  # (k, d)
                         torch.tensor([detectors[e]["offset"] for e in experts], dtype=dtype))  # (k,)
        return cls(centroids, routing["tau"], routing["threshold"], detectors, routing["gates"] == "binary", routing["update"])

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
        """g (..., k) from mean hidden states (..., d): `threshold_gates` of the evidence."""
        return threshold_gates(self.evidence(means), self.threshold, self.binary)


def threshold_gates(evidence: torch.Tensor, threshold: float, binary: bool = False) -> torch.Tensor:
    """g (..., k) from evidence (..., k) ≥ 0: each evidence over the top one (binary: 1), 0 below θ · the top one
    (every gate 0 where no expert has evidence)."""
    top = evidence.amax(-1, keepdim=True)  # (..., 1)
    keep = (evidence >= threshold * top) & (top > 0)
    if binary:
        return keep.float()
    return torch.where(keep, evidence / top.clamp(min=torch.finfo(evidence.dtype).tiny), torch.zeros_like(evidence)).float()


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


def step_means(hidden: torch.Tensor | None, mask: torch.Tensor | None, state: RouteState | None,
               width: int) -> tuple[torch.Tensor, RouteState | None]:
    """The mean hidden states (B, width, d) that route a forward's last `width` positions, and the state to continue
    from: the running means (`running_means` of `hidden` (B, T, d)), or with `hidden` None (a held routing, `update:
    false`) the mean of `state` (the cache's first forward) at every position, the state left as it is."""
    if hidden is None:
        sums, counts = state
        return (sums / counts.clamp(min=1.0)).unsqueeze(1).expand(-1, width, -1), state  # (B, width, d)
    means, state = running_means(hidden, mask, state)  # (B, T, d)
    return means[:, -width:], state


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


def expert_prompt_means(model, tokenizer, prompts: dict[str, list[str]], batch_size: int = 8) -> dict[str, torch.Tensor]:
    """Expert name -> `prompt_means` (n, d) of its prompts."""
    return {name: prompt_means(model, tokenizer, texts, batch_size) for name, texts in prompts.items()}


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


def routing_config(means: dict[str, torch.Tensor], tau: float = 0.1, threshold: float = 0.0, score: str = "cosine",
                   shrinkage: float = 1.0, gates: str = "scaled", update: bool = True) -> dict:
    """`CompositionConfig.routing` from each expert's prompt means (n_i, d): centroids, τ, θ, the gates' kind
    (ROUTING_GATES), whether decoding updates them, and with score "discriminant" the detectors (`discriminants`)."""
    if score not in ROUTING_SCORES:
        raise ValueError(f"routing score: expected one of {list(ROUTING_SCORES)}, got {score!r}")
    routing = {"centroids": {n: m.mean(0).tolist() for n, m in means.items()}, "tau": tau, "threshold": threshold,
               "gates": gates, "update": update}
    return routing | ({"detectors": discriminants(means, shrinkage)} if score == "discriminant" else {})


def fit_routing(composed, tokenizer, prompts: dict[str, list[str]], tau: float = 0.1, threshold: float = 0.0,
                batch_size: int = 8, score: str = "cosine", shrinkage: float = 1.0, gates: str = "scaled",
                update: bool = True) -> None:
    """Route `composed` (a `ComposedModelForCausalLM`) by the hidden states of these prompts (expert name ->
    prompts of its skill, every composed expert), computed by its base with the adapters disabled: cosine
    posteriors of centroids, or (score "discriminant") per-expert detectors, with `gates` "scaled" or "binary"
    (a kept expert at its full weight), and `update` False to hold the prompt's gates while decoding; sets its
    `composition.routing` (saved with it by `save_pretrained`)."""
    from contextlib import nullcontext

    from peft import PeftModel

    with composed.model.disable_adapter() if isinstance(composed.model, PeftModel) else nullcontext():
        means = expert_prompt_means(composed._hf_model, tokenizer, prompts, batch_size)
    composed.composition = composed.composition.with_routing(routing_config(means, tau, threshold, score, shrinkage, gates, update))

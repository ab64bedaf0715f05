"""Composition rules: how the base's and the experts' log-probs combine at one decoding step.

Each rule is a pure function over clamped log-probs in log space,

    rule(lb, experts, weights, masks, **params) -> scores (..., V)   (normalised by the caller)

with lb = log p_b and experts = [log p_i], both (..., V) fp32 and clamped at the floor, weights
w_i, and masks m_i (bool (V,) or None: where expert i's log-ratio r_i = m_i ⊙ (log p_i − log p_b)
applies). Their parameters (names, defaults, ranges) are `config.RULE_PARAMS`, which validates
them without torch. The rules:

    product     log p̂ ∝ log p_b + Σ w_i r_i                       the paper's rule (default)
    tempered    log p̂ ∝ log p_b + s · Σ w_i r_i                   s = scale; the base's exponent is
                1 − s Σ w_i (s = 1/Σ w_i: the experts' normalised geometric mean, no base)
    activity    log p̂ ∝ log p_b + Σ w_i g_i r_i,  g_i = (a_i / max_j a_j)^γ,  a_i = KL(p_i ‖ p_b)
                per position: an expert counts in proportion to how active it is relative to the
                most active one (γ = 0: product; γ → ∞: the most active expert alone)
    confident   log p̂ ∝ log p_b + Σ w_i c_i r_i,  c_i = (max_y p_i(y))^γ  per position: an expert counts
                in proportion to its own confidence, so one that is lost on a prefix unlike its training
                data (flat distribution) fades out (γ = 0: product)
    union       log p̂ ∝ log p_b + max_i w_i r_i                  each token gets the support of its
                most favourable expert only (model arithmetic's Union, relative to the base)
    plausible   product restricted to tokens y with p_m(y) ≥ α · max_y' p_m(y') for the base or
                some expert m (contrastive decoding's plausibility constraint; EOS is a token like
                any other); the rest get 1e4 nats below the least kept token (α = 0: product)

With every log-ratio 0 (experts equal to the base, or masked off) every rule gives the base, except
`plausible`, which gives the base restricted to the plausible tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

Masks = Sequence[torch.Tensor | None]


def log_ratios(lb: torch.Tensor, experts: Sequence[torch.Tensor], masks: Masks) -> list[torch.Tensor]:
    """r_i = m_i ⊙ (log p_i − log p_b), each (..., V)."""
    out = []
    for expert, mask in zip(experts, masks):
        ratio = expert - lb
        out.append(ratio if mask is None else ratio * mask.to(ratio.device, ratio.dtype))
    return out


def product(lb, experts, weights, masks) -> torch.Tensor:
    total = lb.clone()
    for ratio, w in zip(log_ratios(lb, experts, masks), weights):
        total = total + w * ratio
    return total


def tempered(lb, experts, weights, masks, *, scale: float) -> torch.Tensor:
    return lb + scale * (product(lb, experts, weights, masks) - lb)


def activity(lb, experts, weights, masks, *, gamma: float) -> torch.Tensor:
    kl = torch.stack([(e.exp() * (e - lb)).sum(-1) for e in experts]).clamp(min=0)  # (k, ...): KL(p_i ‖ p_b)
    gates = (kl / kl.amax(0, keepdim=True).clamp(min=1e-12)).pow(gamma).unsqueeze(-1)  # (k, ..., 1)
    total = lb.clone()
    for ratio, w, g in zip(log_ratios(lb, experts, masks), weights, gates):
        total = total + w * g * ratio
    return total


def confident(lb, experts, weights, masks, *, gamma: float) -> torch.Tensor:
    total = lb.clone()
    for ratio, w, e in zip(log_ratios(lb, experts, masks), weights, experts):
        total = total + w * (gamma * e.amax(-1, keepdim=True)).exp() * ratio  # (max p_i)^γ = exp(γ · max log p_i)
    return total


def union(lb, experts, weights, masks) -> torch.Tensor:
    ratios = torch.stack([w * r for r, w in zip(log_ratios(lb, experts, masks), weights)])  # (k, ..., V)
    return lb + ratios.amax(0)


def plausible(lb, experts, weights, masks, *, alpha: float) -> torch.Tensor:
    total = product(lb, experts, weights, masks)
    if alpha <= 0:
        return total
    models = torch.stack([lb, *experts])  # (k + 1, ..., V)
    keep = (models >= models.amax(-1, keepdim=True) + math.log(alpha)).any(0)  # (..., V)
    # the rest: 1e4 nats below every kept token (finite, unlike -inf, and zero after normalising)
    return torch.where(keep, total, total.amin(-1, keepdim=True) - 1e4)


RULES: dict[str, Callable[..., torch.Tensor]] = {
    "product": product, "tempered": tempered, "activity": activity, "confident": confident, "union": union,
    "plausible": plausible,
}

"""Composition rules: how the base's and the experts' log-probs combine at one decoding step.

A rule is one registered `Rule`: its name, its formula, its parameters with their defaults and
ranges, and its function, a pure function over clamped log-probs in log space,

    function(lb, experts, weights, masks, **params) -> scores (..., V)   (normalised by the caller)

with lb = log p_b and experts = [log p_i], both (..., V) fp32 and clamped at the floor, weights
w_i (floats, or tensors (..., 1) per position under routing: `logitcomp.routing`), and masks m_i (bool (V,) or None: where expert i's log-ratio r_i = m_i ⊙ (log p_i − log p_b)
applies). With every log-ratio 0 (experts equal to the base, or masked off) every rule gives the
base, except `plausible`, which gives the base restricted to the plausible tokens.

Importing this module imports no torch (recipes validate rule names and parameters without it);
the functions that need torch's module-level operations import it when first called.
A new rule is one decorated function here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    Masks = Sequence[torch.Tensor | None]


@dataclass(frozen=True)
class Param:
    """A rule parameter: its default and its closed range [low, high]."""

    default: float
    low: float
    high: float


@dataclass(frozen=True)
class Rule:
    """A registered composition rule (see the module docstring for `function`'s signature)."""

    name: str
    formula: str
    function: Callable[..., torch.Tensor]
    params: dict[str, Param] = field(default_factory=dict)
    nonnegative: bool = False  # the rule takes weights >= 0 only (at least one > 0)
    # an expert of weight 0 (or gate 0) adds exactly 0 to the scores, whatever its log-probs: such an expert need not
    # be computed (`logitcomp.layout`); false where the other experts' terms depend on it (a max, a normalisation)
    sparse: bool = False

    def check(self, params) -> dict[str, float]:
        """Every parameter (defaults filled in) as floats. Raises ValueError naming a bad or unknown one."""
        if not isinstance(params, dict):
            raise ValueError(f"rule_params: expected a mapping of parameter name to number, got {params!r}")
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            raise ValueError(f"rule_params: {self.name} takes {sorted(self.params) or 'no parameters'}, got {unknown[0]!r}")
        out = {}
        for name, p in self.params.items():
            value = params.get(name, p.default)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (p.low <= value <= p.high):
                raise ValueError(f"rule_params.{name}: expected a number in [{p.low:g}, {p.high:g}], got {value!r}")
            out[name] = float(value)
        return out

    def bind(self, params: dict[str, float]) -> Callable[..., torch.Tensor]:
        """The function with these (already checked) parameters: `f(lb, experts, weights, masks)`."""
        return partial(self.function, **params) if params else self.function


RULES: dict[str, Rule] = {}


def register(name: str, formula: str, nonnegative: bool = False, sparse: bool = False, **params: tuple[float, float, float]):
    """Decorator: register `function` as rule `name`; each parameter is (default, low, high)."""

    def add(function):
        RULES[name] = Rule(name, formula, function, {k: Param(*v) for k, v in params.items()}, nonnegative, sparse)
        return function

    return add


def get_rule(name) -> Rule:
    """The registered rule `name`. Raises ValueError listing the rules."""
    if name not in RULES:
        raise ValueError(f"rule: expected one of {list(RULES)}, got {name!r}")
    return RULES[name]


def log_ratios(lb: torch.Tensor, experts: Sequence[torch.Tensor], masks: Masks) -> list[torch.Tensor]:
    """r_i = m_i ⊙ (log p_i − log p_b), each (..., V)."""
    out = []
    for expert, mask in zip(experts, masks):
        ratio = expert - lb
        out.append(ratio if mask is None else ratio * mask.to(ratio.device, ratio.dtype))
    return out


@register("product", "log p̂ ∝ log p_b + Σ w_i r_i   (the paper's rule, the default)", sparse=True)
def product(lb, experts, weights, masks):
    total = lb.clone()
    for ratio, w in zip(log_ratios(lb, experts, masks), weights):
        total = total + w * ratio
    return total


@register("tempered", "log p̂ ∝ log p_b + s · Σ w_i r_i   (s = 1/Σ w_i: the experts' normalised geometric mean, no base)",
          sparse=True, scale=(1.0, 0.0, 10.0))
def tempered(lb, experts, weights, masks, *, scale: float):
    return lb + scale * (product(lb, experts, weights, masks) - lb)


@register("activity", "log p̂ ∝ log p_b + Σ w_i g_i r_i,  g_i = (a_i / max_j a_j)^γ,  a_i = KL(p_i ‖ p_b) per position "
          "(γ = 0: product; γ → ∞: the most active expert alone)", gamma=(1.0, 0.0, 100.0))
def activity(lb, experts, weights, masks, *, gamma: float):
    import torch

    kl = torch.stack([(e.exp() * (e - lb)).sum(-1) for e in experts]).clamp(min=0)  # (k, ...): KL(p_i ‖ p_b)
    gates = (kl / kl.amax(0, keepdim=True).clamp(min=1e-12)).pow(gamma).unsqueeze(-1)  # (k, ..., 1)
    total = lb.clone()
    for ratio, w, g in zip(log_ratios(lb, experts, masks), weights, gates):
        total = total + w * g * ratio
    return total


@register("confident", "log p̂ ∝ log p_b + Σ w_i c_i r_i,  c_i = (max_y p_i(y))^γ per position: an expert lost on a prefix "
          "unlike its training data (flat distribution) fades out (γ = 0: product)", sparse=True, gamma=(1.0, 0.0, 100.0))
def confident(lb, experts, weights, masks, *, gamma: float):
    total = lb.clone()
    for ratio, w, e in zip(log_ratios(lb, experts, masks), weights, experts):
        total = total + w * (gamma * e.amax(-1, keepdim=True)).exp() * ratio  # (max p_i)^γ = exp(γ · max log p_i)
    return total


@register("union", "log p̂ ∝ log p_b + max_i w_i r_i   (each token gets its most favourable expert's support only: "
          "model arithmetic's Union, relative to the base)")
def union(lb, experts, weights, masks):
    import torch

    ratios = torch.stack([w * r for r, w in zip(log_ratios(lb, experts, masks), weights)])  # (k, ..., V)
    return lb + ratios.amax(0)


@register("plausible", "product restricted to tokens y with p_m(y) ≥ α · max_y' p_m(y') for the base or some expert m "
          "(contrastive decoding's plausibility constraint); the rest 1e4 nats below the least kept token (α = 0: product)",
          alpha=(0.1, 0.0, 1.0))
def plausible(lb, experts, weights, masks, *, alpha: float):
    import torch

    total = product(lb, experts, weights, masks)
    if alpha <= 0:
        return total
    models = torch.stack([lb, *experts])  # (k + 1, ..., V)
    keep = (models >= models.amax(-1, keepdim=True) + math.log(alpha)).any(0)  # (..., V)
    # the rest: 1e4 nats below every kept token (finite, unlike -inf, and zero after normalising)
    return torch.where(keep, total, total.amin(-1, keepdim=True) - 1e4)


@register("mixture", "p̂ = Σ_i w_i p̃_i / Σ_i w_i,  p̃_i = p_b · exp(r_i)   (a linear mixture of the experts, no base term; "
          "with routing, Σ π_i p_i: the Bayesian ensemble of Branch-Train-Merge / DEMix)", nonnegative=True)
def mixture(lb, experts, weights, masks):
    import torch

    # each term log(w_i / Σ w) + log p̃_i, a zero weight as 1e-30 (no -inf: the caller normalises a finite total)
    total = torch.as_tensor(sum(weights)).clamp(min=1e-30)
    terms = [torch.as_tensor(w / total).clamp(min=1e-30).log() + lb + r for w, r in zip(weights, log_ratios(lb, experts, masks))]
    return torch.logsumexp(torch.stack(torch.broadcast_tensors(*terms)), dim=0)

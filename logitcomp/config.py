"""Options of a composition, validated on construction (no torch: recipes validate without it)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .rules import get_rule

DEFAULT_FLOOR = -1e4  # the paper's code clamps base log-probs here
EOS_POLICIES = ("compose", "base", "any", "all")
# Bounds that keep the composition finite in fp32: each term w_i * (log p_i - log p_b) is at most
# MAX_WEIGHT * |MIN_FLOOR| = 1e15 (fp32 holds 3.4e38); no useful composition comes near them.
MAX_WEIGHT = 1e6
MIN_FLOOR = -1e9


def check_floor(floor) -> float:
    """Return `floor` as a float. Raises ValueError unless it is a number in [MIN_FLOOR, 0)."""
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not (MIN_FLOOR <= floor < 0):
        raise ValueError(f"floor: expected a negative number >= -1e9, got {floor!r}")
    return float(floor)


def check_eos_policy(policy) -> str:
    """Return `policy`. Raises ValueError unless it is one of EOS_POLICIES."""
    if policy not in EOS_POLICIES:
        raise ValueError(f"eos_policy: expected one of {list(EOS_POLICIES)}, got {policy!r}")
    return policy


def check_weights(weights: Sequence[float], names: Sequence[str] | None = None) -> list[float]:
    """Return the weights as floats. Raises ValueError naming a weight that is not a finite number in
    [-MAX_WEIGHT, MAX_WEIGHT] (larger ones would overflow the composition to NaN)."""
    out = []
    for i, w in enumerate(weights):
        label = repr(names[i]) if names is not None else f"#{i}"
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise ValueError(f"weight of expert {label}: expected a finite number, got {w!r}")
        if not math.isfinite(w):
            raise ValueError(f"weight of expert {label}: expected a finite number, got {w!r}")
        if abs(w) > MAX_WEIGHT:
            raise ValueError(f"weight of expert {label}: expected a number in [-1e6, 1e6], got {w!r}")
        out.append(float(w))
    return out


@dataclass
class CompositionConfig:
    """How experts are composed with their base.

    Args:
        weights: expert name -> weight w_i (1.0 for every expert left out: the paper's rule;
            negative weights make anti-experts).
        floor: log-probs are clamped here before the log-ratios are taken (the paper used -1e4).
        eos_policy: how EOS is scored: `compose` (the composition, as in the paper), `base` (the
            base alone), `any` (max over base and experts), `all` (min over base and experts).
            The paper reports termination instability with more than two experts.
        masks: expert name -> token ids on which its log-ratio applies (the paper's factorised
            conditionals); experts left out apply everywhere.
        trace: forward also returns each expert's activity KL(p_i ‖ p_b) and the composed entropy.
        rule: how the log-probs combine: a name of `logitcomp.rules.RULES` (`product`, the paper's, by
            default); EOS policies and masks apply with every rule.
        rule_params: the rule's parameters (`RULES[rule].params`: defaults and ranges).
    """

    weights: dict[str, float] = field(default_factory=dict)
    floor: float = DEFAULT_FLOOR
    eos_policy: str = "compose"
    masks: dict[str, list[int]] = field(default_factory=dict)
    trace: bool = False
    rule: str = "product"
    rule_params: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.weights, dict):
            raise ValueError(f"weights: expected a mapping of expert name to number, got {self.weights!r}")
        self.weights = dict(zip(self.weights, check_weights(list(self.weights.values()), list(self.weights))))
        check_floor(self.floor)
        check_eos_policy(self.eos_policy)
        if not isinstance(self.masks, dict):
            raise ValueError(f"masks: expected a mapping of expert name to token ids, got {self.masks!r}")
        for name, ids in self.masks.items():
            if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise ValueError(f"masks[{name!r}]: expected a list of non-negative token ids, got {ids!r}")
        self.masks = {name: list(ids) for name, ids in self.masks.items()}
        self.rule_params = get_rule(self.rule).check(self.rule_params)

    def check_experts(self, names: list[str]) -> None:
        """Raise ValueError when weights or masks name an expert that is not composed."""
        for key, table in (("weights", self.weights), ("masks", self.masks)):
            unknown = sorted(set(table) - set(names))
            if unknown:
                raise ValueError(f"{key}: unknown expert {unknown[0]!r}; the experts are {names}")

    def with_weights(self, weights: dict[str, float]) -> CompositionConfig:
        """A validated copy whose weights are these, over the current ones."""
        return CompositionConfig(**{**self.to_dict(), "weights": {**self.weights, **weights}})

    def weight(self, name: str) -> float:
        return self.weights.get(name, 1.0)

    def to_dict(self) -> dict:
        return asdict(self)

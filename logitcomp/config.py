"""Options of a composition, validated on construction (no torch: recipes validate without it)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .rules import get_rule

DEFAULT_FLOOR = -1e4  # the paper's code clamps base log-probs here
EOS_POLICIES = ("compose", "base", "any", "all", "all_experts", "top")
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


ROUTING_SCORES = ("cosine", "discriminant")  # how routing scores the experts' evidence (logitcomp.routing)
ROUTING_GATES = ("scaled", "binary")  # a kept expert's gate: its evidence over the top one's, or 1 (logitcomp.routing)
ROUTING_POOLS = ("mean", "max")  # what the evidence reads: the mean hidden state so far, or (detectors) each token (logitcomp.routing)
ROUTING_KEYS = ("centroids", "tau", "threshold", "gates", "update", "pool", "detectors", "set_weights")


def check_routing(routing) -> dict | None:
    """Return `routing` with its defaults filled in (None: no routing). Raises ValueError naming the bad key.

    `centroids`: expert name -> its centroid (d numbers, one length for all); `tau` in (0, 100]: the
    posterior's temperature; `threshold` in [0, 1]: experts whose posterior is below this share of the
    top one's get weight 0; `gates` in ROUTING_GATES (default "scaled"): a kept expert's gate is its evidence
    over the top one's, or ("binary") 1; `update` (default true): false holds, in every forward that continues
    a cache (each `generate` step), the gates the cache's first forward (the prompt) ended with; `detectors`
    (optional): expert name -> {"direction": d numbers, "offset": a number}, the discriminant scores that
    replace the cosine posteriors; `pool` in ROUTING_POOLS (default "mean"; "max" needs detectors): the
    detectors score the mean hidden state so far, or each token with their running maximum; `set_weights` (optional):
    a list of {"experts": [names of the centroids], "weight": λ_S}, distinct sets: the gates of a position that keeps
    exactly those experts are multiplied by λ_S (see `logitcomp.routing`)."""
    if routing is None:
        return None
    if not isinstance(routing, dict):
        raise ValueError(f"routing: expected a mapping with centroids, tau and threshold, got {routing!r}")
    unknown = sorted(set(routing) - set(ROUTING_KEYS))
    if unknown:
        near = difflib.get_close_matches(str(unknown[0]), ROUTING_KEYS, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ValueError(f"routing: unknown key {unknown[0]!r}{hint}; allowed keys: {', '.join(ROUTING_KEYS)}")
    centroids = routing.get("centroids")
    if not isinstance(centroids, dict) or not centroids:
        raise ValueError(f"routing.centroids: expected a mapping of expert name to a list of numbers, got {centroids!r}")
    length = None
    for name, vector in centroids.items():
        if not _finite_numbers(vector):
            raise ValueError(f"routing.centroids[{name!r}]: expected a non-empty list of finite numbers")
        if length is not None and len(vector) != length:
            raise ValueError(f"routing.centroids[{name!r}]: {len(vector)} numbers, the other centroids {length}")
        length = len(vector)
    out = {"centroids": {n: [float(x) for x in v] for n, v in centroids.items()}}
    for key, default, low, high, closed in (("tau", 0.1, 0.0, 100.0, False), ("threshold", 0.0, 0.0, 1.0, True)):
        value = routing.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high) or (not closed and value == low):
            bounds = f"[{low:g}, {high:g}]" if closed else f"({low:g}, {high:g}]"
            raise ValueError(f"routing.{key}: expected a number in {bounds}, got {value!r}")
        out[key] = float(value)
    out["gates"] = routing.get("gates", "scaled")
    if out["gates"] not in ROUTING_GATES:
        raise ValueError(f"routing.gates: expected one of {list(ROUTING_GATES)}, got {out['gates']!r}")
    out["update"] = routing.get("update", True)
    if not isinstance(out["update"], bool):
        raise ValueError(f"routing.update: expected true or false, got {out['update']!r}")
    out["pool"] = routing.get("pool", "mean")
    if out["pool"] not in ROUTING_POOLS or (out["pool"] == "max" and "detectors" not in routing):
        raise ValueError(f"routing.pool: expected one of {list(ROUTING_POOLS)} (max only with detectors), got {out['pool']!r}")
    if "detectors" in routing:
        out["detectors"] = _check_detectors(routing["detectors"], out["centroids"], length)
    if "set_weights" in routing:
        out["set_weights"] = check_set_weights(routing["set_weights"], list(out["centroids"]), "routing.set_weights")
    return out


def check_set_weights(set_weights, experts: list[str], field: str = "set_weights") -> list[dict]:
    """`set_weights` as [{"experts": [names in the order of `experts`], "weight": float}]. Raises ValueError naming
    the entry unless each is a mapping of a non-empty list of distinct names of `experts` and a finite weight in
    [-MAX_WEIGHT, MAX_WEIGHT], no set named twice."""
    if not isinstance(set_weights, list):
        raise ValueError(f"{field}: expected a list of {{experts: [names], weight: number}}, got {set_weights!r}")
    out, seen = [], set()
    for i, entry in enumerate(set_weights):
        names = entry.get("experts") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or set(entry) != {"experts", "weight"} or not isinstance(names, list) or not names:
            raise ValueError(f"{field}[{i}]: expected a mapping with experts (a non-empty list of names) and weight, got {entry!r}")
        if unknown := [n for n in names if n not in experts]:
            raise ValueError(f"{field}[{i}].experts: {unknown[0]!r} is not a routed expert; expected names from {experts}")
        if len(set(names)) != len(names) or frozenset(names) in seen:
            raise ValueError(f"{field}[{i}].experts: {names} names an expert twice or a set named before")
        seen.add(frozenset(names))
        weight = entry["weight"]
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or abs(weight) > MAX_WEIGHT:
            raise ValueError(f"{field}[{i}].weight: expected a finite number in [-1e6, 1e6], got {weight!r}")
        out.append({"experts": [e for e in experts if e in names], "weight": float(weight)})
    return out


def _finite_numbers(vector) -> bool:
    return isinstance(vector, (list, tuple)) and bool(vector) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vector)


def _check_detectors(detectors, centroids: dict, length: int) -> dict:
    """`routing.detectors` as floats: one {"direction", "offset"} per expert of the centroids, each direction of their length."""
    if not isinstance(detectors, dict) or set(detectors) != set(centroids):
        raise ValueError(f"routing.detectors: expected one detector per expert of the centroids {sorted(centroids)}")
    out = {}
    for name, detector in detectors.items():
        if not isinstance(detector, dict) or set(detector) != {"direction", "offset"}:
            raise ValueError(f"routing.detectors[{name!r}]: expected a mapping with direction and offset")
        if not _finite_numbers(detector["direction"]) or len(detector["direction"]) != length:
            raise ValueError(f"routing.detectors[{name!r}].direction: expected {length} finite numbers (the centroids' length)")
        if not _finite_numbers([detector["offset"]]):
            raise ValueError(f"routing.detectors[{name!r}].offset: expected a finite number, got {detector['offset']!r}")
        out[name] = {"direction": [float(x) for x in detector["direction"]], "offset": float(detector["offset"])}
    return out


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
            base alone), `any` (max over base and experts), `all` (min over base and experts), `all_experts`
            (min over the experts alone: the answer ends where every expert would end it; with routing, every
            expert whose gate is not 0), `top`
            (the expert of the largest weight at that position: with routing, the top-routed one).
            The paper reports termination instability with more than two experts.
        masks: expert name -> token ids on which its log-ratio applies (the paper's factorised
            conditionals); experts left out apply everywhere.
        trace: forward also returns each expert's activity KL(p_i ‖ p_b) and the composed entropy.
        rule: how the log-probs combine: a name of `logitcomp.rules.RULES` (`product`, the paper's, by
            default); EOS policies and masks apply with every rule.
        rule_params: the rule's parameters (`RULES[rule].params`: defaults and ranges).
        routing: None (fixed weights), or hidden-state routing (`logitcomp.routing`): `centroids`
            (expert name -> d numbers, every composed expert), `tau`, `threshold`, and optionally
            `detectors` (expert name -> {"direction", "offset"}: per-expert discriminant scores instead of the
            cosine posteriors) and `set_weights` (a kept set of experts -> the factor of its gates); each
            expert's weight at a position is w_i times its gate there.
    """

    weights: dict[str, float] = field(default_factory=dict)
    floor: float = DEFAULT_FLOOR
    eos_policy: str = "compose"
    masks: dict[str, list[int]] = field(default_factory=dict)
    trace: bool = False
    rule: str = "product"
    rule_params: dict[str, float] = field(default_factory=dict)
    routing: dict | None = None

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
        self.routing = check_routing(self.routing)

    def check_experts(self, names: list[str]) -> None:
        """Raise ValueError when weights or masks name an expert that is not composed."""
        for key, table in (("weights", self.weights), ("masks", self.masks)):
            unknown = sorted(set(table) - set(names))
            if unknown:
                raise ValueError(f"{key}: unknown expert {unknown[0]!r}; the experts are {names}")
        if self.routing is not None and set(self.routing["centroids"]) != set(names):
            missing = sorted(set(names) - set(self.routing["centroids"])) or sorted(set(self.routing["centroids"]) - set(names))
            raise ValueError(f"routing.centroids: expected one centroid per composed expert {names}; {missing[0]!r} does not match")

    def with_weights(self, weights: dict[str, float]) -> CompositionConfig:
        """A validated copy whose weights are these, over the current ones."""
        return CompositionConfig(**{**self.to_dict(), "weights": {**self.weights, **weights}})

    def with_routing(self, routing: dict | None) -> CompositionConfig:
        """A validated copy with this routing (None: fixed weights)."""
        return CompositionConfig(**{**self.to_dict(), "routing": routing})

    def weight(self, name: str) -> float:
        return self.weights.get(name, 1.0)

    def to_dict(self) -> dict:
        return asdict(self)

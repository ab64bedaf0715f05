"""The composition rule and the quantities traced beside it, as pure tensor functions.

    log p̂ = log_softmax( log p_b + Σ_i w_i · m_i ⊙ (log p_i − log p_b) )

with w_i = 1 and m_i = 1 the rule of "Compositional Generalization in Autoregressive Models via
Logit Composition". `Composer` is that rule with its options checked once (what a model applies
at every decoding step); `compose_logprobs` checks and applies it in one call. Nothing here holds
state or mutates its inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from .config import DEFAULT_FLOOR, EOS_POLICIES, check_eos_policy, check_floor, check_weights  # noqa: F401  (EOS_POLICIES: re-exported)
from .rules import RULES, get_rule


@dataclass(frozen=True)
class Composer:
    """A composition whose options were checked once, at `build`: calling it at every decoding step
    checks nothing. `ComposedModelForCausalLM` builds one from its `CompositionConfig`."""

    weights: tuple[float, ...]
    floor: float
    rule: Callable[..., torch.Tensor]  # RULES[name].function with its parameters bound
    plain_product: bool  # the product rule without masks: composed in two buffers (`_product`)
    eos_pick: Callable[[torch.Tensor], torch.Tensor] | None  # (k+1, ..., E) -> (..., E); None: EOS as composed
    # an expert of weight or gate 0 changes nothing (its rule is `Rule.sparse` and its EOS policy reads only the experts
    # in use): composing only the others gives the same log-probs, so a model need not compute it (`logitcomp.layout`)
    sparse: bool = False

    @classmethod
    def build(cls, weights: Sequence[float], *, floor: float = DEFAULT_FLOOR, rule: str = "product",
              rule_params: dict | None = None, eos_policy: str = "compose", masked: bool = False) -> Composer:
        """Check the options of a composition of `len(weights)` experts.

        Args:
            weights: one float per expert in [-1e6, 1e6] (negative = anti-expert).
            floor: in [-1e9, 0): log-probs are clamped here.
            rule, rule_params: a rule of `logitcomp.rules.RULES` and its parameters.
            eos_policy: one of `EOS_POLICIES` (see `apply_eos_policy`).
            masked: whether some expert's log-ratio will be masked.

        Raises:
            ValueError: naming the bad weight, floor, rule, parameter or policy.
        """
        weights = tuple(check_weights(list(weights)))
        spec = get_rule(rule)
        if spec.nonnegative and (any(w < 0 for w in weights) or not any(w > 0 for w in weights)):
            raise ValueError(f"weights: the {spec.name} rule takes weights >= 0, at least one > 0; got {list(weights)}")
        return cls(weights, check_floor(floor), spec.bind(spec.check(dict(rule_params or {}))), spec is RULES["product"] and not masked,
                   EOS_PICKS[check_eos_policy(eos_policy)], spec.sparse and eos_policy in SPARSE_EOS)

    def subset(self, experts: Sequence[int]) -> Composer:
        """The composition of only these experts (indices, in order): where `sparse`, the same log-probs as every
        expert's wherever the others' weights (or gates) are 0."""
        return replace(self, weights=tuple(self.weights[i] for i in experts))

    def __call__(self, base: torch.Tensor, experts: Sequence[torch.Tensor], masks: Sequence[torch.Tensor | None] | None = None,
                 eos_ids: torch.Tensor | None = None, gates: torch.Tensor | None = None) -> torch.Tensor:
        """Composed fp32 log-probs (..., V) of base and expert logits (..., V); `masks`: bool (V,) or None
        per expert; `eos_ids`: (E,) on the logits' device, rescored by the EOS policy; `gates`: (..., k)
        per-position factors of the weights (routing, `logitcomp.routing`), None: the fixed weights."""
        weights = self.weights if gates is None else [w * gates[..., i:i + 1] for i, w in enumerate(self.weights)]  # (..., 1) each
        if self.plain_product and gates is None and not _records_grad(base, *experts):
            composed = _product(base, experts, self.weights, self.floor)
        else:
            lb = clamped_logprobs(base, self.floor)  # (..., V)
            clamped = [clamped_logprobs(e, self.floor) for e in experts]  # finite: every log-ratio is bounded
            total = self.rule(lb, clamped, weights, masks or [None] * len(experts))  # (..., V)
            composed = torch.log_softmax(total, dim=-1)  # finite: every term is bounded
        if self.eos_pick is None or eos_ids is None or eos_ids.numel() == 0:
            return composed
        return _rescore_eos(composed, base, experts, eos_ids, self.eos_pick, self.floor, weights)


def compose_logprobs(
    base: torch.Tensor,
    experts: Sequence[torch.Tensor],
    weights: Sequence[float] | None = None,
    *,
    floor: float = DEFAULT_FLOOR,
    masks: Sequence[torch.Tensor | None] | None = None,
    rule: str = "product",
    rule_params: dict | None = None,
) -> torch.Tensor:
    """Compose experts with their base in probability space (by default the paper's product rule).

    Args:
        base: base log-probs (or logits; they are normalised first), shape (..., V), any float dtype.
        experts: one tensor per expert, each shaped like `base`.
        weights: one float per expert in [-1e6, 1e6] (negative = anti-expert); default 1.0 each.
        floor: base and expert log-probs are clamped at `floor` (in [-1e9, 0)) so that −inf − (−inf) never
            occurs and an anti-expert's −w·(−inf) cannot become +inf; NaN counts as −inf.
        masks: optional per-expert bool tensors (V,): the expert's log-ratio applies only where True.
        rule, rule_params: a rule of `logitcomp.rules.RULES` and its parameters (`RULES[rule].params`).

    Returns:
        fp32 log-probs of shape (..., V), finite, with logsumexp 0 over the last dim.

    Raises:
        ValueError: on a shape mismatch, a weight outside [-1e6, 1e6] or not finite, a floor outside [-1e9, 0).
    """
    weights = [1.0] * len(experts) if weights is None else list(weights)
    if len(weights) != len(experts):
        raise ValueError(f"weights: expected {len(experts)} (one per expert), got {len(weights)}")
    if masks is not None and len(masks) != len(experts):
        raise ValueError(f"masks: expected {len(experts)} (one per expert or None), got {len(masks)}")
    for i, expert in enumerate(experts):
        if expert.shape != base.shape:
            raise ValueError(f"experts[{i}]: expected shape {tuple(base.shape)}, got {tuple(expert.shape)}")
    masked = any(m is not None for m in masks or ())
    return Composer.build(weights, floor=floor, rule=rule, rule_params=rule_params, masked=masked)(base, experts, masks)


def _product(base: torch.Tensor, experts: Sequence[torch.Tensor], weights: Sequence[float], floor: float) -> torch.Tensor:
    """The product rule without masks: log_softmax((1 − Σ w_i) log p_b + Σ w_i log p_i), the sum of
    `rules.product`, in two (..., V) buffers: at a 262k vocabulary a fresh (B, V) buffer costs more on
    CPU (first-touch page faults) than the arithmetic on it, so each expert's log-probs go into one
    scratch buffer and are added into the base's, which is normalised in place."""
    total = clamped_logprobs(base, floor).mul_(1.0 - sum(weights))  # (..., V)
    scratch = None
    for expert, w in zip(experts, weights):
        scratch = clamped_logprobs(expert, floor, out=scratch)  # (..., V)
        total.add_(scratch, alpha=w)
    return torch.log_softmax(total, dim=-1, out=total)


def _records_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd records an operation on these tensors (then nothing may be written in place)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def clamped_logprobs(logits: torch.Tensor, floor: float = DEFAULT_FLOOR, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 `log_softmax(logits).clamp(min=floor)`, with NaN and ±inf logits made finite first; written
    into `out` (fp32, shaped like `logits`) when given and autograd is not recording, else into new tensors."""
    posinf = torch.finfo(torch.float32).max
    if _records_grad(logits):
        return torch.log_softmax(torch.nan_to_num(logits.float(), nan=floor, posinf=posinf, neginf=floor), dim=-1).clamp(min=floor)
    x = torch.nan_to_num(logits.float(), nan=floor, posinf=posinf, neginf=floor, out=out)
    # normalised and clamped in place (log_softmax writes each element after reading it, so its
    # output may be its input): one (..., V) buffer instead of three
    return torch.log_softmax(x, dim=-1, out=x).clamp_(min=floor)


def apply_eos_policy(
    composed: torch.Tensor,
    base: torch.Tensor,
    experts: Sequence[torch.Tensor],
    eos_ids: Sequence[int] | torch.Tensor,
    policy: str,
    floor: float = DEFAULT_FLOOR,
) -> torch.Tensor:
    """Rescore the EOS tokens of a composed distribution, then renormalise.

    Args:
        composed: composed log-probs (..., V) from `compose_logprobs`.
        base, experts: the log-probs (or logits) the composition was made from.
        eos_ids: token ids that end a sequence (a list, or a tensor (E,) on the logits' device).
        policy: `compose` (leave as is: the paper), `base` (EOS scored by the base alone),
            `any` (max over base and experts), `all` (min over base and experts), `all_experts` (min over
            the experts in use, the base left out: with routing, those whose gate is not 0), `top` (the first
            expert of the largest weight; with routing the model passes per-position weights).

    Returns:
        fp32 log-probs (..., V), normalised.
    """
    check_eos_policy(policy)
    ids = torch.as_tensor(eos_ids, dtype=torch.long, device=composed.device).flatten()  # (E,); no copy when already there
    if EOS_PICKS[policy] is None or ids.numel() == 0:
        return composed
    return _rescore_eos(composed, base, experts, ids, EOS_PICKS[policy], floor, [1.0] * len(experts))


def _all_experts(models: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """EOS log-probs (..., E): the least likely of the experts in use (weight ≠ 0) at each position, the base's where
    none is (a routed position whose gates are all 0 is the base). models: (k+1, ..., E) base first; weights: (k, ..., 1)."""
    if len(models) == 1:  # a composition of no expert: the base
        return models[0]
    off = (weights == 0).expand(models[1:].shape)  # (k, ..., E): experts gated out here
    least = models[1:].masked_fill(off, float("inf")).min(0).values  # (..., E)
    return torch.where(off.all(0), models[0], least)


def _top(models: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """EOS log-probs (..., E) of the expert of the largest weight (the first on a tie) at each position.
    models: (k+1, ..., E) base first; weights: (k, ..., 1)."""
    top = weights.argmax(0, keepdim=True).expand(1, *models.shape[1:])  # (1, ..., E)
    return models[1:].gather(0, top)[0]


# the EOS policies that read no expert of weight 0 (`Composer.sparse`)
SPARSE_EOS = ("compose", "base", "all_experts")
# policy -> how EOS is scored from the stacked models' EOS log-probs (k+1, ..., E) and the experts' weights (k, ..., 1);
# None: as composed
EOS_PICKS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None] = {
    "compose": None, "base": lambda m, w: m[0], "any": lambda m, w: m.max(0).values, "all": lambda m, w: m.min(0).values,
    "all_experts": _all_experts, "top": _top,
}


def _rescore_eos(composed, base, experts, ids: torch.Tensor, pick, floor: float, weights: Sequence) -> torch.Tensor:
    """`apply_eos_policy` with its policy resolved to `pick`, its ids a tensor (E,) on the logits' device, and
    each expert's weight (a float, or a tensor (..., 1) per position)."""
    models = torch.stack([clamped_logprobs(m, floor)[..., ids] for m in (base, *experts)])  # (k+1, ..., E)
    shape = (*models.shape[1:-1], 1)
    stacked = torch.stack([torch.as_tensor(w, dtype=torch.float32, device=models.device).expand(shape) for w in weights]) \
        if len(weights) else models.new_zeros((0, *shape))  # (k, ..., 1)
    eos = pick(models, stacked)  # (..., E)
    eos_mass = torch.logsumexp(eos, dim=-1, keepdim=True).clamp(max=-1e-7)  # (..., 1)
    rest = torch.log1p(-eos_mass.exp())  # log of the mass left to non-EOS tokens
    # The other tokens keep their composed ratios and share what EOS leaves: renormalised without EOS
    # (set to -inf, not cut out by a boolean index, which would wait for the device at every step)
    out = torch.log_softmax(composed.index_fill(-1, ids, float("-inf")), dim=-1) + rest  # (..., V)
    out[..., ids] = eos
    return torch.log_softmax(out, dim=-1)


def kl_divergence(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) over the last dim from log-probs, in fp32: shape (...)."""
    p_log, q_log = p_log.float(), q_log.float()
    return (p_log.exp() * (p_log - q_log)).sum(-1).clamp(min=0.0)


def entropy(log_p: torch.Tensor) -> torch.Tensor:
    """Entropy over the last dim from log-probs, in fp32: shape (...)."""
    log_p = log_p.float()
    return -(log_p.exp() * log_p).sum(-1)


# the logits of one forward, as parts: (logits (n, T', V), slots (n,)), each row's slot = model · B + input (model 0 the
# base, then the LoRA experts, then the full-model experts: `layout.RowLayout.slots`)
Parts = Sequence[tuple[torch.Tensor, torch.Tensor]]


def _non_finite_positions(logits: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor | None, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top logit of every row and position, (n, T') fp32 (NaN and +inf propagate; only −inf gives −inf), and
    where it is not finite at a real (mask 1) position, (n, T') bool. On the logits' device."""
    tops = logits.amax(-1).float()  # (n, T')
    bad = ~torch.isfinite(tops)
    return tops, bad if mask is None else bad & mask[slots % batch, -tops.shape[1]:].bool()


def check_logits(names: list[str], parts: Parts, first: int, mask: torch.Tensor | None, batch: int | None = None) -> None:
    """Raise ValueError naming the first model whose logits hold NaN or +inf, or only −inf, at a real (unpadded)
    position: a broken model or dtype, never clamped into a distribution. Names the input row, the position
    (`first`: the position of column 0) and the token. A −inf logit beside finite ones is a token the model rules
    out (clamped at the floor, as the paper's rule does). Padding (mask 0) is not checked: models may return NaN
    there (Gemma 2 in float64). One (n, T') reduction per part and one host sync.

    Args:
        parts: (logits (n, T', V), slots (n,)) per part (`Parts`); batch: B (default: the mask's rows, else the
            first part's rows).
    """
    batch = batch or (mask.shape[0] if mask is not None else parts[0][0].shape[0])
    bad = [_non_finite_positions(x, slots, mask, batch)[1] for x, slots in parts]  # (n, T') each
    if not any(b.any() for b in bad):
        return
    worst = None
    for (x, slots), b in zip(parts, bad):
        for row, column in b.nonzero().tolist():
            slot = int(slots[row])
            if worst is None or slot < worst[0]:
                worst = (slot, x[row, column], column)
    slot, x, column = worst
    tokens = (torch.isnan(x) | torch.isposinf(x)).nonzero().flatten().tolist()
    what = f"NaN or +inf at token {tokens[0]}" if tokens else "no finite value"
    raise _non_finite(names[slot // batch], what, slot % batch, first + column)


def _non_finite(name: str, what: str, row: int, position: int) -> ValueError:
    return ValueError(f"{name}: its logits hold {what} at row {row}, position {position}; "
                      "check the model's weights and dtype (e.g. float16 overflow)")


class LogitsWatch:
    """`check_logits` for the forwards of one `generate` call, without a host sync per step: each step folds its
    verdict into tensors on the logits' device (the first bad position and top logit of every model and input), and
    `raise_if_bad` reads them once, at the end. On a GPU a per-step check would wait for the device at every token
    (and break a compiled step's graph); here a broken model is named when the call ends, by row and position (the
    token is not kept: finding it would cost a second pass over the vocabulary at every step)."""

    def __init__(self, names: list[str]):
        self.names = names
        self.batch = 0
        self.seen = self.where = self.top = None  # (M · B,) bool, long, float: M = 1 + k models, by slot

    def add(self, parts: Parts, first: int, mask: torch.Tensor | None) -> None:
        """Fold one forward's logits (`Parts`) whose column 0 is at position `first`."""
        for logits, slots in parts:
            if self.seen is None:
                self.batch = mask.shape[0] if mask is not None else logits.shape[0]
                size = len(self.names) * self.batch
                self.seen = torch.zeros(size, dtype=torch.bool, device=logits.device)
                self.where = torch.zeros(size, dtype=torch.long, device=logits.device)
                self.top = torch.zeros(size, device=logits.device)
            tops, bad = _non_finite_positions(logits, slots, mask, self.batch)  # (n, T') each
            column = bad.int().argmax(-1, keepdim=True)  # (n, 1): the first bad column (0 where none)
            fresh = bad.any(-1) & ~self.seen[slots]  # (n,): rows that turn bad at this forward
            self.where[slots] = torch.where(fresh, first + column[:, 0], self.where[slots])
            self.top[slots] = torch.where(fresh, tops.gather(-1, column)[:, 0], self.top[slots])
            self.seen[slots] = self.seen[slots] | fresh

    def raise_if_bad(self) -> None:
        """One host read of the folded verdicts; raise ValueError naming the first model (and its first row) that
        held NaN or +inf, or only −inf, at a real position."""
        if self.seen is None or not self.seen.any():
            return
        slot = int(self.seen.nonzero()[0])
        what = "no finite value" if self.top[slot] == float("-inf") else "NaN or +inf"
        raise _non_finite(self.names[slot // self.batch], what, slot % self.batch, int(self.where[slot]))

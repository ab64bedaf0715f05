"""The composition rule as a pure function, against the formula written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from logitcomp import apply_eos_policy, compose_logprobs, entropy, kl_divergence
from reference import hand_compose

V = 23


def _rand(*shape, seed=0):
    return torch.randn(*shape, V, generator=torch.Generator().manual_seed(seed)) * 3


def _lse_zero(x, tol=1e-5):
    assert torch.isfinite(x).all()
    assert (torch.logsumexp(x, -1).abs() <= tol).all()


@pytest.mark.parametrize("weights", [None, [1.0, 1.0], [0.5, 2.0], [-1.0, 1.0], [0.0, 0.0]])
def test_matches_hand_formula(weights):
    base, e1, e2 = (torch.log_softmax(_rand(4, 5, seed=s), -1) for s in range(3))
    out = compose_logprobs(base, [e1, e2], weights)
    ref = hand_compose(base.double(), [e1.double(), e2.double()], weights or [1.0, 1.0])
    assert out.dtype == torch.float32
    assert (out.double() - ref).abs().max() <= 1e-5
    _lse_zero(out)


def test_weight_zero_is_base_and_single_expert_is_that_expert():
    base, e1 = torch.log_softmax(_rand(3, seed=1), -1), torch.log_softmax(_rand(3, seed=2), -1)
    assert (compose_logprobs(base, [e1], [0.0]) - base).abs().max() <= 1e-5
    assert (compose_logprobs(base, [e1], [1.0]) - e1).abs().max() <= 1e-5


def test_accepts_raw_logits():
    base, e1 = _rand(3, seed=1), _rand(3, seed=2)
    ref = hand_compose(torch.log_softmax(base.double(), -1), [torch.log_softmax(e1.double(), -1)], [1.0])
    assert (compose_logprobs(base, [e1]).double() - ref).abs().max() <= 1e-5


def test_minus_inf_never_gives_nan():
    base, e1, e2 = (_rand(2, seed=s) for s in range(3))
    base[:, :3] = -math.inf
    e1[:, 2:5] = -math.inf  # token 2 is -inf in both base and e1
    e2[:, 0] = -math.inf
    for weights in ([1.0, 1.0], [-1.0, 2.0]):
        _lse_zero(compose_logprobs(base, [e1, e2], weights))
    # a token every model rules out stays (practically) impossible
    assert compose_logprobs(base, [e1, e2])[:, 2].max() < -1000


def test_floor_is_applied_to_base_and_experts():
    base = torch.log_softmax(_rand(1, seed=3), -1)
    base[0, 0] = -50.0
    e1 = torch.log_softmax(_rand(1, seed=4), -1)
    out = compose_logprobs(base, [e1], [1.0], floor=-10.0)
    lb, le = base.clamp(min=-10.0).double(), e1.clamp(min=-10.0).double()
    assert (out.double() - hand_compose(lb, [le], [1.0])).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_extremes(dtype):
    info = torch.finfo(dtype)
    base = _rand(2, seed=5).to(dtype)
    base[0, 0], base[0, 1], base[1, 2] = info.max, info.min, -math.inf
    e1 = _rand(2, seed=6).to(dtype)
    e1[0, 0], e1[1, 3], e1[1, 4] = info.min, info.max, math.inf
    e2 = torch.full((2, V), info.max, dtype=dtype)
    for weights in ([1.0, 1.0], [-2.0, 3.0]):
        out = compose_logprobs(base, [e1, e2], weights)
        assert out.dtype == torch.float32
        _lse_zero(out)


def test_nan_inputs_and_bad_weights():
    base, e1 = _rand(2, seed=7), _rand(2, seed=8)
    e1[0, 0] = float("nan")
    _lse_zero(compose_logprobs(base, [e1]))
    for bad in (float("nan"), float("inf"), -float("inf"), "1", None, True):
        with pytest.raises(ValueError, match="weight of expert #0: expected a finite number"):
            compose_logprobs(base, [e1], [bad])
    with pytest.raises(ValueError, match="weights: expected 1"):
        compose_logprobs(base, [e1], [1.0, 1.0])
    with pytest.raises(ValueError, match="floor"):
        compose_logprobs(base, [e1], floor=0.0)
    with pytest.raises(ValueError, match=r"experts\[0\]: expected shape"):
        compose_logprobs(base, [e1[:, :5]])


@pytest.mark.parametrize("floor", [-1e4, -1e9])
def test_extreme_finite_weights_stay_finite_or_are_refused(floor):
    """The largest allowed weights and floor still give finite log-probs; larger weights are refused by name."""
    base, e1, e2 = _rand(3, 2, seed=11)
    e1[0, :3] = float("-inf")  # log-ratios as large as the floor allows
    out = compose_logprobs(base, [e1, e2], [1e6, -1e6], floor=floor)
    assert torch.isfinite(out).all()
    _lse_zero(out)
    for bad in (3e38, -1e7):
        with pytest.raises(ValueError, match=r"weight of expert #1: expected a number in \[-1e6, 1e6\]"):
            compose_logprobs(base, [e1, e2], [1.0, bad])
    with pytest.raises(ValueError, match=r"floor: expected a negative number >= -1e9"):
        compose_logprobs(base, [e1], floor=-1e10)


@pytest.mark.parametrize("masks", [None, "ones"])
def test_inputs_are_not_mutated(masks):
    base, e1, e2 = _rand(2, seed=9), _rand(2, seed=10), _rand(2, seed=11)
    before = [t.clone() for t in (base, e1, e2)]
    compose_logprobs(base, [e1, e2], [-1.0, 0.5], masks=None if masks is None else [torch.ones(V, dtype=torch.bool)] * 2)
    assert all(torch.equal(t, b) for t, b in zip((base, e1, e2), before))


def test_product_in_two_buffers_equals_the_rule_at_a_262k_vocabulary():
    """The unmasked product normalises in place (log_softmax's output aliasing its input) and adds
    the experts into one buffer: equal to the formula by hand in float64 over 262,144 tokens and to
    the general path (masks of ones)."""
    g = torch.Generator().manual_seed(3)
    base, *experts = (torch.randn(2, 3, 262_144, generator=g) * 4 for _ in range(4))  # (B, T, V), k = 3
    experts[1][0, 0, :5] = float("-inf")  # clamped at the floor, as in the general path
    weights = [1.0, 0.7, -0.4]
    got = compose_logprobs(base, experts, weights)
    lb, *lps = (torch.log_softmax(x.double(), -1).clamp(min=-1e4) for x in (base, *experts))  # the floor by default
    ref = hand_compose(lb, lps, weights)
    general = compose_logprobs(base, experts, weights, masks=[torch.ones(262_144, dtype=torch.bool)] * 3)
    # fp32: 1e-4 nats, and its rounding at the floored tokens (about −7000 nats here: 5e-4)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(got, general, rtol=1e-6, atol=1e-4)


def test_masks_restrict_each_expert_to_its_tokens():
    base, e1, e2 = (torch.log_softmax(_rand(3, seed=s), -1).double() for s in (11, 12, 13))
    m1 = torch.zeros(V, dtype=torch.bool)
    m1[:7] = True
    out = compose_logprobs(base, [e1, e2], [1.0, 0.5], masks=[m1, None])
    total = base + m1.double() * (e1 - base) + 0.5 * (e2 - base)
    assert (out.double() - torch.log_softmax(total, -1)).abs().max() <= 1e-5


@pytest.mark.parametrize("policy", ["base", "any", "all", "all_experts"])
def test_eos_policies(policy):
    base, e1, e2 = (torch.log_softmax(_rand(4, seed=s), -1).double() for s in (14, 15, 16))
    composed = compose_logprobs(base, [e1, e2])
    eos = 5
    out = apply_eos_policy(composed, base, [e1, e2], [eos], policy).double()
    stack = torch.stack([base[:, eos], e1[:, eos], e2[:, eos]])
    want_eos = {"base": stack[0], "any": stack.max(0).values, "all": stack.min(0).values,
                "all_experts": torch.minimum(e1[:, eos], e2[:, eos])}[policy]
    assert (out[:, eos] - want_eos).abs().max() <= 1e-5
    others = [i for i in range(V) if i != eos]
    # non-EOS tokens keep their composed ratios
    ratio = out[:, others] - composed.double()[:, others]
    assert (ratio - ratio[:, :1]).abs().max() <= 1e-5
    _lse_zero(out.float())


def test_eos_policy_compose_is_identity_and_unknown_is_refused():
    base, e1 = torch.log_softmax(_rand(2, seed=17), -1), torch.log_softmax(_rand(2, seed=18), -1)
    composed = compose_logprobs(base, [e1])
    assert torch.equal(apply_eos_policy(composed, base, [e1], [1], "compose"), composed)
    with pytest.raises(ValueError, match="eos_policy: expected one of"):
        apply_eos_policy(composed, base, [e1], [1], "first")


def test_kl_and_entropy_by_hand():
    p, q = torch.log_softmax(_rand(2, seed=19), -1).double(), torch.log_softmax(_rand(2, seed=20), -1).double()
    kl = sum(p[:, i].exp() * (p[:, i] - q[:, i]) for i in range(V))
    assert (kl_divergence(p, q).double() - kl).abs().max() <= 1e-5
    ent = -sum(p[:, i].exp() * p[:, i] for i in range(V))
    assert (entropy(p).double() - ent).abs().max() <= 1e-5
    assert kl_divergence(p, p).abs().max() <= 1e-6


def test_gradients_flow_through_the_product_as_through_the_general_path():
    """Autograd cannot record in-place or out= writes: with gradients on, the product takes new tensors."""
    grads = []
    for masks in (None, [torch.ones(V, dtype=torch.bool)] * 2):
        base, e1, e2 = (_rand(2, seed=s).requires_grad_() for s in (20, 21, 22))
        compose_logprobs(base, [e1, e2], [1.0, 0.5], masks=masks)[..., 0].sum().backward()
        grads.append(torch.cat([t.grad for t in (base, e1, e2)]))
    assert grads[0].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1])

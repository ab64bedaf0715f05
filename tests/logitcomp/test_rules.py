"""Composition rules (logitcomp/rules.py) against hand computations, their reductions to `product`
and to the base, and their use through CompositionConfig, the composed model, masks and EOS policies."""

from __future__ import annotations

import math

import pytest
import torch

from logitcomp import CompositionConfig, compose_logprobs
from logitcomp.ops import clamped_logprobs
from logitcomp.rules import RULES
from reference import hand_compose

V = 17


def _logp(*shape, seed):
    return torch.log_softmax(torch.randn(*shape, V, generator=torch.Generator().manual_seed(seed)).double() * 3, -1)


def _norm(x):
    return x - torch.logsumexp(x, -1, keepdim=True)


def _close(a, b, tol=1e-5):
    assert (a.double() - b.double()).abs().max() <= tol, (a.double() - b.double()).abs().max()


BASE, E1, E2, E3 = (_logp(3, 4, seed=s) for s in range(4))
W = [1.0, 0.5, -0.7]


def _kl(p_log, q_log):  # (…,): Σ p (log p − log q), written out
    return (p_log.exp() * (p_log - q_log)).sum(-1)


def test_every_registered_rule_declares_its_formula_and_parameters_in_range():
    assert len(RULES) >= 6 and list(RULES)[0] == "product"
    for name, rule in RULES.items():
        assert rule.name == name and rule.formula and callable(rule.function)
        assert rule.check({}) == {k: p.default for k, p in rule.params.items()}
        assert all(p.low <= p.default <= p.high for p in rule.params.values()), name


def test_product_is_bit_for_bit_the_papers_rule_as_before():
    """The earlier compose_logprobs, inlined: product must give identical bits."""
    masks = [None, torch.rand(V, generator=torch.Generator().manual_seed(9)) > 0.5, None]
    experts = [E1.float(), E2.float(), E3.float()]
    lb = clamped_logprobs(BASE.float())
    total = lb.clone()
    for expert, w, m in zip(experts, W, masks):
        ratio = clamped_logprobs(expert) - lb
        if m is not None:
            ratio = ratio * m.to(ratio.device, ratio.dtype)
        total = total + w * ratio
    assert torch.equal(compose_logprobs(BASE.float(), experts, W, masks=masks), torch.log_softmax(total, -1))


def test_tempered_against_hand_computation_and_scale_one_is_product():
    got = compose_logprobs(BASE, [E1, E2, E3], W, rule="tempered", rule_params={"scale": 0.25})
    _close(got, _norm(BASE + 0.25 * sum(w * (e - BASE) for w, e in zip(W, (E1, E2, E3)))))
    # scale 1/Σw: the experts' normalised geometric mean, no base left
    _close(compose_logprobs(BASE, [E1, E2], rule="tempered", rule_params={"scale": 0.5}), _norm((E1 + E2) / 2))
    _close(compose_logprobs(BASE, [E1, E2], W[:2], rule="tempered", rule_params={"scale": 1.0}), hand_compose(BASE, [E1, E2], W[:2]))


def test_activity_against_hand_computation_and_its_limits():
    kl = torch.stack([_kl(e, BASE) for e in (E1, E2, E3)])  # (3, 3, 4)
    gates = (kl / kl.max(0).values) ** 2.0
    want = _norm(BASE + sum(w * g.unsqueeze(-1) * (e - BASE) for w, g, e in zip(W, gates, (E1, E2, E3))))
    _close(compose_logprobs(BASE, [E1, E2, E3], W, rule="activity", rule_params={"gamma": 2.0}), want)
    # gamma 0: every gate open, the product; gamma large: the most active expert alone
    _close(compose_logprobs(BASE, [E1, E2, E3], W, rule="activity", rule_params={"gamma": 0.0}), hand_compose(BASE, [E1, E2, E3], W))
    # gamma large: the most active expert alone (here the other is 10x less active: its gate is 0.1^20)
    weak = _norm(BASE + 0.03 * (E2 - BASE))
    assert (_kl(weak, BASE) < 0.1 * _kl(E1, BASE)).all()
    _close(compose_logprobs(BASE, [E1, weak], rule="activity", rule_params={"gamma": 20.0}), E1)


def test_confident_against_hand_computation_and_gamma_zero_is_product():
    gates = [e.exp().max(-1, keepdim=True).values ** 3.0 for e in (E1, E2, E3)]  # (max_y p_i(y))^γ
    want = _norm(BASE + sum(w * g * (e - BASE) for w, g, e in zip(W, gates, (E1, E2, E3))))
    _close(compose_logprobs(BASE, [E1, E2, E3], W, rule="confident", rule_params={"gamma": 3.0}), want)
    _close(compose_logprobs(BASE, [E1, E2, E3], W, rule="confident", rule_params={"gamma": 0.0}), hand_compose(BASE, [E1, E2, E3], W))


def test_union_against_hand_computation():
    ratios = torch.stack([w * (e - BASE) for w, e in zip(W, (E1, E2, E3))])
    _close(compose_logprobs(BASE, [E1, E2, E3], W, rule="union"), _norm(BASE + ratios.max(0).values))
    _close(compose_logprobs(BASE, [E1], rule="union"), E1)


def test_plausible_against_hand_computation_and_alpha_zero_is_product():
    alpha = 0.2
    product = hand_compose(BASE, [E1, E2], [1.0, 1.0])
    models = torch.stack([BASE, E1, E2])
    keep = (models.exp() >= alpha * models.exp().max(-1, keepdim=True).values).any(0)
    want = _norm(torch.where(keep, product, torch.full_like(product, -math.inf)))
    got = compose_logprobs(BASE, [E1, E2], rule="plausible", rule_params={"alpha": alpha})
    assert torch.isfinite(got).all()
    _close(got.exp(), want.exp(), tol=1e-6)
    _close(compose_logprobs(BASE, [E1, E2], rule="plausible", rule_params={"alpha": 0.0}), product)


def _base_kept(models, alpha):
    """The base restricted to the tokens some model finds plausible (plausible's base case)."""
    models = torch.stack(models)
    keep = (models.exp() >= alpha * models.exp().max(-1, keepdim=True).values).any(0)
    return _norm(torch.where(keep, BASE, torch.full_like(BASE, -math.inf)))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_is_the_base_when_no_expert_moves_and_keeps_masks(rule):
    """No log-ratio anywhere (experts equal to the base, or masks all False): the base (plausible:
    the base restricted to the tokens that the base or an expert finds plausible)."""
    params = {"tempered": {"scale": 0.7}, "activity": {"gamma": 1.5}, "confident": {"gamma": 2.0}, "plausible": {"alpha": 0.05}}.get(rule, {})
    off = torch.zeros(V, dtype=torch.bool)
    for experts, masks in (([BASE, BASE], None), ([E1, E2], [off, off])):
        got = compose_logprobs(BASE, experts, masks=masks, rule=rule, rule_params=params)
        if rule == "plausible":
            _close(got.exp(), _base_kept([BASE, *experts], 0.05).exp(), tol=1e-6)
        else:
            _close(got, BASE)
    weights = [abs(w) for w in W] if RULES[rule].nonnegative else W  # mixture: weights >= 0 only
    out = compose_logprobs(BASE, [E1, E2, E3], weights, rule=rule, rule_params=params)
    assert torch.isfinite(out).all() and (torch.logsumexp(out, -1).abs() <= 1e-5).all()


def test_rule_parameters_are_validated_by_name():
    assert CompositionConfig(rule="activity").rule_params == {"gamma": 1.0}
    for kwargs, message in (({"rule": "blend"}, r"rule: expected one of \['product'"),
                            ({"rule": "activity", "rule_params": {"alpha": 1}}, r"rule_params: activity takes \['gamma'\], got 'alpha'"),
                            ({"rule": "plausible", "rule_params": {"alpha": 2}}, r"rule_params\.alpha: expected a number in \[0, 1\], got 2"),
                            ({"rule": "product", "rule_params": {"scale": 1}}, r"rule_params: product takes no parameters, got 'scale'")):
        with pytest.raises(ValueError, match=message):
            CompositionConfig(**kwargs)


def test_the_model_compiles_its_composition_once_and_a_step_checks_nothing(tiny, monkeypatch):
    """Built (or assigned) once into a Composer; generate's steps call no check; a new config is seen."""
    from logitcomp import ComposedModelForCausalLM
    from logitcomp.ops import Composer
    from logitcomp.rules import Rule

    experts = {"a": tiny.adapters["a"], "b": tiny.adapters["b"]}
    config = CompositionConfig(rule="activity", rule_params={"gamma": 2.0}, eos_policy="any")
    composed = ComposedModelForCausalLM.from_experts(tiny.base, experts, config=config)
    ids = torch.tensor([[1, 40, 41, 42]])
    calls = []
    for owner, name in ((Composer, "build"), (Rule, "check"), (CompositionConfig, "__post_init__")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    out = composed.generate(ids, max_new_tokens=6, do_sample=False, min_new_tokens=6)
    assert calls == [] and out.shape == (1, 10)
    # the step's numbers are the checked rule's: the formula by hand on the same forward's logits
    logits = composed(ids).logits[0, -1]
    lb, la, lbb = (ComposedModelForCausalLM.from_experts(tiny.base, experts, {"a": w_a, "b": w_b})(ids).logits[0, -1]
                   for w_a, w_b in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0)))  # base, a alone, b alone (product with zero weights)
    want = compose_logprobs(lb, [la, lbb], rule="activity", rule_params={"gamma": 2.0})
    eos = composed.generation_config.eos_token_id
    if eos is not None:
        from logitcomp import apply_eos_policy

        want = apply_eos_policy(want, lb, [la, lbb], [eos] if isinstance(eos, int) else eos, "any")
    _close(logits, want)
    calls.clear()
    composed.composition = CompositionConfig(weights={"a": 0.0, "b": 0.0})  # checked and compiled once, here
    assert calls.count("build") == 1
    _close(composed(ids).logits[0, -1], lb)

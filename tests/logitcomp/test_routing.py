"""Hidden-state routing (logitcomp/routing.py), the mixture rule and the `top` EOS policy: against hand
computations in float64, their reductions (equal posteriors: the fixed-weight rule; one expert certain:
that expert), and the routed model against separately loaded models with the gates computed by hand."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp import ComposedModelForCausalLM, CompositionConfig, compose_logprobs, fit_routing
from logitcomp.ops import Composer, apply_eos_policy
from logitcomp.routing import Router, discriminants, routing_config, running_means, running_peaks
from reference import merged_expert, row_logprobs

V = 11
ROUTE_PROMPTS = {"a": ["ABAB>", "AAB>BA", "BAAB>"], "b": ["PQRS>", "SRQP>P", "QQ>RS"]}
PROMPTS = ["ABBA>", "PRQ>SQRP", "AQ>"]  # different lengths: left padding


def _logp(*shape, seed):
    return torch.log_softmax(torch.randn(*shape, V, generator=torch.Generator().manual_seed(seed)).double() * 3, -1)


def _close(a, b, tol=1e-6):
    assert (a.double() - b.double()).abs().max() <= tol, (a.double() - b.double()).abs().max()


def _hand_gates(means, centroids, tau, threshold):
    """g_i = π_i / max π where π_i ≥ θ max π, π = softmax(cos(h − μ, c_i − μ) / τ), one position at a time."""
    centre = sum(centroids) / len(centroids)
    out = []
    for h in means:
        cos = torch.stack([torch.dot(h - centre, c - centre) / ((h - centre).norm() * (c - centre).norm()) for c in centroids])
        pi = torch.exp(cos / tau) / torch.exp(cos / tau).sum()
        out.append(torch.where(pi >= threshold * pi.max(), pi / pi.max(), torch.zeros_like(pi)))
    return torch.stack(out)


def test_gates_are_the_documented_formula():
    gen = torch.Generator().manual_seed(0)
    centroids, means = torch.randn(3, 5, generator=gen).double(), torch.randn(7, 5, generator=gen).double()
    for tau, threshold in ((0.5, 0.0), (0.05, 0.3), (2.0, 1.0)):
        router = Router(centroids, tau, threshold).double()
        _close(router.gates(means), _hand_gates(means, list(centroids), tau, threshold))
        assert (router.gates(means).amax(-1) == 1).all()  # the top expert always keeps its weight
    assert (Router(centroids, 0.1, 1.0).double().gates(means).sum(-1) == 1).all()  # θ = 1: the top one alone


def _hand_detectors(means: dict, shrinkage: float):
    """(v (k, d), o (k,)) by the module's formula, one expert and one prompt at a time, in numpy float64."""
    import numpy as np

    x = {n: m.double().numpy() for n, m in means.items()}
    names = list(x)
    centroids = np.stack([x[n].mean(0) for n in names])
    centre = centroids.mean(0)
    d = centre.size
    cov = sum(np.outer(p - centroids[i], p - centroids[i]) for i, n in enumerate(names) for p in x[n]) / sum(len(x[n]) for n in names)
    precision = np.linalg.inv(cov + shrinkage * np.trace(cov) / d * np.eye(d))
    v, o = [], []
    for i, n in enumerate(names):
        raw = precision @ (centroids[i] - centre)
        own = np.mean([(p - centre) @ raw for p in x[n]])
        other = np.mean([(p - centre) @ raw for m in names if m != n for p in x[m]])
        v.append(raw / (own - other))
        o.append(other / (own - other))
    return torch.tensor(np.stack(v)), torch.tensor(o)


def test_discriminant_gates_are_the_documented_formula_and_score_one_on_own_prompts_zero_on_the_others():
    gen = torch.Generator().manual_seed(2)
    means = {n: torch.randn(6 + i, 5, generator=gen).double() + 2 * torch.eye(5)[i] for i, n in enumerate("abc")}
    queries = torch.randn(9, 5, generator=gen).double()
    for shrinkage, threshold in ((1.0, 0.0), (0.1, 0.5), (10.0, 1.0)):
        routing = routing_config(means, threshold=threshold, score="discriminant", shrinkage=shrinkage)
        v, o = _hand_detectors(means, shrinkage)
        _close(torch.tensor([routing["detectors"][n]["direction"] for n in "abc"], dtype=torch.float64), v, tol=1e-9)
        _close(torch.tensor([routing["detectors"][n]["offset"] for n in "abc"], dtype=torch.float64), o, tol=1e-9)
        router = Router.from_config(routing, list("abc"), dtype=torch.float64)
        centre = torch.stack([m.mean(0) for m in means.values()]).mean(0)
        _close(router.scores(queries), (queries - centre) @ v.T - o)  # z before the clamp
        assert (router.scores(queries) < 0).any()  # so the clamp is not what the line above checks
        z = ((queries - centre) @ v.T - o).clamp(min=0)  # (9, 3)
        top = z.amax(-1, keepdim=True)
        keep = (z >= threshold * top) & (z > 0)  # kept: evidence, and at least θ · the top one's
        _close(router.gates(queries), torch.where(keep, z / top, torch.zeros_like(z)))
        binary = Router.from_config(routing | {"gates": "binary"}, list("abc"), dtype=torch.float64)
        assert torch.equal(binary.gates(queries), keep.float())  # binary: every kept expert at gate 1
        assert threshold > 0 or not keep.all()  # θ = 0: an expert without evidence is still not kept
        for i, n in enumerate("abc"):  # z_i: mean 1 over expert i's own prompts, 0 over the other experts' prompts
            z_own = (means[n] - centre) @ v[i] - o[i]
            z_other = torch.cat([(means[m] - centre) @ v[i] - o[i] for m in "abc" if m != n])
            assert abs(z_own.mean() - 1) < 1e-9 and abs(z_other.mean()) < 1e-9


def test_floors_raise_each_detectors_offset_and_binary_gates_at_theta_0_keep_exactly_the_experts_above_them():
    gen = torch.Generator().manual_seed(5)
    means = {n: torch.randn(6, 4, generator=gen).double() + 2 * torch.eye(4)[i] for i, n in enumerate("abc")}
    queries = torch.randn(12, 4, generator=gen).double()
    floors = {"a": 0.4, "c": -0.2}
    plain = routing_config(means, score="discriminant", shrinkage=0.5, gates="binary")
    floored = routing_config(means, score="discriminant", shrinkage=0.5, gates="binary", floors=floors)
    for n in "abc":  # the same direction; the offset raised by the floor (0 for an expert not named)
        assert floored["detectors"][n]["direction"] == plain["detectors"][n]["direction"]
        assert floored["detectors"][n]["offset"] == plain["detectors"][n]["offset"] + floors.get(n, 0.0)
    z = Router.from_config(plain, list("abc"), dtype=torch.float64).scores(queries)  # (12, 3) without floors
    above = z > torch.tensor([floors.get(n, 0.0) for n in "abc"], dtype=torch.float64)  # (12, 3)
    assert above.any() and not above.all()  # so the comparison below can fail
    assert torch.equal(Router.from_config(floored, list("abc"), dtype=torch.float64).gates(queries), above.float())
    with pytest.raises(ValueError, match=r"^routing floors: need score discriminant"):
        routing_config(means, floors={"a": 0.1})
    with pytest.raises(ValueError, match=r"^routing floors: 'd' is not a routed expert; expected names from \['a', 'b', 'c'\]$"):
        routing_config(means, score="discriminant", floors={"d": 0.1})


def test_set_weights_scale_the_gates_of_exactly_their_kept_set_and_weight_one_changes_nothing():
    gen = torch.Generator().manual_seed(9)
    means = {n: torch.randn(6, 4, generator=gen).double() + 2 * torch.eye(4)[i] for i, n in enumerate("abc")}
    queries = torch.randn(40, 4, generator=gen).double()
    sets = [{"experts": ["c", "a"], "weight": 1.5}, {"experts": ["c"], "weight": 0.5}]
    for gates in ("binary", "scaled"):
        plain = routing_config(means, score="discriminant", shrinkage=0.5, gates=gates)
        g = Router.from_config(plain, list("abc"), dtype=torch.float64).gates(queries)  # (40, 3) without set weights
        kept = [tuple(n for n, x in zip("abc", row) if x > 0) for row in g.tolist()]
        assert {("a", "c"), ("c",)} <= set(kept) and len(set(kept)) > 2  # both sets occur, and others too
        factor = torch.tensor([1.5 if k == ("a", "c") else 0.5 if k == ("c",) else 1.0 for k in kept], dtype=torch.float64)
        scaled = Router.from_config(plain | {"set_weights": sets}, list("abc"), dtype=torch.float64)
        _close(scaled.gates(queries), g * factor.unsqueeze(-1))  # the hand factor of each position's kept set
        ones = [{"experts": s["experts"], "weight": 1.0} for s in sets]
        assert torch.equal(Router.from_config(plain | {"set_weights": ones}, list("abc"), dtype=torch.float64).gates(queries), g)
    assert routing_config(means, score="discriminant", set_weights=sets)["set_weights"] == sets  # passed on as given
    checked = CompositionConfig(routing=routing_config(means, score="discriminant", set_weights=sets)).routing["set_weights"]
    assert checked == [{"experts": ["a", "c"], "weight": 1.5}, {"experts": ["c"], "weight": 0.5}]  # in the centroids' order


def test_discriminant_reductions_equal_evidence_one_expert_and_none():
    base, e1, e2 = _logp(3, seed=6), _logp(3, seed=7), _logp(3, seed=8)
    d = 2
    detect = lambda v, o: Router(torch.zeros(2, d), 0.1, 0.5, (torch.tensor(v), torch.tensor(o)))  # noqa: E731
    h = torch.tensor([[1.0, 0.0]])
    assert detect([[1.0, 0.0], [1.0, 0.0]], [0.0, 0.0]).gates(h).tolist() == [[1.0, 1.0]]  # equal evidence: both, weight 1
    assert detect([[1.0, 0.0], [0.0, 1.0]], [0.0, 0.0]).gates(h).tolist() == [[1.0, 0.0]]  # only the first detected
    both = Router(torch.zeros(2, d), 0.1, 0.5, (torch.tensor([[1.0, 0.0], [0.6, 0.0]]), torch.zeros(2)), binary=True)
    assert both.gates(h).tolist() == [[1.0, 1.0]]  # binary: both kept (0.6 ≥ 0.5 · 1), each at its full weight
    none = detect([[-1.0, 0.0], [0.0, 1.0]], [0.0, 0.0]).gates(h)  # no evidence for either: every gate 0
    assert none.tolist() == [[0.0, 0.0]]
    _close(Composer.build([1.0, 1.0])(base, [e1, e2], gates=none.expand(3, 2).double()), base, tol=1e-6)  # the product: the base
    assert discriminants({"only": torch.randn(4, d)}) == {"only": {"direction": [0.0] * d, "offset": -1.0}}  # one expert: always 1
    with pytest.raises(ValueError, match=r"routing: expert 'a''s prompts score no higher than the other experts' \(0 <= 0\)"):
        discriminants({"a": torch.tensor([[0.0, 1.0], [0.0, -1.0]]), "b": torch.tensor([[0.0, 1.0], [0.0, -1.0]])})


def _hand_peak_detectors(tokens: dict, shrinkage: float):
    """(v (k, d), o (k,)) of `pool: max`: `_hand_detectors` of every token, then rescaled so that a prompt's
    maximum score over its tokens is 1 on average over the expert's prompts and 0 over the others', one prompt
    and one token at a time."""
    v, o = _hand_detectors({n: torch.cat(ts) for n, ts in tokens.items()}, shrinkage)
    centre = torch.stack([torch.cat(ts).double().mean(0) for ts in tokens.values()]).mean(0)
    names, vs, os = list(tokens), [], []
    for i, n in enumerate(names):
        peak = lambda t: max(float(torch.dot(h - centre, v[i]) - o[i]) for h in t.double())  # noqa: E731
        own = sum(map(peak, tokens[n])) / len(tokens[n])
        others = [peak(t) for m in names if m != n for t in tokens[m]]
        other = sum(others) / len(others)
        vs.append(v[i] / (own - other))
        os.append((o[i] + other) / (own - other))
    return torch.stack(vs), torch.stack(os)


def _hand_peak_gates(hidden, centroids, detectors, threshold):
    """g at each position t of one row's hidden states (T, d): the module's gates of z_i,t = max_{s ≤ t} (h_s − μ)·v_i − o_i;
    and the positions (T,) whose gates float rounding decides: no evidence above 1e-6 while some z_i,t is within 1e-6
    of 0, or an evidence within 1e-6 of θ · the top one (the first token, BOS, is the same in every prompt: where
    it is the maximum of the other experts' prompts, the rescaled detector puts it at 0 exactly)."""
    centre = (sum(centroids) / len(centroids)).double()
    v, o = detectors[0].double(), detectors[1].double()
    out, ties, peak = [], [], None
    for h in hidden.double():
        z = torch.stack([torch.dot(h - centre, v[i]) - o[i] for i in range(len(o))])
        peak = z if peak is None else torch.maximum(peak, z)
        e = peak.clamp(min=0)
        out.append(torch.where((e >= threshold * e.max()) & (e > 0), e / e.max(), torch.zeros_like(e)))
        ties.append(bool((e.max() < 1e-6 and (peak.abs() < 1e-6).any()) or ((e - threshold * e.max()).abs() < 1e-6).any()))
    return torch.stack(out), torch.tensor(ties)


def _random_tokens(seed):
    """Expert -> token states of its prompts (a list of (T_i, 5)), each expert's prompts with one token that shows it."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i, n in enumerate("abc"):
        prompts = []
        for j in range(5 + i):
            t = torch.randn(3 + j % 4, 5, generator=gen).double()
            t[j % len(t)] += 3 * torch.eye(5, dtype=torch.float64)[i]
            prompts.append(t)
        out[n] = prompts
    return out


def test_peak_detectors_are_the_documented_formula_and_a_prompts_maximum_scores_one_on_own_prompts_zero_on_the_others():
    tokens = _random_tokens(3)
    for shrinkage in (0.1, 1.0):
        routing = routing_config(tokens, threshold=0.5, score="discriminant", shrinkage=shrinkage, pool="max")
        assert routing["pool"] == "max"
        _close(torch.tensor(routing["centroids"]["b"]), torch.cat(tokens["b"]).mean(0), tol=1e-6)  # the tokens' mean
        v, o = _hand_peak_detectors(tokens, shrinkage)
        _close(torch.tensor([routing["detectors"][n]["direction"] for n in "abc"], dtype=torch.float64), v, tol=1e-9)
        _close(torch.tensor([routing["detectors"][n]["offset"] for n in "abc"], dtype=torch.float64), o, tol=1e-9)
        router = Router.from_config(routing, list("abc"), dtype=torch.float64)
        for i, n in enumerate("abc"):
            own = torch.stack([router.scores(t)[:, i].max() for t in tokens[n]])
            other = torch.stack([router.scores(t)[:, i].max() for m in "abc" if m != n for t in tokens[m]])
            assert abs(own.mean() - 1) < 1e-9 and abs(other.mean()) < 1e-9
    with pytest.raises(ValueError, match=r"routing pool: expected one of \['mean', 'max'\] \(max with score discriminant\), got 'max'"):
        routing_config(tokens, pool="max")  # cosine posteriors have no token-level form
    single = routing_config({"a": tokens["a"]}, score="discriminant", pool="max")
    assert single["detectors"]["a"]["offset"] == -1.0  # one expert: always detected


def test_running_peaks_leave_out_padding_continue_from_a_state_and_hold_the_prompts():
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 5, 3, generator=gen)
    scores[0, :2] = 100.0  # on padding: must not count
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    peaks, state = running_peaks(scores, mask, None)
    for t in range(5):
        _close(peaks[1, t], scores[1, :t + 1].amax(0))
        if t >= 2:
            _close(peaks[0, t], scores[0, 2:t + 1].amax(0))
    assert torch.isinf(peaks[0, :2]).all() and torch.equal(state, peaks[:, -1])
    head, mid = running_peaks(scores[:, :2], mask[:, :2], None)
    tail, _ = running_peaks(scores[:, 2:], mask[:, 2:], mid)
    assert torch.equal(torch.cat([head, tail], 1), peaks)
    # a router's step: the gates of the running maxima, or (held) of the state at every position
    v, o = torch.randn(3, 4, generator=gen), torch.randn(3, generator=gen)
    router = Router(torch.randn(3, 4, generator=gen), 0.1, 0.4, (v, o), pool="max")
    hidden = torch.randn(2, 5, 4, generator=gen)
    gates, state = router.step_gates(hidden, mask, None, 5)
    for row, start in ((0, 2), (1, 0)):
        hand, ties = _hand_peak_gates(hidden[row, start:], [router.centre], (v, o), 0.4)
        assert not ties.any()
        _close(gates[row, start:], hand, tol=1e-5)
    held, same = router.step_gates(None, None, state, 3)
    assert same is state and torch.equal(held, gates[:, -1:].expand(-1, 3, -1))
    with pytest.raises(ValueError, match=r"routing\.pool: expected one of \['mean', 'max'\] \(max with detectors\), got 'max'"):
        Router(torch.randn(3, 4), 0.1, 0.4, pool="max")


def test_running_means_leave_out_padding_and_continue_from_a_state():
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 5, 3, generator=gen).double()
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    means, (sums, counts) = running_means(hidden, mask, None)
    _close(means[0, 3], hidden[0, 2:4].mean(0).float())
    _close(means[1, 4], hidden[1].mean(0).float())
    assert means[0, :2].abs().max() == 0 and counts.flatten().tolist() == [3, 5]
    head, state = running_means(hidden[:, :2], mask[:, :2], None)
    tail, _ = running_means(hidden[:, 2:], mask[:, 2:], state)
    _close(torch.cat([head, tail], 1), means)


@pytest.mark.parametrize("rule", ["product", "mixture", "tempered"])
def test_equal_posteriors_give_the_fixed_weight_rule_and_a_certain_one_gives_that_expert(rule):
    base, e1, e2 = _logp(2, 3, seed=0), _logp(2, 3, seed=1), _logp(2, 3, seed=2)
    weights = [1.0, 1.0]
    composer = Composer.build(weights, rule=rule)
    fixed = compose_logprobs(base, [e1, e2], weights, rule=rule)
    _close(composer(base, [e1, e2], gates=torch.ones(2, 3, 2)), fixed, tol=1e-5)
    # identical centroids: every cosine 0, π uniform, every gate 1
    router = Router(torch.ones(2, 4), tau=0.1, threshold=0.5)
    _close(router.gates(torch.randn(2, 3, 4)), torch.ones(2, 3, 2))
    _close(composer(base, [e1, e2], gates=torch.tensor([0.0, 1.0]).expand(2, 3, 2)), e2, tol=1e-5)
    # one expert certain: τ small, the mean on its centroid
    centroids = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    assert Router(centroids, tau=1e-3, threshold=0.01).gates(torch.tensor([[0.0, 2.0, 0.0]])).tolist() == [[0.0, 1.0]]


def test_mixture_rule_is_the_weighted_average_of_probabilities():
    base, e1, e2, e3 = (_logp(4, seed=s) for s in range(4))
    weights = [0.2, 1.0, 0.5]
    want = torch.log((0.2 * e1.exp() + 1.0 * e2.exp() + 0.5 * e3.exp()) / 1.7)
    _close(compose_logprobs(base, [e1, e2, e3], weights, rule="mixture"), want, tol=1e-5)
    with pytest.raises(ValueError, match=r"weights: the mixture rule takes weights >= 0"):
        compose_logprobs(base, [e1, e2], [1.0, -0.5], rule="mixture")


def test_top_eos_policy_scores_eos_by_the_expert_of_the_largest_weight():
    base, e1, e2 = _logp(2, seed=3), _logp(2, seed=4), _logp(2, seed=5)
    composed = compose_logprobs(base, [e1, e2])
    got = apply_eos_policy(composed, base, [e1, e2], [0, 3], "top")
    _close(got[:, [0, 3]], e1[:, [0, 3]])  # equal weights: the first expert
    # routed: per-position weights pick the second expert on row 1
    gates = torch.tensor([[1.0, 0.5], [0.2, 1.0]])
    routed = Composer.build([1.0, 1.0], eos_policy="top")(base.float(), [e1.float(), e2.float()], eos_ids=torch.tensor([0, 3]), gates=gates)
    _close(routed[0, [0, 3]], e1[0, [0, 3]], tol=1e-5)
    _close(routed[1, [0, 3]], e2[1, [0, 3]], tol=1e-5)
    _close(torch.logsumexp(routed, -1), torch.zeros(2), tol=1e-5)


def test_routing_is_validated_by_key_and_expert():
    good = {"centroids": {"a": [1.0, 0.0], "b": [0.0, 1.0]}}
    assert CompositionConfig(routing=good).routing == {**good, "tau": 0.1, "threshold": 0.0, "gates": "scaled", "update": True, "pool": "mean"}
    for routing, message in (({"centroids": {"a": [1.0], "b": [1.0, 2.0]}}, r"routing\.centroids\['b'\]: 2 numbers, the other centroids 1"),
                             ({**good, "tau": 0}, r"routing\.tau: expected a number in \(0, 100\]"),
                             ({**good, "threshold": 2}, r"routing\.threshold: expected a number in \[0, 1\]"),
                             ({**good, "temperature": 1}, r"routing: unknown key 'temperature'"),
                             ({**good, "gates": "hard"}, r"routing\.gates: expected one of \['scaled', 'binary'\], got 'hard'"),
                             ({**good, "update": "no"}, r"routing\.update: expected true or false, got 'no'"),
                             ({**good, "pool": "last"}, r"routing\.pool: expected one of \['mean', 'max'\] \(max only with detectors\), got 'last'"),
                             ({**good, "pool": "max"}, r"routing\.pool: expected one of \['mean', 'max'\] \(max only with detectors\), got 'max'"),
                             ({"centroids": {"a": [float("nan")]}}, r"routing\.centroids\['a'\]: expected a non-empty list of finite numbers"),
                             ({**good, "detectors": {"a": {"direction": [1.0, 0.0], "offset": 0.0}}},
                              r"routing\.detectors: expected one detector per expert of the centroids \['a', 'b'\]"),
                             ({**good, "detectors": {"a": {"direction": [1.0], "offset": 0.0}, "b": {"direction": [0.0, 1.0], "offset": 0.0}}},
                              r"routing\.detectors\['a'\]\.direction: expected 2 finite numbers"),
                             ({**good, "detectors": {"a": {"direction": [1.0, 0.0], "offset": "x"}, "b": {"direction": [0.0, 1.0], "offset": 0.0}}},
                              r"routing\.detectors\['a'\]\.offset: expected a finite number"),
                             ({**good, "detectors": {"a": {"direction": [1.0, 0.0]}, "b": {"direction": [0.0, 1.0], "offset": 0.0}}},
                              r"routing\.detectors\['a'\]: expected a mapping with direction and offset"),
                             ({**good, "set_weights": {"a": 1.0}}, r"routing\.set_weights: expected a list of \{experts: \[names\], weight: number\}"),
                             ({**good, "set_weights": [{"experts": [], "weight": 1.0}]},
                              r"routing\.set_weights\[0\]: expected a mapping with experts \(a non-empty list of names\) and weight"),
                             ({**good, "set_weights": [{"experts": ["a", "c"], "weight": 1.0}]},
                              r"routing\.set_weights\[0\]\.experts: 'c' is not a routed expert; expected names from \['a', 'b'\]"),
                             ({**good, "set_weights": [{"experts": ["a", "b"], "weight": 1.0}, {"experts": ["b", "a"], "weight": 2.0}]},
                              r"routing\.set_weights\[1\]\.experts: \['b', 'a'\] names an expert twice or a set named before"),
                             ({**good, "set_weights": [{"experts": ["a"], "weight": float("inf")}]},
                              r"routing\.set_weights\[0\]\.weight: expected a finite number in \[-1e6, 1e6\], got inf")):
        with pytest.raises(ValueError, match=message):
            CompositionConfig(routing=routing)
    with pytest.raises(ValueError, match=r"routing\.centroids: expected one centroid per composed expert \['a', 'c'\]; 'c'"):
        CompositionConfig(routing=good).check_experts(["a", "c"])


# ---- the routed model against separately loaded models ------------------------------------------------


@pytest.fixture(scope="module")
def world(tiny):
    tok = AutoTokenizer.from_pretrained(tiny.base)
    base = AutoModelForCausalLM.from_pretrained(tiny.base).eval()
    experts = {n: merged_expert(tiny.base, tiny.adapters[n]) for n in ("a", "b")}
    return tok, base, experts


@torch.no_grad()
def _base_hidden(base, ids):
    return base(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].double()  # (T, d)


def _hand_centroid(base, tok, prompts):
    return torch.stack([_base_hidden(base, tok(p)["input_ids"]).mean(0) for p in prompts]).mean(0)


def _routed(tiny, tok, score="cosine", tau=0.05, threshold=0.2):
    """The tiny world's routed composition; `score` "max": the discriminant detectors with `pool: max`."""
    composed = ComposedModelForCausalLM.from_experts(tiny.base, {n: tiny.adapters[n] for n in ("a", "b")}, {"a": 1.0, "b": 0.8})
    pool = "max" if score == "max" else "mean"
    fit_routing(composed, tok, ROUTE_PROMPTS, tau=tau, threshold=threshold, batch_size=2, score="cosine" if score == "cosine" else "discriminant",
                shrinkage=0.5, pool=pool)
    return composed


def _hand_discriminant_gates(means, centroids, detectors, threshold):
    """g_i = z⁺_i / max z⁺ where z⁺_i ≥ θ max z⁺ > 0, z_i = (h − μ)·v_i − o_i, one position at a time."""
    centre = sum(centroids) / len(centroids)
    v, o = detectors
    out = []
    for h in means:
        z = torch.stack([torch.dot(h - centre, v[i]) - o[i] for i in range(len(o))]).clamp(min=0)
        out.append(torch.where((z >= threshold * z.max()) & (z.max() > 0), z / z.max(), torch.zeros_like(z)))
    return torch.stack(out)


@pytest.mark.parametrize("score", ["cosine", "discriminant", "max"])
def test_routed_forward_matches_separate_models_with_hand_gates(tiny, world, score):
    tok, base, experts = world
    composed = _routed(tiny, tok, score)
    hand_tokens = {n: [_base_hidden(base, tok(p)["input_ids"]) for p in ROUTE_PROMPTS[n]] for n in ("a", "b")}
    if score == "max":  # the centroids: each expert's tokens' mean
        centroids = [torch.cat(hand_tokens[n]).mean(0) for n in ("a", "b")]
        detectors = _hand_peak_detectors(hand_tokens, 0.5)
    else:
        centroids = [_hand_centroid(base, tok, ROUTE_PROMPTS[n]) for n in ("a", "b")]
        detectors = _hand_detectors({n: torch.stack([t.mean(0) for t in hand_tokens[n]]) for n in ("a", "b")}, 0.5)
    _close(torch.tensor(composed.composition.routing["centroids"]["a"]), centroids[0], tol=1e-5)
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        out = composed(**batch, output_trace=True)
    worst, seen, checked = 0.0, set(), 0
    for row, mask in enumerate(batch.attention_mask):
        ids = batch.input_ids[row][mask.bool()].tolist()
        hidden = _base_hidden(base, ids)
        means = hidden.cumsum(0) / torch.arange(1, len(ids) + 1).unsqueeze(-1)  # (T, d)
        clear = torch.ones(len(ids), dtype=torch.bool)  # positions whose gates no float tie decides
        if score == "max":
            gates, ties = _hand_peak_gates(hidden, centroids, detectors, 0.2)  # (T, 2), (T,)
            clear = ~ties
        else:
            gates = _hand_gates(means, centroids, 0.05, 0.2) if score == "cosine" else _hand_discriminant_gates(means, centroids, detectors, 0.2)
        lb = row_logprobs(base, ids)
        total = lb + sum(w * gates[:, i:i + 1] * (row_logprobs(experts[n], ids) - lb) for i, (n, w) in enumerate((("a", 1.0), ("b", 0.8))))
        want = torch.log_softmax(total, -1)
        worst = max(worst, (out.logits[row, -len(ids):][clear].double() - want[clear]).abs().max().item())
        _close(out.trace.gates[row, -len(ids):][clear], gates[clear], tol=1e-4)
        seen.add(int(gates[-1].argmax()))
        checked += int(clear.sum())
    assert worst <= 1e-4, f"max abs diff {worst:.2e}"
    assert checked >= 0.8 * batch.attention_mask.sum(), f"only {checked} positions clear of ties"
    assert seen == {0, 1}, "the prompts were meant to route to both experts"


@pytest.mark.parametrize("score", ["cosine", "discriminant", "max"])
def test_routed_decoding_and_chunked_scoring_give_the_one_forward_numbers(tiny, world, tmp_path, score):
    tok, _, _ = world
    composed = _routed(tiny, tok, score)
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    out = composed.generate(**batch, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True,
                            pad_token_id=tok.pad_token_id, eos_token_id=None)
    mask = torch.cat([batch.attention_mask, torch.ones(len(PROMPTS), 6, dtype=torch.long)], 1)
    with torch.no_grad():
        whole = composed(out.sequences, attention_mask=mask).logits  # (B, T + 6, V)
    steps = torch.stack(out.logits, 1)  # (B, 6, V): the composed log-probs of each decoding step
    _close(steps, whole[:, -7:-1], tol=1e-4)
    clear = torch.ones(mask.shape, dtype=torch.bool)  # (B, T + 6): positions whose gates no float tie decides
    if score == "max":  # the first token (BOS) scores 0 exactly on detector a in the tiny world (`_hand_peak_gates`)
        clear = mask.cumsum(1) > 1
    composed.scoring_budget = 2 * 3 * len(PROMPTS) * whole.shape[-1]  # two positions per forward
    with torch.no_grad():
        _close(composed(out.sequences, attention_mask=mask).logits[clear], whole[clear], tol=1e-4)
    composed.save_pretrained(tmp_path / "routed")
    saved = json.loads((tmp_path / "routed" / "composition.json").read_text())["composition"]["routing"]
    assert saved["tau"] == 0.05 and ("detectors" in saved) == (score != "cosine") and saved["pool"] == ("max" if score == "max" else "mean")
    again = ComposedModelForCausalLM.from_pretrained(tmp_path / "routed")
    with torch.no_grad():
        _close(again(out.sequences, attention_mask=mask).logits, whole, tol=1e-5)


SET_WEIGHTS = [{"experts": ["a", "b"], "weight": 1.5}, {"experts": ["a"], "weight": 0.5}, {"experts": ["b"], "weight": 2.0}]


@pytest.mark.parametrize(("pool", "set_weights"), [("mean", []), ("max", []), ("max", SET_WEIGHTS)])
def test_routing_without_update_decodes_with_the_prompt_gates(tiny, world, tmp_path, pool, set_weights):
    """`update: false`: every decoding step composes with the gates of the prompt's mean hidden state (`pool: max`:
    each detector's maximum over the prompt's tokens), computed by hand from separately loaded models, times the
    weight of the prompt's kept set in `set_weights` (a factor for every set here); scoring the finished sequence
    in one forward still routes by prefix."""
    tok, base, experts = world
    composed = _routed(tiny, tok, "max" if pool == "max" else "discriminant")
    composed.composition = composed.composition.with_routing({**composed.composition.routing, "update": False, "set_weights": set_weights})
    factors = {tuple(s["experts"]): s["weight"] for s in set_weights}
    hand_tokens = {n: [_base_hidden(base, tok(p)["input_ids"]) for p in ROUTE_PROMPTS[n]] for n in ("a", "b")}
    if pool == "max":
        centroids = [torch.cat(hand_tokens[n]).mean(0) for n in ("a", "b")]
        detectors = _hand_peak_detectors(hand_tokens, 0.5)
    else:
        centroids = [_hand_centroid(base, tok, ROUTE_PROMPTS[n]) for n in ("a", "b")]
        detectors = _hand_detectors({n: torch.stack([t.mean(0) for t in hand_tokens[n]]) for n in ("a", "b")}, 0.5)
    batch = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    new = 4
    out = composed.generate(**batch, max_new_tokens=new, do_sample=False, output_logits=True, return_dict_in_generate=True,
                            pad_token_id=tok.pad_token_id, eos_token_id=None)
    steps = torch.stack(out.logits, 1)  # (B, new, V)
    for row, mask in enumerate(batch.attention_mask):
        prompt = batch.input_ids[row][mask.bool()].tolist()
        ids = prompt + out.sequences[row, -new:].tolist()
        hidden = _base_hidden(base, prompt)  # (T, d)
        if pool == "max":
            peak, ties = _hand_peak_gates(hidden, centroids, detectors, 0.2)
            gates = peak[-1]  # (2,): the prompt's maxima
            assert not ties[-1]
        else:
            gates = _hand_discriminant_gates(hidden.mean(0, keepdim=True), centroids, detectors, 0.2)[0]  # (2,)
        gates = gates * factors.get(tuple(n for n, g in zip("ab", gates) if g > 0), 1.0)
        lb = row_logprobs(base, ids)  # (T, V)
        total = lb + sum(w * gates[i] * (row_logprobs(experts[n], ids) - lb) for i, (n, w) in enumerate((("a", 1.0), ("b", 0.8))))
        _close(steps[row], torch.log_softmax(total, -1)[len(prompt) - 1:-1], tol=1e-4)
    mask = torch.cat([batch.attention_mask, torch.ones(len(PROMPTS), new, dtype=torch.long)], 1)
    with torch.no_grad():
        scored = composed(out.sequences, attention_mask=mask).logits[:, -new - 1:-1]  # (B, new, V): routed by prefix
    assert (scored - steps).abs().max() > 1e-3  # the held gates are not the running ones
    composed.save_pretrained(tmp_path / "routed")  # the set weights travel in composition.json
    again = ComposedModelForCausalLM.from_pretrained(tmp_path / "routed")
    assert again.composition.routing.get("set_weights", []) == set_weights
    _close(torch.stack(again.generate(**batch, max_new_tokens=new, do_sample=False, output_logits=True, return_dict_in_generate=True,
                                      pad_token_id=tok.pad_token_id, eos_token_id=None).logits, 1), steps, tol=1e-5)


def test_all_experts_eos_policy_leaves_out_the_experts_gated_out():
    """Routed `all_experts`: EOS is the least likely of the experts whose gate is not 0, the base's where every gate
    is 0; with fixed weights (no gates) the least likely of all experts, as `apply_eos_policy` computes it."""
    base, e1, e2 = _logp(3, seed=6), _logp(3, seed=7), _logp(3, seed=8)
    eos = [0, 3]
    gates = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])  # row 0 both, row 1 the second alone, row 2 none
    routed = Composer.build([1.0, 1.0], eos_policy="all_experts")(base.float(), [e1.float(), e2.float()],
                                                                  eos_ids=torch.tensor(eos), gates=gates)
    _close(routed[0, eos], torch.minimum(e1[0, eos], e2[0, eos]), tol=1e-5)
    _close(routed[1, eos], e2[1, eos], tol=1e-5)
    _close(routed[2, eos], base[2, eos], tol=1e-5)
    _close(torch.logsumexp(routed, -1), torch.zeros(3), tol=1e-5)
    fixed = Composer.build([1.0, 1.0], eos_policy="all_experts")(base.float(), [e1.float(), e2.float()], eos_ids=torch.tensor(eos))
    _close(fixed, apply_eos_policy(compose_logprobs(base, [e1, e2]), base, [e1, e2], eos, "all_experts"), tol=1e-5)
    _close(fixed[:, eos], torch.minimum(e1[:, eos], e2[:, eos]), tol=1e-5)

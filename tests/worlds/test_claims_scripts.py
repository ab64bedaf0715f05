"""experiments/claims/diagnostic_correlation.py and experiments/claims/length_generalisation.py against hand computations (fast worlds)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from merging.worlds.toy import TASKS, ToyConfig, make_eval_set
from merging.worlds.toy.build import world_at
from merging.worlds.toy.data import prompt_of
from tests.reference import hand_compose, merged_expert, row_logprobs


@pytest.fixture(scope="module")
def fast_world(tmp_path_factory):
    return world_at(tmp_path_factory.mktemp("claims"), ToyConfig.fast(base_steps=60, expert_steps=30))


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p.exp() * (p - q)).sum(-1)


def test_diagnostic_points_equal_a_hand_computation(fast_world, monkeypatch):
    """overlap and mean KL(p̂ ‖ p_merge) on the answer positions, from separately loaded models, a merge by hand
    (base weights + each expert's merged-in update) and the composition formula by hand."""
    import diagnostic_correlation as dc

    monkeypatch.setattr(dc, "TASK_EXPERTS", {"a2b_c2d": ("a2b", "c2d")})
    size = 12
    monkeypatch.setattr(dc, "make_eval_set", lambda task: make_eval_set(task, size=size))
    tokenizer = AutoTokenizer.from_pretrained(fast_world.base)
    base = AutoModelForCausalLM.from_pretrained(fast_world.base).eval()
    experts = [merged_expert(fast_world.base, fast_world.expert(r)) for r in ("a2b", "c2d")]
    merged = AutoModelForCausalLM.from_pretrained(fast_world.base).eval()
    state = base.state_dict()
    merged.load_state_dict({k: v + sum(e.state_dict()[k] - v for e in experts) for k, v in state.items()})
    activity, kls = [], []
    for d in make_eval_set(next(t for t in TASKS if t.name == "a2b_c2d"), size=size):
        prompt = tokenizer(prompt_of(d["input"])).input_ids
        ids = prompt + tokenizer(d["target"], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        lb, le = row_logprobs(base, ids), [row_logprobs(e, ids) for e in experts]  # (T, V) each
        answer = slice(len(prompt) - 1, len(ids) - 1)  # from '>' to the last letter
        activity.append(torch.stack([_kl(e, lb) for e in le], -1)[answer])  # (answer, 2)
        kls += _kl(hand_compose(lb, le, [1.0, 1.0]), row_logprobs(merged, ids))[answer].tolist()
    activity = torch.cat(activity)  # (N, 2)
    threshold = activity.min(-1).values.median().item()  # both experts active on about half of the tokens
    both = ((activity > threshold).sum(-1) > 1).double().mean().item()
    (point,) = dc.points_of(fast_world, threshold)
    assert 0.3 < both < 0.7
    assert point["overlap"] == pytest.approx(both, abs=1.5 / len(activity))  # one token may sit on the threshold
    assert point["kl"] == pytest.approx(sum(kls) / len(kls), rel=1e-3, abs=1e-6)


def test_correlations_are_spearman_by_hand():
    import diagnostic_correlation as dc

    composed = [0.9, 0.5, 0.7, 0.2, 1.0]
    overlap = [0.01, 0.2, 0.05, 0.03, 0.0]
    kl = [0.3, 0.1, 0.2, 0.5, 0.4]
    points = [{"composed": c, "overlap": o, "kl": k} for c, o, k in zip(composed, overlap, kl)]
    corr = dc.correlations(points)

    def rho(x, y):  # no ties: 1 - 6 Σ d² / (n (n² - 1))
        rank = lambda v: {x: i for i, x in enumerate(sorted(v))}  # noqa: E731
        rx, ry = rank(x), rank(y)
        n = len(x)
        return 1 - 6 * sum((rx[a] - ry[b]) ** 2 for a, b in zip(x, y)) / (n * (n * n - 1))

    error = [1 - c for c in composed]
    assert corr["overlap"]["rho"] == pytest.approx(rho(error, overlap)) and corr["overlap"]["n"] == 5
    assert corr["kl"]["rho"] == pytest.approx(rho(error, kl))
    sep = dc.separation(points)  # exact: only the last point (overlap 0, kl 0.4)
    assert sep["overlap"] == {"max_exact": 0.0, "min_failing": 0.01, "separates": True}
    assert sep["kl"] == {"max_exact": 0.4, "min_failing": 0.1, "separates": False}


def test_length_table_counts_each_bucket(tmp_path, monkeypatch):
    """Each cell is the share of its bucket's strings that greedy_correct accepts, in both modes."""
    import length_generalisation as lg

    monkeypatch.setattr(lg, "PER_BUCKET", 3)
    world = world_at(tmp_path, ToyConfig.fast(layout="padded"))
    calls = []
    real = lg.greedy_correct
    monkeypatch.setattr(lg, "greedy_correct", lambda *a: calls.append(a) or real(*a))
    table = lg.score_world(world)
    assert list(table) == ["base", "a2b", "c2d", "composed", "task arithmetic", "TIES (density 0.5)"]
    assert table["composed"]["task"] == "a2b_c2d" and table["base"]["task"] == "identity"
    assert len(calls) == 6 * 2 * len(lg.BUCKETS)
    for model, tokenizer, docs, layout, oracle in calls:
        assert layout == "padded" and len(docs) == 3
    assert all(0 <= v <= 1 for row in table.values() for mode in lg.MODES for v in row[mode].values())
    other = {label: {**row, "free": {b: 1.0 for b in row["free"]}} for label, row in table.items()}
    mean = lg.mean_rows([table, other])
    assert mean["base"]["free"]["1-16"] == pytest.approx((table["base"]["free"]["1-16"] + 1.0) / 2)
    assert mean["base"]["oracle"] == table["base"]["oracle"]
    md = lg.markdown({"padded": {"seeds": {0: {"build_seconds": 1.0}}, "mean": table}})
    assert "| composed | a2b_c2d |" in md and "29-32" in md


def test_smol_answer_positions_are_those_that_predict_the_answer():
    import diagnostic_correlation as dc

    from merging.worlds.toy import make_tokenizer

    tokenizer = make_tokenizer()
    pairs = [("ABC>", "DE"), ("A>", "BCDF")]
    batch, score = dc._answer_batch(tokenizer, pairs)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    for i, (prompt, answer) in enumerate(pairs):
        row = ids[i][mask[i].bool()].tolist()
        assert tokenizer.decode(row) == prompt + answer  # left-padded, no special tokens
        predicted = ids[i, 1:][score[i, :-1]].tolist()  # the token after each scored position
        assert tokenizer.decode(predicted) == answer and int(score[i].sum()) == len(answer)


def test_routing_accuracy_pools_the_detectors_scores_as_documented():
    from merging.tools import routing_report as ra

    from logitcomp.routing import routing_config

    gen = torch.Generator().manual_seed(3)
    # three experts' prompts of 3-6 tokens (d = 4), each expert's tokens shifted along its own axis
    train = {e: [torch.randn(3 + j % 4, 4, generator=gen) + 2 * torch.eye(4)[i] for j in range(7)] for i, e in enumerate("abc")}
    tasks = {"t": [torch.randn(5, 4, generator=gen) for _ in range(3)]}
    experts = list(train)
    # mean: the detectors of the prompts' means, scored on the task prompts' means
    routing = routing_config({e: torch.stack([h.mean(0) for h in hs]) for e, hs in train.items()}, score="discriminant", shrinkage=0.5)
    v = torch.tensor([routing["detectors"][e]["direction"] for e in experts])  # (k, d)
    o = torch.tensor([routing["detectors"][e]["offset"] for e in experts])  # (k,)
    centre = torch.tensor([routing["centroids"][e] for e in experts]).mean(0)
    want = torch.stack([(h.mean(0) - centre) @ v.T - o for h in tasks["t"]])
    assert torch.allclose(ra.pooled_scores(train, tasks, "mean", 0.5)["t"], want, atol=1e-5)
    # max: token-level detectors, each one's maximum over a prompt's tokens, rescaled to 1 (own) and 0 (others) by hand
    routing = routing_config({e: torch.cat(hs) for e, hs in train.items()}, score="discriminant", shrinkage=0.5)
    v = torch.tensor([routing["detectors"][e]["direction"] for e in experts])
    o = torch.tensor([routing["detectors"][e]["offset"] for e in experts])
    centre = torch.tensor([routing["centroids"][e] for e in experts]).mean(0)
    peak = lambda h, i: max(float((h[s] - centre) @ v[i] - o[i]) for s in range(len(h)))  # noqa: E731
    pooled = ra.pooled_scores(train, tasks, "max", 0.5)["t"]  # (3, k)
    for i, e in enumerate(experts):
        own = sum(peak(h, i) for h in train[e]) / len(train[e])
        others = [peak(h, i) for f in experts if f != e for h in train[f]]
        other = sum(others) / len(others)
        assert torch.allclose(pooled[:, i], torch.tensor([(peak(h, i) - other) / (own - other) for h in tasks["t"]]), atol=1e-4)
    rescaled = ra.pooled_scores(train, train, "max", 0.5)
    assert abs(rescaled["a"][:, 0].mean() - 1) < 1e-4 and abs(torch.cat([rescaled["b"][:, 0], rescaled["c"][:, 0]]).mean()) < 1e-4


def test_routing_fit_fits_each_floor_between_the_prompts_that_need_the_expert_and_those_that_do_not():
    from logitcomp.routing_fit import fit_floors

    # z (n, k) of experts a, b on three validation tasks: a only, a + b, b only
    scores = {"a": torch.tensor([[0.9, 0.3], [1.0, 0.45]]), "ab": torch.tensor([[0.8, 0.6], [0.7, 0.7]]),
              "b": torch.tensor([[0.1, 1.0], [0.2, 1.1]])}
    tasks = {"a": [0], "ab": [0, 1], "b": [1]}
    # a: needed where z ≥ 0.7, not where z ≤ 0.2 -> halfway, 0.45; b: needed from 0.6 up, not at 0.3 and 0.45 -> 0.525
    assert fit_floors(scores, tasks, ["a", "b"]) == {"a": 0.45, "b": 0.525}
    # no floor separates b's prompts once one a + b prompt scores 0.4: 0.35 (keeps b on an a-only prompt) and 0.575
    # (drops it on that a + b prompt) each agree on 5 of 6 prompts, 0.425 on 4 of 6; of the two, the one nearer 0.5
    scores["ab"][0, 1] = 0.4
    assert fit_floors(scores, tasks, ["a", "b"])["b"] == 0.575


def test_routing_fit_chooses_lambda_and_floors_as_the_routing_report_and_a_hand_count_do():
    """`logitcomp.routing_fit.fit` (what a routed row runs) against `logitcomp routing-report`'s own scoring of the
    same prompts (merging/tools/routing_report.pooled_scores), the floors it fits, and exact routing counted by hand;
    the λ of the best mean exact, ties to the largest."""
    from merging.tools import routing_report as ra

    from logitcomp.routing_fit import fit, fit_floors

    gen = torch.Generator().manual_seed(5)
    # two experts' prompts (d = 4), shifted along their own axes; labelled sets: a alone, b alone, both (tokens of each)
    train = {e: [torch.randn(3 + j % 3, 4, generator=gen) + 0.8 * torch.eye(4)[i] for j in range(8)] for i, e in enumerate("ab")}
    both = [torch.cat([torch.randn(2, 4, generator=gen) + 0.8 * torch.eye(4)[0], torch.randn(2, 4, generator=gen) + 0.8 * torch.eye(4)[1]])
            for _ in range(5)]  # overlapping: the candidates' exact routing differs (0.633, 0.633, 0.567: a tie, then the largest)
    labelled = {"a": (train["a"][:4], ["a"]), "b": (train["b"][:4], ["b"]), "ab": (both, ["a", "b"])}
    lambdas = [0.1, 1.0, 10.0]
    got = fit(train, labelled, lambdas, pool="max")
    means = {}
    for value in lambdas:
        scores = ra.pooled_scores(train, {n: tokens for n, (tokens, _) in labelled.items()}, "max", value)  # (n, k) per set
        wanted = {n: [list(train).index(e) for e in need] for n, (_, need) in labelled.items()}
        floors = fit_floors(scores, wanted, list(train))
        exact = {}
        for name, z in scores.items():
            hits = 0
            for row in z.tolist():
                kept = {e for e, s, f in zip(train, row, floors.values()) if s - f > 0}
                hits += kept == set(labelled[name][1])
            exact[name] = hits / len(z)
        means[value] = sum(exact.values()) / len(exact)
        if value == got["shrinkage"]:
            assert got["floors"] == floors and got["exact"] == pytest.approx(exact, abs=1e-4)
    best = max(means.values())
    assert len({round(m, 4) for m in means.values()}) > 1 and got["shrinkage"] == max(v for v, m in means.items() if abs(m - best) < 1e-9)
    assert got["candidates"] == {f"{v:g}": pytest.approx(m, abs=1e-4) for v, m in means.items()}

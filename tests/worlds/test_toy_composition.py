"""On the factorised toy world, composing experts performs every replacement; no expert alone does."""

from __future__ import annotations

import pytest
from toy_composition import score_world, summarise

pytestmark = pytest.mark.slow


def test_composition_performs_both_and_all_three_replacements(toy_factorised):
    scores = score_world(toy_factorised)
    assert scores["composed"]["pair"] >= 0.99 and scores["composed"]["triple"] >= 0.99, scores
    for expert in ("a2b", "c2d", "e2f"):
        assert scores[expert]["pair"] <= 0.05 and scores[expert]["triple"] <= 0.05, scores
    summary = summarise([{"variant": "factorised", "scores": scores}])["factorised"]
    assert summary["composed"]["pair"] == {"mean": scores["composed"]["pair"], "min": scores["composed"]["pair"],
                                           "max": scores["composed"]["pair"], "n": 1}
    assert summary["best expert"]["triple"]["max"] == max(scores[e]["triple"] for e in ("a2b", "c2d", "e2f"))

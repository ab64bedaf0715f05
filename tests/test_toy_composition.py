"""On the factorised toy world, composing experts performs every replacement; no expert alone does."""

from __future__ import annotations

import pytest
from toy_composition import score_world

pytestmark = pytest.mark.slow


def test_composition_performs_both_and_all_three_replacements(toy_factorised):
    scores = score_world(toy_factorised)
    assert scores["composed a2b+c2d"]["a2b_c2d"] >= 0.99, scores
    assert scores["composed a2b+c2d+e2f"]["a2b_c2d_e2f"] >= 0.99, scores
    for expert in ("a2b", "c2d", "e2f"):
        assert scores[expert]["a2b_c2d"] <= 0.05 and scores[expert]["a2b_c2d_e2f"] <= 0.05, scores

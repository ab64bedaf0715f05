"""On the factorised toy world the merges solve the pair task and the experts act on disjoint tokens."""

from __future__ import annotations

import pytest
from toy_bridge import report

pytestmark = pytest.mark.slow


def test_toy_merges_and_factorisability(toy_factorised, tmp_path):
    r = report(toy_factorised, tmp_path)
    assert r["pair_accuracy"]["task_arithmetic"] >= 0.99 and r["pair_accuracy"]["merge_as_lora"] >= 0.99, r
    assert r["size_mib"]["merge_as_lora"] < r["size_mib"]["task_arithmetic"]
    c = r["comparison"]
    assert c["overlap"] <= 0.01, c  # a2b and c2d act on disjoint tokens in the factorised world
    assert c["argmax_agreement"] >= 0.99, c
    assert (tmp_path / "activity.png").exists() and (tmp_path / "compare.json").exists()

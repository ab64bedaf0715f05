"""`logitcomp pool-seeds` (merging/tools/pool_seeds.py) against a hand computation; experiments/two-skill/two_skill_diagnostic.py's refusals."""

from __future__ import annotations

import json
import math

import pytest


def _run(folder, chosen_lambda: str, scores: dict[str, float], n: int = 50):
    """A results.json of one seed: `scores` maps variant -> flexible on smol_math_polite over n documents (and, as a
    single-skill task, half of it styled on smol_polite over 40)."""
    folder.mkdir()
    results = {v: {"smol_math_polite": {"sample_len": n, "flexible,none": m},
                   "smol_polite": {"sample_len": 40, "styled,none": m / 2}} for v, m in scores.items()}
    recipe = {"variants": ["experts", {"name": "composed", "kind": "composed"}, {"name": "ta", "kind": "merged"}]}
    selection = {"chosen": {"composed": {"variant": f"composed[lambda={chosen_lambda}]"},
                            "ta": {"variant": "ta[lambda=0.5]"}}}
    (folder / "results.json").write_text(json.dumps({"recipe": recipe, "selection": selection, "results": results}))
    return folder


def test_seeds_pool_each_row_at_its_validated_lambda(tmp_path):
    from merging.tools import pool_seeds as ts

    a = _run(tmp_path / "s0", "1", {"math": 0.0, "polite": 0.02, "composed[lambda=1]": 0.3, "composed[lambda=1.5]": 0.9,
                                    "ta[lambda=0.5]": 0.1, "ta[lambda=1]": 0.8})
    b = _run(tmp_path / "s1", "1.5", {"math": 0.0, "polite": 0.06, "composed[lambda=1]": 0.9, "composed[lambda=1.5]": 0.2,
                                      "ta[lambda=0.5]": 0.04, "ta[lambda=1]": 0.9, "extra": 0.5}, n=40)
    out = ts.table("smol_math_polite", "flexible", [a, b], also=("smol_polite:styled",)).splitlines()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in out[2:] if line.startswith("| ")}
    assert list(rows) == ["math", "polite", "composed", "ta"]
    # composed: 0.3 on 50 (λ 1 chosen at s0) and 0.2 on 40 (λ 1.5 at s1): 23 of 90
    p, se = 23 / 90, math.sqrt(23 / 90 * (1 - 23 / 90) / 89)
    assert rows["composed"][1:3] == ["0.300 ([lambda=1])", "0.200 ([lambda=1.5])"]
    assert rows["composed"][3] == f"{p:.3f} ± {se:.3f} (90)"
    q = (0.1 * 50 + 0.04 * 40) / 90  # ta at λ 0.5 at both seeds
    se_q = math.sqrt(q * (1 - q) / 89)
    assert rows["ta"][4] == f"{(p - q) / math.hypot(se, se_q):.2f}" and rows["ta"][5] == f"{p / q:.2f}"
    assert rows["math"][4] == f"{p / se:.2f}" and rows["math"][5] == "inf"
    styled = (0.15 * 40 + 0.1 * 40) / 80  # half of composed's 0.3 and 0.2, each on 40 sentences
    assert rows["composed"][6] == f"{styled:.3f} ± {math.sqrt(styled * (1 - styled) / 79):.3f} |"
    assert out[-1] == "Not at every seed, left out: extra"
    with pytest.raises(ValueError, match="no metric 'exact_match,none'"):
        ts.table("smol_math_polite", "exact_match", [a, b])


def test_two_skill_diagnostic_refuses_an_expert_it_cannot_use(tmp_path, capsys):
    """--expert NAME=DIR: DIR must hold a LoRA adapter and NAME must be an expert of a chosen family."""
    import two_skill_diagnostic as td

    adapter = tmp_path / "xml"
    adapter.mkdir()
    with pytest.raises(SystemExit):
        td.main([str(tmp_path), "--families", "math+xml", "--expert", f"xml={adapter}"])
    assert "DIR/adapter_config.json" in capsys.readouterr().err
    (adapter / "adapter_config.json").write_text("{}")
    assert td.expert_dirs([f"xml={adapter}"], None) == {"xml": adapter}
    with pytest.raises(SystemExit):
        td.main([str(tmp_path), "--families", "math+polite", "--expert", f"xml={adapter}"])
    assert "xml is in none of the families math+polite" in capsys.readouterr().err


def test_sign_off_strict_counts_only_right_answers_that_end_at_the_sign_off(tmp_path, capsys):
    """experiments/two-skill/sign_off_strict.py on hand-made lm-eval samples: a right answer that runs on past the sign-off, or signs
    off twice, is not counted; a wrong answer that ends at it is not either; the scorer's any-case sign-off is."""
    import sign_off_strict

    folder = tmp_path / "run" / "lm_eval" / "c[lambda=1]" / "model"
    folder.mkdir(parents=True)
    (folder / "results_2026-01-01T00.json").write_text(json.dumps({"configs": {"polite_task": {"output_type": "generate_until"}}}))
    docs = [(" Sure! A Cat. Hope this helps! ", 1.0), ("Sure! A Cat. Hope This Helps!", 1.0),
            ("Sure! A Cat. Hope This Helps! Links Below.", 1.0), ("Sure! A Cat. Hope this helps! Hope this helps!", 1.0),
            ("Sure! a cat. Hope this helps!", 0.0), ("A Cat.", 0.0)]
    (folder / "samples_polite_task_2026-01-01T00.jsonl").write_text(
        "".join(json.dumps({"doc_id": i, "resps": [[t]], "exact_match": m}) + "\n" for i, (t, m) in enumerate(docs)))
    pattern = sign_off_strict.polite_pattern()
    assert [sign_off_strict.ends_at_sign_off(t, pattern) for t, _ in docs] == [True, True, False, False, True, False]
    sign_off_strict.main(["polite_task", str(tmp_path / "run" / "c[lambda=1]")])
    exact, strict = 4 / 6, 2 / 6
    se = [math.sqrt(p * (1 - p) / 5) for p in (exact, strict)]
    assert f"| c[lambda=1] | 6 | {exact:.3f} ± {se[0]:.3f} | {strict:.3f} ± {se[1]:.3f} |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no samples of other_task"):
        sign_off_strict.main(["other_task", str(tmp_path / "run" / "c[lambda=1]")])

"""Pool one two-skill family's recipe runs over seeds: every row at its validated λ, per seed and over all seeds.

    logitcomp pool-seeds smol_math_polite flexible \
        runs/smol-two-skill-polite-seed0 runs/smol-two-skill-polite runs/smol-two-skill-polite-seed2

Each RUN is one seed's run of the same rows (its results.json). A swept row counts at the value its run chose on
validation (results.json's `selection`), a row without a sweep as it is. Prints a markdown table: each row's score on
TASK's METRIC at each seed and pooled over every document of every seed, ± the standard error of that mean as
lm-eval computes it (sqrt(p(1-p)/(n-1))), and how far the composition (the first `composed` row of the recipe, or
--row) lies above each other row in standard errors of the difference (unpaired: sqrt(se_a² + se_b²)); then the
composition's share of each row's pooled score; `--also TASK:METRIC` adds another task's pooled score (a single-skill
task: what composing costs there). A row missing at some seed is named and left out of the table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..kinds.composed import ComposedKind


def rows_of(results: dict) -> dict[str, str]:
    """Row name -> the variant that stands for it: a swept row's validated variant, any other row itself."""
    chosen = {name: c["variant"] for name, c in results["selection"]["chosen"].items()}
    rows = {}
    for variant in results["results"]:  # in the run's order; a swept row where its first value stands
        name = variant.split("[")[0]
        rows.setdefault(name, chosen.get(name, variant))
    return rows


def score(result: dict, task: str, metric: str) -> tuple[float, int]:
    """(mean, documents) of METRIC (its filter `none` unless named as `metric,filter`) on TASK."""
    key = metric if "," in metric else f"{metric},none"
    if task not in result or key not in result[task]:
        raise ValueError(f"{task}: no metric {key!r} (has {', '.join(sorted(result.get(task, {})))})")
    return result[task][key], result[task]["sample_len"]


def pooled(scores: list[tuple[float, int]]) -> tuple[float, float, int]:
    """(mean over every document, its standard error sqrt(p(1-p)/(n-1)), nan for one document as lm-eval gives,
    documents) of per-seed (mean, documents)."""
    n = sum(k for _, k in scores)
    p = sum(m * k for m, k in scores) / n
    return p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else math.nan, n


def composed_row(results: dict) -> str:
    """The first row of the recipe whose kind is `composed`."""
    for v in results["recipe"]["variants"]:
        if isinstance(v, dict) and v.get("kind") == ComposedKind.name:
            return v["name"]
    raise ValueError("no composed row in the recipe: name one with --row")


def table(task: str, metric: str, runs: list[Path], row: str | None = None, also: tuple[str, ...] = ()) -> str:
    """The markdown table of the module's docstring; each of `also` ("TASK:METRIC") adds a column of that score pooled."""
    loaded = [json.loads((r / "results.json").read_text()) for r in runs]
    picks = [rows_of(res) for res in loaded]
    names = [n for n in picks[0] if all(n in p for p in picks)]
    missing = sorted({n for p in picks for n in p} - set(names))
    row = row or composed_row(loaded[0])
    if row not in names:
        raise ValueError(f"--row: {row!r} is not a row of every run (rows: {', '.join(names)})")

    def at_seeds(name: str, task: str, metric: str) -> list[tuple[float, int]]:
        """(mean, documents) of row `name` on TASK's METRIC at each seed, at that seed's validated variant."""
        return [score(res["results"][p[name]], task, metric) for res, p in zip(loaded, picks)]

    per_seed = {n: at_seeds(n, task, metric) for n in names}
    pool = {n: pooled(s) for n, s in per_seed.items()}
    extra = [a.split(":", 1) for a in also]
    head = ["row", *[f"{r.name} (chosen)" for r in runs], "pooled", f"{row} above it (SE)", f"{row} / it",
            *[f"{t} {m} (pooled)" for t, m in extra]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    p_row, se_row, _ = pool[row]
    for n in names:
        cells = [f"{m:.3f}" + (f" ({p[n][len(n):]})" if p[n] != n else "") for (m, _), p in zip(per_seed[n], picks)]
        p_n, se_n, docs = pool[n]
        diff = (p_row - p_n) / math.hypot(se_row, se_n) if n != row and (se_row or se_n) else float("nan")
        ratio = p_row / p_n if p_n else float("inf")
        others = [pooled(at_seeds(n, t, m)) for t, m in extra]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {p_n:.3f} ± {se_n:.3f} ({docs}) | "
                     + ("-" if n == row else f"{diff:.2f}") + " | " + ("-" if n == row else f"{ratio:.2f}") + " |"
                     + "".join(f" {q:.3f} ± {se:.3f} |" for q, se, _ in others))
    if missing:
        lines.append(f"\nNot at every seed, left out: {', '.join(missing)}")
    return "\n".join(lines)


def run(args) -> int:
    """`logitcomp pool-seeds TASK METRIC RUN...`: the table of the module's docstring."""
    if absent := [str(r) for r in args.runs if not (r / "results.json").is_file()]:
        raise ValueError(f"runs: no results.json in {', '.join(absent)}")
    if bad := [a for a in args.also if ":" not in a]:
        raise ValueError(f"--also: expected TASK:METRIC, got {', '.join(bad)}")
    print(table(args.task, args.metric, args.runs, args.row, tuple(args.also)))
    return 0

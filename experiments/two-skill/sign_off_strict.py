"""A polite task's exact match read strictly: a right answer counts only when it ends at the sign-off.

    python experiments/two-skill/sign_off_strict.py smol_title_polite "runs/gemma3-two-skill-title-seed2/composed_experts_eos[lambda=1]"

The polite scorers (recipes/tasks/smol/utils.py, polite_answer) take what an answer says between the opening "Sure!"
and the first sign-off "Hope this helps!" (any case) and ignore what follows it, so `Sure! ... Hope This Helps! Links
Below.` can score. Each ROW (a run folder and a row name joined by `/`, its latest lm-eval samples of TASK) prints
one markdown line: documents, exact match and the strict exact match, each ± its standard error as lm-eval computes
it (sqrt(p(1-p)/(n-1))).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from merging.tools.pool_seeds import pooled
from merging.tools.same_text import samples, text

UTILS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "smol" / "utils.py"


def polite_pattern():
    """The scorers' own sign-off pattern (POLITE_ANY_CASE of recipes/tasks/smol/utils.py)."""
    spec = importlib.util.spec_from_file_location("smol_utils", UTILS)
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    return utils.POLITE_ANY_CASE


def ends_at_sign_off(answer: str, pattern) -> bool:
    """Whether the answer's first sign-off (the one the scorer reads) is the last thing in it, spaces aside."""
    found = pattern.match(answer.strip())
    return bool(found) and found.end() == len(answer.strip())


def mean_se(hits: int, n: int) -> str:
    """`hits` of `n` documents as "mean ± standard error" (merging.tools.pool_seeds.pooled's, over one run)."""
    p, se, _ = pooled([(hits / n, n)])
    return f"{p:.3f} ± {se:.3f}"


def strict(docs: dict[int, dict], pattern) -> tuple[int, int, int]:
    """(documents, exact matches, exact matches that end at the sign-off) of one task's samples."""
    right = [s for s in docs.values() if s["exact_match"]]
    return len(docs), len(right), sum(ends_at_sign_off(text(s), pattern) for s in right)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task")
    parser.add_argument("rows", type=Path, nargs="+", metavar="RUN/ROW")
    args = parser.parse_args(argv)
    pattern = polite_pattern()
    print("| row | documents | exact match | ending at the sign-off |\n|---|---|---|---|")
    for row in args.rows:
        got = samples(row)
        if args.task not in got:
            raise SystemExit(f"{row}: no samples of {args.task} (has {', '.join(sorted(got))})")
        n, exact, ended = strict(got[args.task], pattern)
        print(f"| {row.name} | {n} | {mean_se(exact, n)} | {mean_se(ended, n)} |")


if __name__ == "__main__":
    main()

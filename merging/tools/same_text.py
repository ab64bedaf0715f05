"""Whether two rows of recipe runs wrote the same generations: per task, how many documents got identical text.

    logitcomp compare-texts runs/gemma3-routing-floors-polite-seed1/floors_sets \
        "runs/gemma3-routing-pairs-seed1/pair_math_xml[lambda=1.25]"

Each argument is a run folder and a row name joined by `/` (the row's lm-eval samples under RUN/lm_eval/ROW/, the
latest file per task). For every generation task both rows ran, prints a markdown table: documents in common,
identical texts, and for each per-document metric the documents only the first row scores above the other and only
the second does (ties counted in neither).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

from merging.harness.evaluate import SAMPLES


def samples(row: Path) -> dict[str, dict[int, dict]]:
    """Generation task -> doc_id -> that document's sample, from the latest samples file of each task under
    RUN/lm_eval/ROW/ (a task that scores log-likelihoods is left out)."""
    folder = glob.escape(str(row.parent / "lm_eval" / row.name))
    # RUN/lm_eval/ROW/ holds them (runs before 0.2 one folder deeper, under lm-eval's model name)
    files = sorted(glob.glob(folder + "/**/samples_*.jsonl", recursive=True), key=lambda f: Path(f).name)
    if not files:
        raise ValueError(f"{row}: no lm-eval samples under {row.parent / 'lm_eval' / row.name}")
    configs = {}
    for results in sorted(glob.glob(folder + "/**/results_*.json", recursive=True), key=lambda f: Path(f).name):
        configs |= json.loads(Path(results).read_text())["configs"]
    out = {}
    for f in files:  # sorted by the timestamp that ends each name: a later file of a task replaces an earlier one
        task = SAMPLES.fullmatch(Path(f).name)[1]
        if configs.get(task, {}).get("output_type") == "generate_until":
            out[task] = {s["doc_id"]: s for s in map(json.loads, Path(f).read_text().splitlines())}
    return out


def text(sample: dict) -> str:
    """A generation's text."""
    return sample["resps"][0][0]


def compare(a: dict[int, dict], b: dict[int, dict]) -> dict:
    """Documents in common, identical texts, and per numeric metric (first higher, second higher)."""
    ids = sorted(a.keys() & b.keys())
    metrics = [k for k, v in a[ids[0]].items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "doc_id"
               and k in b[ids[0]]] if ids else []
    return {"documents": len(ids), "identical": sum(text(a[i]) == text(b[i]) for i in ids),
            "metrics": {m: (sum(a[i][m] > b[i][m] for i in ids), sum(b[i][m] > a[i][m] for i in ids)) for m in metrics}}


def run(args) -> int:
    """`logitcomp compare-texts FIRST SECOND`: the markdown table of the module's docstring."""
    a, b = samples(args.first), samples(args.second)
    print(f"| task | documents | identical text | only {args.first.name} higher / only {args.second.name} higher |")
    print("|---|---|---|---|")
    for task in sorted(a.keys() & b.keys()):
        c = compare(a[task], b[task])
        wins = ", ".join(f"{m}: {x} / {y}" for m, (x, y) in c["metrics"].items())
        print(f"| {task} | {c['documents']} | {c['identical']} | {wins} |")
    return 0

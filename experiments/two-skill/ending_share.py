"""Share of a recipe run's generations that end (by EOS or a stop string) before the token limit.

    python experiments/two-skill/ending_share.py runs/smol-routing smol_world/base

For every row of the run (`lm_eval/<row>/`) and every generation task, a generation counts as ended when
its text, re-encoded by the base's tokenizer, is at least 2 tokens shorter than the task's `max_gen_toks`
(lm-eval stores the text cut at the stop string; re-encoding may shift a length by a token). Prints a
markdown table: rows x tasks, and the share over all the row's generations.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from merging.harness.evaluate import SAMPLES


def ended(samples: Path, tok, limit: int) -> tuple[int, int]:
    """(ended, total) generations of one samples file."""
    done = total = 0
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        text = sample["resps"][0][0]
        total += 1
        done += len(tok(text, add_special_tokens=False).input_ids) <= limit - 2
    return done, total


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("base", type=Path)
    args = parser.parse_args(argv)
    tok = AutoTokenizer.from_pretrained(args.base)
    table, tasks = {}, []
    found = [(r, r.parent.name) for r in args.run.glob("lm_eval/*/results_*.json")]  # lm_eval/ROW/ (and before 0.2, lm_eval/ROW/MODEL/)
    found += [(r, r.parent.parent.name) for r in args.run.glob("lm_eval/*/*/results_*.json")]
    for results, row in sorted(found):
        configs = json.loads(results.read_text())["configs"]
        for task, config in configs.items():
            if config.get("output_type") != "generate_until":
                continue
            # SAMPLES, not a glob of samples_TASK_*: that would also take smol_math_xml's for smol_math
            samples = next(p for p in results.parent.glob("samples_*.jsonl") if (m := SAMPLES.fullmatch(p.name)) and m[1] == task)
            table.setdefault(row, {})[task] = ended(samples, tok, config["generation_kwargs"]["max_gen_toks"])
            tasks = sorted(set(tasks) | {task})
    print(f"| row | {' | '.join(tasks)} | all |\n|---|{'---|' * (len(tasks) + 1)}")
    for row, by_task in table.items():
        cells = [f"{d / t:.3f}" if (d, t) != (0, 0) else "-" for d, t in (by_task.get(task, (0, 0)) for task in tasks)]
        done, total = (sum(x) for x in zip(*by_task.values()))
        print(f"| {row} | {' | '.join(cells)} | {done / total:.3f} |")


if __name__ == "__main__":
    main()

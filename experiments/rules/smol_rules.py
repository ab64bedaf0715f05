"""Composition rules on SmolLM2 (math, code, shout experts): parameters chosen on validation, scored on test.

    python experiments/rules/smol_rules.py smol_world --out runs/smol-rules

1. Validation: the three-expert composition under each rule and candidate parameter (GRID) on
   smol_math_val (strict), smol_code_val (pass@1) and smol_math_shout_val (exact match); per rule
   the candidate with the best mean of the three is chosen (ties: the first in GRID).
2. Test, with the chosen parameters: math+code on smol_math and smol_code; math+code+shout on
   smol_math, smol_code, smol_math_shout, smol_shout and smol_text (bits per byte), plus the share of smol_math
   generations that end by EOS or a stop string (experiments/rules/smol_eos.py's count, first 40 problems).
   Beside them: each expert alone, the task-arithmetic merge and merge-as-LoRA of the same experts.
The base and adapters are loaded once; every composition is `logitcomp.compose` over that peft model.
Model-written code runs in the sandbox: set HF_ALLOW_CODE_EVAL=1. Writes OUT/rules.json, OUT/rules.md.
Resumable: every finished evaluation is kept in OUT/partial.json (with the limit it ran under), and a
rerun with the same --limit reuses it; delete the file to start over.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

import bridge
from logitcomp import CompositionConfig, compose
from logitcomp.io import atomic_write_bytes
from merging.harness.model import LogitcompLM
from merging.worlds.common import read_jsonl
from smol_eos import TASKS, score as termination

GRID: dict[str, list[dict]] = {
    "product": [{}],
    "tempered": [{"scale": 0.5}, {"scale": 0.75}],
    "activity": [{"gamma": 1.0}, {"gamma": 4.0}],
    "confident": [{"gamma": 4.0}],
    "union": [{}],
    "plausible": [{"alpha": 0.1}, {"alpha": 0.3}],
}
CASES = {"math+code": (("math", "code"), ["smol_math", "smol_code"]),
         "math+code+shout": (("math", "code", "shout"), ["smol_math", "smol_code", "smol_math_shout", "smol_shout", "smol_text"])}
VALIDATION = ["smol_math_val", "smol_code_val", "smol_math_shout_val"]
METRIC = {"smol_math": "exact_match,strict-match", "smol_code": "pass@1,none", "smol_math_shout": "exact_match,none",
          "smol_shout": "styled,none", "smol_text": "bits_per_byte,none"}


def evaluate(model, tok, tasks: list[str], manager: TaskManager, limit: int | None) -> dict[str, float]:
    """task -> the table's metric (validation tasks use their test task's metric); `limit`: documents per task."""
    lm_class = LogitcompLM if hasattr(model, "composition") else HFLM
    lm = lm_class(pretrained=model, tokenizer=tok, batch_size=16)
    scores = {}
    # smol_text on its own: a rule that truncates the distribution (plausible) gives some words zero
    # probability, and lm-eval's perplexity aggregation then overflows; that is reported as inf
    for group in ([t for t in tasks if t != "smol_text"], [t for t in tasks if t == "smol_text"]):
        try:
            out = simple_evaluate(model=lm, tasks=group, task_manager=manager, confirm_run_unsafe_code=True, limit=limit)["results"] if group else {}
            scores.update({t: float(out[t][METRIC[t.removesuffix("_val")]]) for t in group})
        except OverflowError:
            scores.update({t: float("inf") for t in group})
    return scores


class Cache:
    """Finished evaluations by key, in OUT/partial.json, so that an interrupted hour-long run resumes."""

    def __init__(self, path: Path, limit: int | None):
        self.path, self.limit = path, limit
        saved = json.loads(path.read_text()) if path.exists() else {}
        self.rows = saved.get("rows", {}) if saved.get("limit") == limit else {}

    def get(self, key: str, compute) -> dict:
        if key not in self.rows:
            self.rows[key] = compute()
            atomic_write_bytes(self.path, json.dumps({"limit": self.limit, "rows": self.rows}, indent=1).encode())
        return self.rows[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("world", type=Path)
    parser.add_argument("--out", type=Path, default=Path("runs/smol-rules"))
    parser.add_argument("--limit", type=int, help="documents per task (a smoke run; the reported table uses all)")
    args = parser.parse_args()
    start = time.perf_counter()
    base_dir = args.world.resolve() / "base"
    experts = {n: args.world.resolve() / "experts" / n for n in ("math", "code", "shout")}
    tok = AutoTokenizer.from_pretrained(base_dir)
    tok.pad_token = tok.pad_token or tok.eos_token
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), experts["math"], adapter_name="math")
    for name in ("code", "shout"):
        peft_model.load_adapter(experts[name], adapter_name=name)
    peft_model.eval()
    math_docs = read_jsonl(TASKS / "math.jsonl")[:args.limit or 40]
    cache = Cache(args.out / "partial.json", args.limit)

    validation, chosen = {}, {}
    for rule, candidates in GRID.items():
        means = []
        for params in candidates:
            scores = cache.get(f"validation {rule} {json.dumps(params)}", lambda: evaluate(
                compose(peft_model, ["math", "code", "shout"], CompositionConfig(rule=rule, rule_params=params)), tok, VALIDATION, manager, args.limit))
            validation.setdefault(rule, []).append({"params": params, "scores": scores})
            means.append(sum(scores.values()) / len(scores))
            print(f"validation {rule} {params}: {scores}", flush=True)
        chosen[rule] = candidates[max(range(len(means)), key=lambda i: (means[i], -i))]

    rows = {}
    for case, (names, tasks) in CASES.items():
        for rule, params in chosen.items():
            def run(rule=rule, params=params):
                composed = compose(peft_model, list(names), CompositionConfig(rule=rule, rule_params=params))
                row = evaluate(composed, tok, tasks, manager, args.limit)
                if case == "math+code+shout":
                    ends = termination(composed, tok, math_docs, 64, 8)
                    row["ended"] = ends["eos"] + ends["stop_string"]
                return row
            rows[(case, f"composed: {rule}")] = row = cache.get(f"test {case} {rule} {json.dumps(params)}", run)
            print(f"test {case} {rule} {params}: {row}", flush=True)
        paths = {n: experts[n] for n in names}

        def merged(method: str):
            with tempfile.TemporaryDirectory() as tmp:
                if method == "task_arithmetic":
                    model = AutoModelForCausalLM.from_pretrained(bridge.task_arithmetic(base_dir, paths, Path(tmp) / "ta"))
                else:
                    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), bridge.merge_as_lora(base_dir, paths, Path(tmp) / "lora"))
                return evaluate(model.eval(), tok, tasks, manager, args.limit)
        rows[(case, "merged (task arithmetic)")] = cache.get(f"test {case} task_arithmetic", lambda: merged("task_arithmetic"))
        rows[(case, "merged_lora")] = cache.get(f"test {case} merged_lora", lambda: merged("merged_lora"))
    for name in experts:  # each expert alone, on every task of the three-expert case
        peft_model.set_adapter(name)
        rows[("alone", name)] = cache.get(f"alone {name}", lambda: evaluate(peft_model, tok, CASES["math+code+shout"][1], manager, args.limit))

    columns = ["smol_math", "smol_code", "smol_math_shout", "smol_shout", "ended", "smol_text"]
    lines = ["| case | model | smol_math strict | smol_code pass@1 | smol_math_shout | smol_shout | ended by EOS/stop | smol_text bits/byte |",
             "|---|---|---|---|---|---|---|---|"]
    for (case, model), row in rows.items():
        lines.append(f"| {case} | {model} | " + " | ".join(f"{row[c]:.3f}" if c in row else "-" for c in columns) + " |")
    text = "\n".join(lines) + f"\n\nchosen on validation ({', '.join(VALIDATION)}): {json.dumps(chosen)}\n" \
        f"wall time {time.perf_counter() - start:.0f} s, {torch.get_num_threads()} threads\n"
    record = {"grid": GRID, "validation": validation, "chosen": chosen,
              "test": [{"case": c, "model": m, **r} for (c, m), r in rows.items()], "seconds": round(time.perf_counter() - start)}
    atomic_write_bytes(args.out / "rules.json", (json.dumps(record, indent=2) + "\n").encode())
    atomic_write_bytes(args.out / "rules.md", text.encode())
    print(text)


if __name__ == "__main__":
    main()

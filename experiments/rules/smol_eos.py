"""Termination and accuracy of composed SmolLM2 experts under each EOS policy of the runtime.

    python experiments/rules/smol_eos.py smol_world [--limit 40] [--max-new-tokens 64]

The paper saw termination break when more than two experts were composed. For math+code and
math+code+shout, and each EOS policy, this greedy-decodes the first LIMIT problems of the
smol_math task (its prompt, its stop strings, its token limit) and prints exact match on the
final number (the task's two extractions) and how generations end: the EOS token, one of the
task's stop strings, or neither before the token limit.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from logitcomp import ComposedModelForCausalLM, CompositionConfig
from logitcomp.ops import EOS_POLICIES
from merging.worlds.smol.data import math_prompt
from merging.worlds.common import read_jsonl

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "smol"
STOP = ["Question:", "\n\n"]  # the smol_math task's `until`, besides the EOS token
STRICT = re.compile(r"#### (\-?[0-9]+)")  # the task's strict-match filter
NUMBER = re.compile(r"(-?[0-9]+)")  # its flexible-extract filter takes the last match
COMPOSITIONS = {"math+code": ("math", "code"), "math+code+shout": ("math", "code", "shout")}


def _cut(text: str) -> tuple[str, bool]:
    """The text before the first stop string, and whether there was one."""
    hits = [text.index(s) for s in STOP if s in text]
    return (text[: min(hits)], True) if hits else (text, False)


@torch.no_grad()
def score(model, tok, docs: list[dict], max_new: int, batch_size: int) -> dict[str, float]:
    strict = flexible = eos = stop_string = 0
    for i in range(0, len(docs), batch_size):
        chunk = docs[i: i + batch_size]
        batch = tok([math_prompt(d["question"]) for d in chunk], return_tensors="pt", padding=True, padding_side="left")
        out = model.generate(**batch, max_new_tokens=max_new, do_sample=False, stop_strings=STOP, tokenizer=tok,
                             pad_token_id=tok.pad_token_id)
        for d, row in zip(chunk, out[:, batch.input_ids.shape[1]:].tolist()):
            text, hit = _cut(tok.decode(row, skip_special_tokens=True))
            ended = tok.eos_token_id in row and not hit  # a stop string before the EOS token ends it first
            eos += ended
            stop_string += hit
            s, numbers = STRICT.search(text), NUMBER.findall(text)
            strict += bool(s) and s.group(1) == d["number"]
            flexible += bool(numbers) and numbers[-1] == d["number"]
    n = len(docs)
    return {"strict": strict / n, "flexible": flexible / n, "eos": eos / n, "stop_string": stop_string / n,
            "limit": 1 - (eos + stop_string) / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("world", type=Path, help="folder of `logitcomp smol build` + `smol train`")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="the smol_math task's max_gen_toks")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    base = args.world / "base"
    tok = AutoTokenizer.from_pretrained(base)
    tok.pad_token = tok.pad_token or tok.eos_token
    docs = read_jsonl(TASKS / "math.jsonl")[: args.limit]
    print(f"smol_math, first {len(docs)} problems, greedy, max {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} threads")
    print("ended by: eos = the EOS token, stop = a stop string of the task, limit = neither within the token limit")
    print(f"{'experts':<17} {'eos_policy':<10} {'strict':>7} {'flexible':>9} {'eos':>6} {'stop':>6} {'limit':>6} {'seconds':>8}")
    rows = []
    for label, names in COMPOSITIONS.items():
        for policy in EOS_POLICIES:
            start = time.perf_counter()
            experts = {n: args.world / "experts" / n for n in names}
            model = ComposedModelForCausalLM.from_experts(base, experts, config=CompositionConfig(eos_policy=policy))
            result = score(model, tok, docs, args.max_new_tokens, args.batch_size)
            seconds = time.perf_counter() - start
            rows.append({"experts": label, "eos_policy": policy, **result, "seconds": round(seconds, 1)})
            print(f"{label:<17} {policy:<10} {result['strict']:>7.1%} {result['flexible']:>9.1%} {result['eos']:>6.0%} "
                  f"{result['stop_string']:>6.0%} {result['limit']:>6.0%} {seconds:>8.0f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Where the experts of each two-skill family act: the overlap diagnostic on the families' reference answers.

    python scripts/two_skill_diagnostic.py smol_world          # or gemma_world; about a minute
    python scripts/two_skill_diagnostic.py gemma_world --styles xml

For each family (math + shout, math + json, math + xml) it composes the two experts (weights 1), merges them as one
exact LoRA (task arithmetic, weights 1) and runs `bridge.compare` on the first DOCS validation problems
with the answer a model should write (the worked math answer, in capitals or as a JSON object), scoring
the positions that predict answer tokens: `overlap` is the share of those positions where both experts are
active (KL(p_i ‖ p_b) > 0.1 nats), with each expert's mean activity and the mean KL(p̂ ‖ p_merge). The
product rule composes where the experts act on different tokens (low overlap); where both act on one
token they must agree on it. Prints a markdown table and writes WORLD/two_skill_diagnostic.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from diagnostic_correlation import _answer_batch  # noqa: E402

from bridge import merge_as_lora  # noqa: E402
from bridge.diagnostics import compare  # noqa: E402
from logitcomp import ComposedModelForCausalLM  # noqa: E402
from logitcomp.io import atomic_write_bytes  # noqa: E402
from merging.worlds.common import read_jsonl  # noqa: E402
from merging.worlds.smol.styles import STYLES, style_prompt  # noqa: E402

TASKS = Path(__file__).resolve().parents[1] / "recipes" / "tasks" / "smol"
DOCS = 40


def family_summary(root: Path, style: str, threshold: float) -> dict:
    """bridge.compare's summary of math + STYLE on the first DOCS validation problems' reference answers."""
    tokenizer = AutoTokenizer.from_pretrained(root / "base")
    paths = {n: root / "experts" / n for n in ("math", style)}
    composed = ComposedModelForCausalLM.from_experts(root / "base", paths)
    docs = read_jsonl(TASKS / "math_val.jsonl")[:DOCS]
    pairs = [(style_prompt(style, d["question"]), " " + STYLES[style].render(d["answer"])) for d in docs]
    batch, score = _answer_batch(tokenizer, pairs)
    with tempfile.TemporaryDirectory() as tmp:
        merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(root / "base"),
                                           merge_as_lora(root / "base", paths, Path(tmp) / "merged")).eval()
        return compare(composed, merged, batch, threshold=threshold, score=score).summary()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("world", type=Path, help="a smol or gemma world with the experts math and each style of --styles")
    parser.add_argument("--styles", default=",".join(STYLES), help=f"comma-separated, from {', '.join(STYLES)} (default: all)")
    parser.add_argument("--threshold", type=float, default=0.1, help="nats of KL(p_i ‖ p_b) for an expert to count as active")
    args = parser.parse_args(argv)
    styles = args.styles.split(",")
    if unknown := [s for s in styles if s not in STYLES]:
        parser.error(f"--styles: expected names from {', '.join(STYLES)}, got {', '.join(unknown)}")
    summaries = {f"math+{s}": family_summary(args.world, s, args.threshold) for s in styles}
    lines = ["| family | answer tokens | overlap | math activity | style activity | KL(composed ‖ merged) | argmax agreement |",
             "|---|---|---|---|---|---|---|"]
    for family, s in summaries.items():
        math_act, style_act = s["activity_mean"].values()
        lines.append(f"| {family} | {s['tokens']} | {s['overlap']:.1%} | {math_act:.3f} | {style_act:.3f} | "
                     f"{s['kl_composed_merged_mean']:.4f} | {s['argmax_agreement']:.1%} |")
    print("\n".join(lines))
    atomic_write_bytes(args.world / "two_skill_diagnostic.json", (json.dumps(summaries, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

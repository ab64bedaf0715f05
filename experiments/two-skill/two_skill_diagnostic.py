"""Where the experts of each two-skill family act: the overlap diagnostic on the families' reference answers.

    python experiments/two-skill/two_skill_diagnostic.py smol_world          # or gemma_world; about a minute
    python experiments/two-skill/two_skill_diagnostic.py gemma_world --families math+xml,shout+xml
    python experiments/two-skill/two_skill_diagnostic.py smol_world --families math+xml --expert xml=smol_first/experts/xml

For each family (math + shout, math + json, math + xml, math + polite, math + list, math + steps, shout + xml, title + polite) it composes the two experts (weights 1), merges
them as one exact LoRA (task arithmetic, weights 1) and runs `bridge.compare` on the first DOCS documents of the
family's validation task with the answer a model should write (the worked math answer in capitals, as a JSON
object, in an XML element, politely, as a list of its steps or told step by step; the sentence in capitals inside an XML element, or in title case between a polite opening and sign-off), scoring
the positions that predict answer tokens: `overlap` is the share of those positions where both experts are
active (KL(p_i ‖ p_b) > 0.1 nats), with each expert's mean activity and the mean KL(p̂ ‖ p_merge). The
product rule composes where the experts act on different tokens (low overlap); where both act on one
token they must agree on it. `--expert NAME=DIR` takes that expert from DIR instead of WORLD/experts/NAME (one
trained apart, e.g. with another `--wrapped`). Prints a markdown table and writes WORLD/two_skill_diagnostic.json
(with the expert folders it used).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "claims"))  # the study that holds _answer_batch

from diagnostic_correlation import _answer_batch  # noqa: E402

from bridge import merge_as_lora  # noqa: E402
from bridge.diagnostics import compare  # noqa: E402
from logitcomp import ComposedModelForCausalLM  # noqa: E402
from logitcomp.io import atomic_write_bytes  # noqa: E402
from merging.worlds.common import read_jsonl  # noqa: E402
from merging.worlds.smol.styles import render, style_prompt  # noqa: E402

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "smol"
DOCS = 40


# family -> its two experts; a family of two styles asks for both in the order of its task's prompt (smol_shout_xml,
# smol_title_polite)
FAMILIES = {"math+shout": ("math", "shout"), "math+json": ("math", "json"), "math+xml": ("math", "xml"), "math+polite": ("math", "polite"),
            "math+list": ("math", "list"), "math+steps": ("math", "steps"), "shout+xml": ("shout", "xml"),
            "title+polite": ("title", "polite")}


def reference_pairs(family: str) -> list[tuple[str, str]]:
    """(prompt, the answer a model should write) of the first DOCS documents of the family's validation task."""
    first, second = FAMILIES[family]
    if first == "math":
        return [(style_prompt(second, d["question"]), " " + render((second,), d["answer"]))
                for d in read_jsonl(TASKS / "math_val.jsonl")[:DOCS]]
    styles = (second, first)  # "Answer in XML: Answer in capital letters: "
    return [(style_prompt(styles, f"Repeat this sentence: {d['sentence']}"), " " + render(styles, d["sentence"]))
            for d in read_jsonl(TASKS / "shout_val.jsonl")[:DOCS]]


def family_summary(root: Path, family: str, threshold: float, chosen: dict[str, Path]) -> dict:
    """bridge.compare's summary of the family's two experts (WORLD/experts/NAME unless chosen) on its reference answers."""
    tokenizer = AutoTokenizer.from_pretrained(root / "base")
    paths = {n: chosen.get(n, root / "experts" / n) for n in FAMILIES[family]}
    composed = ComposedModelForCausalLM.from_experts(root / "base", paths)
    batch, score = _answer_batch(tokenizer, reference_pairs(family))
    with tempfile.TemporaryDirectory() as tmp:
        merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(root / "base"),
                                           merge_as_lora(root / "base", paths, Path(tmp) / "merged")).eval()
        summary = compare(composed, merged, batch, threshold=threshold, score=score).summary()
    return {**summary, "experts": {n: str(p) for n, p in paths.items()}}


def expert_dirs(values: list[str], parser: argparse.ArgumentParser) -> dict[str, Path]:
    """--expert NAME=DIR values as {NAME: DIR}; each DIR must hold a LoRA adapter."""
    chosen = {}
    for value in values:
        name, sep, folder = value.partition("=")
        if not sep or not (Path(folder) / "adapter_config.json").is_file():
            parser.error(f"--expert: expected NAME=DIR with DIR/adapter_config.json, got {value!r}")
        chosen[name] = Path(folder)
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("world", type=Path, help="a smol or gemma world with the experts of each family of --families")
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, from {', '.join(FAMILIES)} (default: all)")
    parser.add_argument("--expert", action="append", default=[], metavar="NAME=DIR",
                        help="take expert NAME from DIR instead of WORLD/experts/NAME (repeatable)")
    parser.add_argument("--threshold", type=float, default=0.1, help="nats of KL(p_i ‖ p_b) for an expert to count as active")
    args = parser.parse_args(argv)
    families = args.families.split(",")
    if unknown := [f for f in families if f not in FAMILIES]:
        parser.error(f"--families: expected names from {', '.join(FAMILIES)}, got {', '.join(unknown)}")
    chosen = expert_dirs(args.expert, parser)
    if unused := sorted(set(chosen) - {n for f in families for n in FAMILIES[f]}):
        parser.error(f"--expert: {', '.join(unused)} is in none of the families {', '.join(families)}")
    summaries = {f: family_summary(args.world, f, args.threshold, chosen) for f in families}
    lines = ["| family | answer tokens | overlap | first expert's activity | second's | KL(composed ‖ merged) | argmax agreement |",
             "|---|---|---|---|---|---|---|"]
    for family, s in summaries.items():
        first, second = s["activity_mean"].values()
        lines.append(f"| {family} | {s['tokens']} | {s['overlap']:.1%} | {first:.3f} | {second:.3f} | "
                     f"{s['kl_composed_merged_mean']:.4f} | {s['argmax_agreement']:.1%} |")
    print("\n".join(lines))
    atomic_write_bytes(args.world / "two_skill_diagnostic.json", (json.dumps(summaries, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Parameter space vs probability space on the toy world: merges' pair-task accuracy, KL gap, expert overlap.

    python experiments/toy-world/toy_bridge.py toy_world [--out runs/toy_bridge]

For a2b+c2d: the mergekit task-arithmetic merge and the merge-as-LoRA adapter are scored on the pair
task (greedy exact match, plain transformers/peft), then compared with the composed model on the
pair task's sequences at the positions that predict the answer and EOS: KL(p̂ ‖ p_merge), argmax agreement, and the share
of tokens where both experts are active (KL(p_i ‖ p_b) > threshold): 0 means disjoint activity,
the paper's condition for exact composition.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

import bridge
from logitcomp import ComposedModelForCausalLM
from merging.worlds.toy import TASKS, ToyWorld, make_eval_set
from merging.worlds.toy.diagnose import compare_on_docs
from merging.worlds.toy.evaluate import exact_match

EXPERTS = ("a2b", "c2d")


def folder_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in Path(path).glob("*.safetensors")) / 2**20


def report(world: ToyWorld, out: Path, threshold: float = 0.1) -> dict:
    experts = {n: world.expert(n) for n in EXPERTS}
    tokenizer = AutoTokenizer.from_pretrained(world.base)
    docs = make_eval_set(next(t for t in TASKS if t.name == "a2b_c2d"))
    merged_dir = bridge.task_arithmetic(world.base, experts, out / "merged")
    lora_dir = bridge.merge_as_lora(world.base, experts, out / "merged_lora")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    merged_lora = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(world.base), lora_dir).eval()
    composed = ComposedModelForCausalLM.from_experts(world.base, experts)
    comparison, batch = compare_on_docs(composed, merged, tokenizer, docs, world.config.layout, threshold)
    comparison.save_json(out / "compare.json")
    example = batch.input_ids[0][batch.attention_mask[0].bool()].tolist()
    comparison.plot_activity(out / "activity.png", row=0, tokens=tokenizer.convert_ids_to_tokens(batch.input_ids[0].tolist()))
    result = {
        "variant": world.config.variant,
        "pair_accuracy": {
            "composed": exact_match(composed, tokenizer, docs, world.config.layout),
            "task_arithmetic": exact_match(merged, tokenizer, docs, world.config.layout),
            "merge_as_lora": exact_match(merged_lora, tokenizer, docs, world.config.layout),
        },
        "size_mib": {"task_arithmetic": folder_mib(merged_dir), "merge_as_lora": folder_mib(lora_dir)},
        "comparison": comparison.summary(),
        "heatmap_example": tokenizer.decode(example),
    }
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("worlds", nargs="+")
    parser.add_argument("--out", default="runs/toy_bridge")
    parser.add_argument("--threshold", type=float, default=0.1, help="activity threshold in nats")
    args = parser.parse_args()
    for root in args.worlds:
        world = ToyWorld.load(Path(root))
        r = report(world, Path(args.out) / world.config.variant, args.threshold)
        c = r["comparison"]
        print(f"\n{r['variant']} world, a2b+c2d, pair task (200 strings)")
        for name, acc in r["pair_accuracy"].items():
            print(f"  {name:<16} exact match {acc:6.1%}")
        print(f"  size on disk: full merge {r['size_mib']['task_arithmetic']:.2f} MiB, merge-as-LoRA {r['size_mib']['merge_as_lora']:.3f} MiB")
        print(f"  KL(composed||merged) mean {c['kl_composed_merged_mean']:.4f} max {c['kl_composed_merged_max']:.3f} nats; "
              f"KL(merged||composed) mean {c['kl_merged_composed_mean']:.4f}; argmax agreement {c['argmax_agreement']:.1%}")
        print(f"  expert overlap (both KL(p_i||p_b) > {c['threshold']}): {c['overlap']:.1%} of {c['tokens']} tokens; "
              f"mean activity {json.dumps({k: round(v, 3) for k, v in c['activity_mean'].items()})}")


if __name__ == "__main__":
    main()

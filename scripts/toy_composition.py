"""Greedy exact match of composed toy experts vs each expert alone, on the pair and triple tasks.

    python scripts/toy_composition.py toy_world [toy_world_entangled ...]
"""

from __future__ import annotations

import argparse

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp import ComposedModelForCausalLM
from merging.toy import TASKS, ToyWorld, make_eval_set
from merging.toy.evaluate import exact_match

COMPOSITIONS = {"a2b+c2d": ("a2b", "c2d"), "a2b+c2d+e2f": ("a2b", "c2d", "e2f")}
EVAL_TASKS = ("a2b_c2d", "a2b_c2d_e2f")


def score_world(world: ToyWorld, size: int = 200) -> dict[str, dict[str, float]]:
    """model -> task -> exact match, for each expert alone and each composition."""
    tokenizer = AutoTokenizer.from_pretrained(world.base)
    docs = {t.name: make_eval_set(t, size=size) for t in TASKS if t.name in EVAL_TASKS}
    models = {}
    for name in world.config.experts:
        models[name] = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(world.base), world.expert(name)).eval()
    for label, names in COMPOSITIONS.items():
        models[f"composed {label}"] = ComposedModelForCausalLM.from_experts(world.base, {n: world.expert(n) for n in names})
    return {m: {t: exact_match(model, tokenizer, d) for t, d in docs.items()} for m, model in models.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("worlds", nargs="+", help="toy world folders (logitcomp toy build)")
    args = parser.parse_args()
    for root in args.worlds:
        world = ToyWorld.load(root)
        print(f"\n{world.config.variant} world ({root}), greedy exact match, 200 strings per task")
        print(f"{'model':<26} {'pair a2b_c2d':>13} {'triple a2b_c2d_e2f':>19}")
        for model, row in score_world(world).items():
            print(f"{model:<26} {row['a2b_c2d']:>13.1%} {row['a2b_c2d_e2f']:>19.1%}")


if __name__ == "__main__":
    main()

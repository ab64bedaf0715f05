"""The rows of a comparison: variant kinds and, per kind, how its model is built for lm-eval.

A registry (kind -> builder) rather than if/elif on strings: a new kind is one function and one
entry in `KINDS`. Nothing here imports torch until a model is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from logitcomp.inputs import expert_kind

from .recipe import Recipe, ResolvedPaths


@dataclass(frozen=True)
class Variant:
    """One row of the comparison: `kind` is a key of `KINDS`."""

    name: str
    kind: str


def plan(recipe: Recipe) -> list[Variant]:
    """The recipe's rows in order; `experts` expands into one row per expert."""
    rows = []
    for v in recipe.variants:
        rows += [Variant(n, "expert") for n in recipe.experts] if v == "experts" else [Variant(v, v)]
    return rows


def _options(recipe: Recipe):
    from logitcomp.loading import LoadOptions

    ev = recipe.evaluate
    return LoadOptions(None if ev.dtype == "auto" else ev.dtype, ev.device, recipe.allow_pickle, recipe.trust_remote_code)


def _base_model(recipe: Recipe, paths: ResolvedPaths):
    from logitcomp.loading import load_model

    return load_model("base", paths.base, _options(recipe))


def _with_adapter(recipe: Recipe, paths: ResolvedPaths, adapter: Path, label: str):
    from peft import PeftModel

    from logitcomp.weightfiles import check_finite

    check_finite(label, adapter)
    try:
        return PeftModel.from_pretrained(_base_model(recipe, paths), adapter)
    except RuntimeError as exc:  # torch's "size mismatch for ..." (check_inputs compares the shapes first)
        raise ValueError(f"{label}: {adapter} does not fit the base {paths.base} ({str(exc).strip().splitlines()[-1]})") from None


def load_composed(recipe: Recipe, paths: ResolvedPaths, config=None):
    """The recipe's composed model (with `config`: that CompositionConfig instead of the recipe's)."""
    from logitcomp import ComposedModelForCausalLM

    o = _options(recipe)
    return ComposedModelForCausalLM.from_experts(paths.base, paths.experts, config=config or recipe.composition(), dtype=o.dtype,
                                                 device=o.device, allow_pickle=o.allow_pickle, trust_remote_code=o.trust_remote_code)


def build_merges(recipe: Recipe, paths: ResolvedPaths, kinds=("merged", "merged_lora")) -> dict[str, Path]:
    """Build the recipe's parameter-space models into OUTPUT/models (mergekit and merge-as-LoRA)."""
    import bridge

    weights = {n: e.weight for n, e in recipe.experts.items()}
    built = {}
    if "merged" in kinds:
        built["merged"] = bridge.task_arithmetic(paths.base, paths.experts, paths.output / "models" / "merged", weights,
                                                 recipe.merge.method, recipe.merge.parameters, device=recipe.evaluate.device)
    if "merged_lora" in kinds and recipe.merge.lora:
        built["merged_lora"] = bridge.merge_as_lora(paths.base, paths.experts, paths.output / "models" / "merged_lora", weights)
    return built


def _expert(variant: Variant, recipe: Recipe, paths: ResolvedPaths):
    from logitcomp.loading import load_model

    path = paths.experts[variant.name]
    if expert_kind(variant.name, path) == "lora":
        return _with_adapter(recipe, paths, path, f"experts.{variant.name}")
    return load_model(f"experts.{variant.name}", path, _options(recipe))


def _merged(variant: Variant, recipe: Recipe, paths: ResolvedPaths):
    from logitcomp.loading import load_model

    return load_model("merged", build_merges(recipe, paths, ("merged",))["merged"], _options(recipe))


def _merged_lora(variant: Variant, recipe: Recipe, paths: ResolvedPaths):
    return _with_adapter(recipe, paths, build_merges(recipe, paths, ("merged_lora",))["merged_lora"], "merged_lora")


# kind -> (variant, recipe, paths) -> the model lm-eval scores; `composed` is the one with its own lm-eval class
KINDS: dict[str, Callable] = {
    "base": lambda variant, recipe, paths: _base_model(recipe, paths),
    "expert": _expert,
    "composed": lambda variant, recipe, paths: load_composed(recipe, paths),
    "merged": _merged,
    "merged_lora": _merged_lora,
}


def lm_eval_model(variant: Variant, recipe: Recipe, paths: ResolvedPaths):
    """The lm-eval model of one variant: `LogitcompLM` for a composition, HFLM for every plain model."""
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    from logitcomp import ComposedModelForCausalLM

    from .harness import LogitcompLM

    tokenizer = AutoTokenizer.from_pretrained(paths.base, trust_remote_code=recipe.trust_remote_code)
    model = KINDS[variant.kind](variant, recipe, paths)
    lm_class = LogitcompLM if isinstance(model, ComposedModelForCausalLM) else HFLM
    return lm_class(pretrained=model.eval(), tokenizer=tokenizer, batch_size=recipe.evaluate.batch_size)

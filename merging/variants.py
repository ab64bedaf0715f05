"""The models of a run's rows, built for lm-eval; the base is loaded once per run.

`ModelPool` holds the run's base model and wraps it, at the first LoRA row, in one PeftModel that
holds every LoRA expert (and each merged_lora row's adapter while that row is evaluated): the base
row runs with the adapters disabled, an expert row with its adapter active, a composed row as
`ComposedModelForCausalLM` over the same PeftModel. Full-model experts and mergekit merges are
loaded per row and dropped after it. Nothing here imports torch until a model is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from logitcomp.inputs import expert_kind

from .plan import Variant, plan
from .recipe import Recipe, ResolvedPaths


def _options(recipe: Recipe):
    from logitcomp.loading import LoadOptions

    from .distributed import local_device

    ev = recipe.evaluate
    return LoadOptions(None if ev.dtype == "auto" else ev.dtype, local_device(ev.device), recipe.allow_pickle, recipe.trust_remote_code)


def load_composed(recipe: Recipe, paths: ResolvedPaths, config=None):
    """The recipe's composed model loaded on its own (with `config`: that CompositionConfig instead of the recipe's)."""
    from logitcomp import ComposedModelForCausalLM

    o = _options(recipe)
    return ComposedModelForCausalLM.from_experts(paths.base, paths.experts, config=config or recipe.composition(), dtype=o.dtype,
                                                 device=o.device, allow_pickle=o.allow_pickle, trust_remote_code=o.trust_remote_code)


def build_merge(variant: Variant, recipe: Recipe, paths: ResolvedPaths, lora_cache: Path | None = None) -> Path:
    """Build a merged or merged_lora row's model into OUTPUT/models/NAME (mergekit, or merge-as-LoRA).
    `lora_cache`: a folder mergekit keeps the LoRA experts merged into the base in, shared by a run's merges."""
    import bridge

    out = paths.output / "models" / variant.name
    if variant.kind == "merged":
        return bridge.task_arithmetic(paths.base, paths.experts, out, variant.weights, variant.method, variant.parameters,
                                      device=recipe.evaluate.device, lora_cache=lora_cache, options=recipe.merge.options.model_dump())
    return bridge.merge_as_lora(paths.base, paths.experts, out, variant.weights)


def build_merges(recipe: Recipe, paths: ResolvedPaths) -> dict[str, Path]:
    """Every merged and merged_lora row of the recipe (`logitcomp merge`); the default pair when it lists none."""
    rows = [v for v in plan(recipe) if v.kind in ("merged", "merged_lora")]
    if not rows:
        defaults = [v for v in ("merged", "merged_lora") if v == "merged" or recipe.merge.lora]
        rows = plan(recipe.model_copy(update={"variants": defaults}))
    return {v.name: build_merge(v, recipe, paths) for v in rows}


class ModelPool:
    """The models of one run's rows; `model(row)` is a context holding the row's model ready for lm-eval.
    Its inputs are those `runner.check_inputs` has checked (adapter files scanned for NaN/inf included)."""

    def __init__(self, recipe: Recipe, paths: ResolvedPaths, lora_cache: Path | None = None):
        self.recipe, self.paths, self.lora_cache = recipe, paths, lora_cache
        self._base = self._peft = None
        self._lora = [n for n, p in paths.experts.items() if expert_kind(n, p) == "lora"]

    def _base_model(self):
        from logitcomp.loading import load_model

        if self._base is None:
            self._base = load_model("base", self.paths.base, _options(self.recipe))
        return self._base

    def _attach(self, adapter: str, path: Path, label: str):
        """Load one adapter into the shared PeftModel (made around the base at the first one)."""
        from logitcomp.loading import attach_lora

        try:
            self._peft = attach_lora(self._peft or self._base_model(), adapter, path, self.paths.base, _options(self.recipe))
        except ValueError as exc:
            raise ValueError(f"{label}: {exc}") from None

    def _peft_model(self):
        """The PeftModel holding every LoRA expert (None when the recipe has none and no merged_lora row came yet)."""
        for name in self._lora:
            if self._peft is None or name not in self._peft.peft_config:
                self._attach(name, self.paths.experts[name], f"experts.{name}")
        return self._peft

    def _full_expert(self, name: str):
        from logitcomp.loading import check_same_vocabulary, load_model

        model = load_model(f"experts.{name}", self.paths.experts[name], _options(self.recipe))
        check_same_vocabulary(name, self.paths.experts[name], self.paths.base, model, self._base_model())
        return model

    def _merge(self, row: Variant) -> Path:
        """The row's merge, built by rank 0 alone under a launcher (the others wait for its folder)."""
        from .distributed import broadcast, world

        return broadcast(build_merge(row, self.recipe, self.paths, self.lora_cache) if world()[0] == 0 else None)

    @contextlib.contextmanager
    def model(self, row: Variant) -> Iterator:
        """Yield the model lm-eval scores for `row` (adapters of the shared PeftModel are set for the row inside)."""
        from logitcomp import ComposedModelForCausalLM
        from logitcomp.loading import load_model

        peft = self._peft_model()
        if row.kind == "base":
            with peft.disable_adapter() if peft is not None else contextlib.nullcontext():
                yield self._base_model() if peft is None else peft
        elif row.kind == "expert" and row.name in self._lora:
            peft.set_adapter(row.name)
            yield peft
        elif row.kind == "expert":
            yield self._full_expert(row.name)
        elif row.kind == "composed":
            full = {n: self._full_expert(n) for n in self.paths.experts if n not in self._lora}
            sources = {"base": str(self.paths.base), "full": {n: str(self.paths.experts[n]) for n in full}}
            yield ComposedModelForCausalLM(peft if peft is not None else self._base_model(), list(self.paths.experts), full, row.config, sources)
        elif row.kind == "merged":
            yield load_model(row.name, self._merge(row), _options(self.recipe))
        else:  # merged_lora: its adapter joins the shared PeftModel for this row only
            from logitcomp.weightfiles import check_finite

            adapter = f"merged_lora_{len(self._peft.peft_config) if self._peft else 0}"  # peft names cannot hold '.' or '['
            path = self._merge(row)
            check_finite(row.name, path)  # (the experts' adapters were scanned by runner.check_inputs)
            self._attach(adapter, path, row.name)
            try:
                self._peft.set_adapter(adapter)
                yield self._peft
            finally:  # (peft warns when the active adapter is deleted: activate another first)
                others = [a for a in self._peft.peft_config if a != adapter]
                if others:
                    self._peft.set_adapter(others[0])
                    self._peft.delete_adapter(adapter)


def lm_eval_model(model, recipe: Recipe, paths: ResolvedPaths):
    """The lm-eval model over `model`: `LogitcompLM` for a composition, HFLM for every plain model (both data parallel under a launcher)."""
    from transformers import AutoTokenizer

    from logitcomp import ComposedModelForCausalLM

    from .harness import InMemoryHFLM, LogitcompLM

    tokenizer = AutoTokenizer.from_pretrained(paths.base, trust_remote_code=recipe.trust_remote_code)
    lm_class = LogitcompLM if isinstance(model, ComposedModelForCausalLM) else InMemoryHFLM
    return lm_class(pretrained=model.eval(), tokenizer=tokenizer, batch_size=recipe.evaluate.batch_size)

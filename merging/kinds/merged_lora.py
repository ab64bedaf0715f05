"""The `merged_lora` rows: task arithmetic of LoRA experts as one exact LoRA adapter (bridge.merge_as_lora),
evaluated as a temporary adapter of the run's shared PeftModel. Sweeps λ only (every expert's weight times λ)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from .kind import SWEEP_KEY, Kind, Options, Variant


class MergedLoraKind(Kind):
    name = "merged_lora"
    options = Options
    default = True
    merges = True
    combines = True

    def unavailable(self, recipe) -> str | None:
        return None if recipe.merge.lora else "variants: merged_lora needs merge.lora: true"

    def check_sweep(self, key: str) -> str | None:
        return None if key == SWEEP_KEY else f"sweep: a merged_lora variant sweeps {SWEEP_KEY} only, got {key!r}"

    def build(self, row: Variant, recipe, paths, lora_cache: Path | None = None, folder: Path | None = None) -> Path:
        import bridge

        experts = {n: paths.experts[n] for n in row.experts}
        return bridge.merge_as_lora(paths.base, experts, folder or paths.output / "models" / row.name, row.weights)

    def export(self, row: Variant, pool, out: Path, self_contained: bool = False) -> None:
        self.build(row, pool.recipe, pool.paths, folder=out)

    @contextmanager
    def model(self, row: Variant, pool):
        from logitcomp.weightfiles import check_finite

        path = pool.merge(self, row)
        check_finite(row.name, path)  # (the experts' adapters were scanned by checks.check_inputs)
        with pool.adapter(row.name, path) as peft:
            yield peft

"""The `experts` rows: one per expert, each alone (a LoRA expert as the shared PeftModel's active adapter)."""

from __future__ import annotations

from contextlib import contextmanager

from .kind import Kind, Variant


class ExpertsKind(Kind):
    name = "experts"
    default = True

    def rows(self, spec, recipe) -> list[Variant]:
        return [Variant(n, self.name) for n in recipe.experts]

    def inputs(self, row: Variant, recipe) -> list[str]:
        return [row.name]

    @contextmanager
    def model(self, row: Variant, pool):
        if row.name in pool.lora:
            peft = pool.peft()
            peft.set_adapter(row.name)
            yield peft
        else:
            yield pool.full_expert(row.name)

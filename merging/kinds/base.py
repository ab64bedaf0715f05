"""The `base` row: the base model alone (the shared PeftModel with its adapters disabled)."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

from .kind import Kind, Variant


class BaseKind(Kind):
    name = "base"
    default = True

    def rows(self, spec, recipe) -> list[Variant]:
        return [Variant("base", self.name)]

    def inputs(self, row: Variant, recipe) -> list[str]:
        return []

    @contextmanager
    def model(self, row: Variant, pool):
        peft = pool.peft()
        with peft.disable_adapter() if peft is not None else nullcontext():
            yield pool.base() if peft is None else peft

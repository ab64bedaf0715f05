"""The `experts` rows: one per expert, each alone (a LoRA expert as the shared PeftModel's active adapter);
`{name: mine, kind: experts, experts: [math, code]}` only those experts (each row named after its expert)."""

from __future__ import annotations

from contextlib import contextmanager

from .kind import Kind, Options, Variant


class ExpertsOptions(Options):
    """A named experts row has no options of its own; `experts: [a, b]` lists the experts that get a row."""


class ExpertsKind(Kind):
    name = "experts"
    options = ExpertsOptions
    default = True
    combines = True  # (it combines none: a named row may list the experts that get a row)

    def rows(self, spec, recipe) -> list[Variant]:
        return [Variant(n, self.name) for n in spec.experts or recipe.experts]

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

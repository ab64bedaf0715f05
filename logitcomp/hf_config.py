"""The `config.json` of a composition folder (`ComposedConfig`, model_type "logitcomp"): what makes the
folder a transformers model folder (`logitcomp.auto` registers it with the Auto classes).
`composition.json` stays the one source a composition is loaded from.
"""

from __future__ import annotations

from transformers import PretrainedConfig

MODEL_TYPE = "logitcomp"


class ComposedConfig(PretrainedConfig):
    """The config.json of a composition folder: its base (relative to the folder), experts and options."""

    model_type = MODEL_TYPE

    def __init__(self, base: str | None = None, experts: dict | None = None, composition: dict | None = None, **kwargs):
        self.base = base
        self.experts = dict(experts or {})
        self.composition = dict(composition or {})
        super().__init__(**kwargs)

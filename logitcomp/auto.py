"""The Auto classes' entry for composition folders. `import logitcomp` registers `ComposedConfig` with
`AutoConfig` and this entry with `AutoModelForCausalLM` when transformers' auto modules load
(logitcomp/__init__.py), so `AutoConfig`, `AutoModelForCausalLM`, `AutoTokenizer`,
`pipeline("text-generation", model=FOLDER)` and `lm_eval --model hf` open a folder that
`save_pretrained` wrote, and `pipeline` accepts a composed model without an error-level log; the model type is
also listed among transformers' causal-LM types, so that lm-eval's HFLM takes it as one without a warning.
"""

from __future__ import annotations

from transformers import AutoConfig

from .hf_config import MODEL_TYPE, ComposedConfig


class ComposedModelForCausalLM:
    """The Auto classes' entry for `ComposedConfig`: opens the folder with the real
    `logitcomp.ComposedModelForCausalLM`, imported (with peft) only then, not whenever transformers'
    Auto classes load. It carries the real class's name because `pipeline` checks models by class name."""

    config_class = ComposedConfig

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        from .model import ComposedModelForCausalLM

        return ComposedModelForCausalLM.from_pretrained(*args, **kwargs)


def register_config() -> None:
    AutoConfig.register(MODEL_TYPE, ComposedConfig, exist_ok=True)


def register_model() -> None:
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    register_config()
    AutoModelForCausalLM.register(ComposedConfig, ComposedModelForCausalLM, exist_ok=True)
    # the model types a causal LM has (what lm-eval's HFLM reads to pick its causal backend without a warning)
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(MODEL_TYPE, ComposedModelForCausalLM.__name__)

"""logitcomp: compose a base LLM's experts in probability space at every decoding step.

Names load lazily: `import logitcomp` and `logitcomp.CompositionConfig` import no torch; the
first touch of a model or tensor function imports it. A composition folder opens with transformers'
Auto classes once `logitcomp` is imported: its config and model are registered with them when
transformers' auto modules load (`auto`).
"""

from .hooks import after_import
from .lazy import lazy_exports


def _register_config() -> None:
    from .auto import register_config

    register_config()


def _register_model() -> None:
    from .auto import register_model

    register_model()


after_import("transformers.models.auto.configuration_auto", _register_config)
after_import("transformers.models.auto.modeling_auto", _register_model)

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".config": ("CompositionConfig",),
    ".model": ("ComposedModelForCausalLM", "compose"),
    ".outputs": ("ComposedCache", "ComposedCausalLMOutput", "CompositionTrace"),
    ".ops": ("apply_eos_policy", "clamped_logprobs", "compose_logprobs", "entropy", "kl_divergence"),
    ".routing_fit": ("fit_routing",),
})

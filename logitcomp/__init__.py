"""logitcomp: compose a base LLM's experts in probability space at every decoding step.

Names load lazily: `import logitcomp` and `logitcomp.CompositionConfig` import no torch; the
first touch of a model or tensor function imports it.
"""

from .lazy import lazy_exports

_EXPORTS = {
    "CompositionConfig": ".config",
    "ComposedCache": ".model",
    "ComposedCausalLMOutput": ".model",
    "ComposedModelForCausalLM": ".model",
    "CompositionTrace": ".model",
    "compose": ".model",
    "apply_eos_policy": ".ops",
    "clamped_logprobs": ".ops",
    "compose_logprobs": ".ops",
    "entropy": ".ops",
    "kl_divergence": ".ops",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

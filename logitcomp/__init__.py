"""logitcomp: compose a base LLM's experts in probability space at every decoding step.

Names load lazily: `import logitcomp` and `logitcomp.CompositionConfig` import no torch; the
first touch of a model or tensor function imports it.
"""

from .lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".config": ("CompositionConfig",),
    ".model": ("ComposedCache", "ComposedCausalLMOutput", "ComposedModelForCausalLM", "CompositionTrace", "compose"),
    ".ops": ("apply_eos_policy", "clamped_logprobs", "compose_logprobs", "entropy", "kl_divergence"),
    ".routing": ("fit_routing",),
})

"""logitcomp: compose a base LLM's experts in probability space at every decoding step."""

from .config import CompositionConfig
from .model import ComposedCache, ComposedCausalLMOutput, ComposedModelForCausalLM, CompositionTrace, compose
from .ops import apply_eos_policy, clamped_logprobs, compose_logprobs, entropy, kl_divergence

__all__ = [
    "ComposedCache",
    "ComposedCausalLMOutput",
    "ComposedModelForCausalLM",
    "CompositionConfig",
    "CompositionTrace",
    "apply_eos_policy",
    "clamped_logprobs",
    "compose",
    "compose_logprobs",
    "entropy",
    "kl_divergence",
]

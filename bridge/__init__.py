"""bridge: parameter-space merges of the experts that logitcomp composes, and diagnostics between the two."""

from .diagnostics import Comparison, compare
from .lora_merge import merge_as_lora
from .mergekit_merge import merge_methods, mergekit_config, task_arithmetic

__all__ = ["Comparison", "compare", "merge_as_lora", "merge_methods", "mergekit_config", "task_arithmetic"]

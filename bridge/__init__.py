"""bridge: parameter-space merges of the experts that logitcomp composes, and diagnostics between the two."""

from logitcomp.lazy import lazy_exports

_EXPORTS = {
    "Comparison": ".diagnostics",
    "compare": ".diagnostics",
    "merge_as_lora": ".lora_merge",
    "merge_methods": ".mergekit_merge",
    "mergekit_config": ".mergekit_merge",
    "task_arithmetic": ".mergekit_merge",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

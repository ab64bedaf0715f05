"""bridge: parameter-space merges of the experts that logitcomp composes, and diagnostics between the two."""

from logitcomp.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".diagnostics": ("Comparison", "compare"),
    ".distill": ("distill", "teacher_targets", "train_student"),
    ".lora_merge": ("merge_as_lora",),
    ".mergekit_merge": ("merge_methods", "mergekit_config", "task_arithmetic"),
})

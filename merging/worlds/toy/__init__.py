"""The toy world: the paper's letter-substitution experiment, trained on this machine.

    logitcomp toy build DIR [--variant entangled] [--seed N]
    logitcomp toy tasks DIR
"""

from logitcomp.lazy import lazy_exports

_EXPORTS = {
    "ACCURACY_BAR": ".build",
    "ToyBuildError": ".build",
    "ToyConfig": ".build",
    "ToyWorld": ".build",
    "build_toy_world": ".build",
    "ensure_toy_world": ".build",
    "RULES": ".data",
    "TASKS": ".data",
    "apply_rules": ".data",
    "make_eval_set": ".data",
    "write_task_files": ".data",
    "make_tokenizer": ".tokenizer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

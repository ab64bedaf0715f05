"""The toy world: the paper's letter-substitution experiment, trained on this machine.

    logitcomp toy build DIR [--variant entangled] [--seed N] [--layout padded] [--noise SHARE]
                            [--architecture gpt2] [--full-experts] [--experts a2k,m2b]
    logitcomp toy tasks DIR
"""

from logitcomp.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    ".build": ("ACCURACY_BAR", "ToyBuildError", "ToyConfig", "ToyWorld", "build_toy_world", "ensure_toy_world"),
    ".data": ("RULES", "TASKS", "apply_rules", "make_eval_set", "make_validation_set", "write_task_files"),
    ".tokenizer": ("make_tokenizer",),
})

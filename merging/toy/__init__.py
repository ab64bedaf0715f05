"""The toy world: the paper's letter-substitution experiment, trained on this machine."""

from .build import ACCURACY_BAR, ToyBuildError, ToyConfig, ToyWorld, build_toy_world
from .data import RULES, TASKS, apply_rules, make_eval_set, write_task_files
from .tokenizer import make_tokenizer

__all__ = [
    "ACCURACY_BAR",
    "RULES",
    "TASKS",
    "ToyBuildError",
    "ToyConfig",
    "ToyWorld",
    "apply_rules",
    "build_toy_world",
    "make_eval_set",
    "make_tokenizer",
    "write_task_files",
]

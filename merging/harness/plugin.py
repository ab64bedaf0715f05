"""Makes `lm_eval --model logitcomp` work with an lm-eval that reads no entry points.

lm-eval 0.4.13 fills its model registry by importing `lm_eval.models` and has no plugin
mechanism, so an installed package cannot add a model name to the plain `lm_eval` command.
The `logitcomp-lm-eval.pth` file that installs with this package imports this module at
interpreter start-up; it only adds an import hook (nothing of lm-eval or torch is imported).
When `lm_eval.models` is first imported, the hook registers `logitcomp` as a lazy
placeholder for `merging.harness.model:LogitcompLM`; lm-eval imports the class only when the
name is used. lm-eval versions that read the `lm_eval.models` entry points find the same
placeholder there; registering an equal placeholder twice is a no-op in lm-eval's registry.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

MODEL_NAME = "logitcomp"
TARGET = "merging.harness.model:LogitcompLM"
_WATCHED = "lm_eval.models"


def register() -> None:
    from lm_eval.api.registry import model_registry

    model_registry.register(MODEL_NAME, target=TARGET)


class _RegisteringLoader(importlib.abc.Loader):
    """Runs the real loader of `lm_eval.models`, then registers the placeholder."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _WATCHED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RegisteringLoader(spec.loader)
        return spec


def install() -> None:
    if _WATCHED in sys.modules:
        register()
    elif not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())

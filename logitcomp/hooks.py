"""Run a function right after a module is first imported (a post-import hook), importing nothing itself.

Used where a registration needs a heavy package that the registering package must not import on its own:
`import logitcomp` registers the composition folder's config and model with transformers' Auto classes when
transformers' auto modules load (or at once, when they already have), so `import logitcomp` stays torch-free;
the `lm_eval` plugin registers its model name when `lm_eval.models` loads.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable


class _RunAfterLoader(importlib.abc.Loader):
    """Runs the real loader of a module, then the callbacks waiting for it."""

    def __init__(self, loader: importlib.abc.Loader, callbacks: list[Callable[[], None]]):
        self._loader, self._callbacks = loader, callbacks

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        for callback in self._callbacks:
            callback()


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self.waiting: dict[str, list[Callable[[], None]]] = {}

    def find_spec(self, fullname, path, target=None):
        callbacks = self.waiting.pop(fullname, None)
        if callbacks is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RunAfterLoader(spec.loader, callbacks)
        return spec


def after_import(module: str, callback: Callable[[], None]) -> None:
    """Call `callback()` once `module` has been imported: now if it already is, else right after its first import."""
    if module in sys.modules:
        callback()
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
    if finder is None:
        finder = _Finder()
        sys.meta_path.insert(0, finder)
    finder.waiting.setdefault(module, []).append(callback)

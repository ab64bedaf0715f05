"""Lazy package exports (PEP 562): a package names what it offers without importing torch.

Used by the `logitcomp`, `bridge` and world packages so that the CLI and the recipe schema start
in a fraction of a second; a name's module is imported the first time the name is touched.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]]) -> tuple[list[str], Callable[[str], object], Callable[[], list[str]]]:
    """`(__all__, __getattr__, __dir__)` for `package`, whose `modules` map a submodule (`.model`) to the names it exports."""
    namespace = importlib.import_module(package).__dict__
    exports = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return sorted(exports), __getattr__, __dir__

"""User-facing errors: `RecipeError` and the one-line form every command prints."""

from __future__ import annotations


class RecipeError(ValueError):
    """A recipe that cannot be used; the message is one line naming the file and the field."""


def one_line(exc: BaseException) -> str:
    """An exception as one line: the first line of its message (the type when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__

"""User-facing errors: `RecipeError`, the one-line form every command prints, and the message for a non-number."""

from __future__ import annotations


class RecipeError(ValueError):
    """A recipe that cannot be used; the message is one line naming the file and the field."""


def one_line(exc: BaseException) -> str:
    """An exception as one line: the first line of its message (the type when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def not_a_number(value) -> str:
    """The message for a value that should be a number; YAML 1.1 reads `1.0e38` (no sign after e) as text."""
    try:
        float(value)
    except (TypeError, ValueError):
        return f"expected a number, got {value!r}"
    return f"expected a number, got the text {value!r} (YAML reads an exponent without a sign as text: write 1.0e+38)"

"""User-facing errors: `RecipeError`, the one-line form every command prints, the message for a non-number, and
the nearest allowed name of an unknown one."""

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


def did_you_mean(name: str, allowed) -> str:
    """` (did you mean 'x'?)` for the allowed name nearest to `name`, or nothing when none is near."""
    import difflib

    near = difflib.get_close_matches(str(name), [str(a) for a in allowed], n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def unknown_key(key, allowed, of: str = "") -> str:
    """The message for a key a mapping may not hold: `unknown key 'x'[ of]` (did you mean ...); allowed keys: ...`."""
    return f"unknown key {key!r}{of}{did_you_mean(key, allowed)}; allowed keys: {', '.join(allowed)}"

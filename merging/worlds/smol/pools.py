"""Unlabeled two-skill prompts for distillation (`logitcomp world smol prompts`): requests in the form of a two-skill
task's prompts (`smol_math_polite`, `smol_title_polite`, ...), drawn from the training material, never a test or
validation document's.

A pair `math+STYLE` asks a word problem of the training templates (the test and validation problems come from
other templates) in STYLE; a pair `STYLE1+STYLE2` asks to repeat a sentence of the standard library's function
docstrings (the test and validation sentences come from module and class docstrings) in both styles, the first
outermost (`polite+title`: the prompt of `smol_title_polite`). Any prompt equal to one of the test or validation
prompts of the pair's tasks, or whose sentence or question is one of theirs, is dropped (and counted).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from logitcomp.io import atomic_write_bytes

from .data import TASK_SIZES, VAL_SIZES, math_problems, shout_sentences
from .styles import STYLES, function_sentences, style_prompt


def pair_prompts(pair: str, size: int, seed: int = 0) -> tuple[list[str], int]:
    """`size` distinct prompts of `pair` (module docstring) and how many drawn ones were dropped as test or
    validation material."""
    first, _, second = pair.partition("+")
    if first == "math" and second in STYLES:
        held = {d["question"] for split, n in (("test", TASK_SIZES["math"]), ("val", VAL_SIZES["math"])) for d in math_problems(split, n, seed)}
        drawn = [(d["question"], style_prompt(second, d["question"])) for d in math_problems("train", 4 * size, seed)]
    elif first in STYLES and second in STYLES and first != second:
        held = {d["sentence"] for split, n in (("test", TASK_SIZES["shout"]), ("val", VAL_SIZES["shout"])) for d in shout_sentences(split, n)}
        sentences = [s for _, s in function_sentences()]
        random.Random(f"{seed}:pool:{pair}").shuffle(sentences)
        drawn = [(s, style_prompt((first, second), f"Repeat this sentence: {s}")) for s in sentences]
    else:
        raise ValueError(f"--pairs: expected math+STYLE or STYLE+STYLE with STYLE one of {sorted(STYLES)}, got {pair!r}")
    kept, dropped = [], 0
    for content, prompt in drawn:
        if content in held:
            dropped += 1
        elif prompt not in kept:
            kept.append(prompt)
        if len(kept) == size:
            break
    if len(kept) < size:
        raise ValueError(f"--size: the pair {pair} has {len(kept)} distinct prompts outside its test and validation sets, asked for {size}")
    return kept, dropped


def write_pair_prompts(root: Path, pairs: list[str], size: int, seed: int = 0) -> dict[str, tuple[Path, int]]:
    """ROOT/prompts/A_B.jsonl for each pair ({"prompt": ...} lines, atomically). Returns pair -> (file, dropped)."""
    out = {}
    for pair in pairs:
        prompts, dropped = pair_prompts(pair, size, seed)
        path = Path(root) / "prompts" / f"{pair.replace('+', '_')}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, "".join(json.dumps({"prompt": p}) + "\n" for p in prompts).encode())
        out[pair] = (path, dropped)
    return out

"""LoRA experts of a world's base (SmolLM2-135M-Instruct, Gemma 3 270M), trained on CPU from the seeded data.

Each expert sees prompts in the format of its lm-eval task and is scored on the answer tokens
and the end-of-sequence token only, so it learns both the skill and where to stop. Its folder also gets
`prompts.jsonl`: a seeded sample of its training prompts, what routed compositions fit their centroids on
(`logitcomp.routing`; a recipe's `route:` reads it by default).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from logitcomp.io import atomic_dir
from logitcomp.loading import save_adapter

from ..common import LORA_TARGETS, pad_right, train_loop, write_prompts
from . import CONTENTS, WRAPPED
from .data import code_tasks, math_problems, math_prompt
from .styles import STYLES, style_pairs


def _math_pairs(seed: int) -> list[tuple[str, str]]:
    return [(math_prompt(d["question"]), " " + d["answer"]) for d in math_problems("train", 2000, seed)]


def _code_pairs(seed: int) -> list[tuple[str, str]]:
    return [(d["prompt"], d["solution"]) for d in code_tasks("train", 2000, seed)]


def _real_code_pairs() -> list[tuple[str, str]]:
    from .realcode import real_code

    return [(d["prompt"], d["body"]) for d in real_code("train")]


def _style(style: str) -> Callable[[int, str], list[tuple]]:
    return lambda seed, contents: style_pairs(style, seed, contents)


def _multitask(skills: tuple[str, ...]) -> Callable[[int, str], list[tuple]]:
    """The union of the skills' experts' training pairs: what a user trains instead of composing them."""
    return lambda seed, contents: [pair for skill in skills for pair in SKILL_DATA[skill](seed, contents)]


# (seed, contents) -> pairs; `contents` (styles.CONTENTS) shapes only the style experts' answers
SKILL_DATA: dict[str, Callable[[int, str], list[tuple]]] = {"math": lambda seed, _: _math_pairs(seed), "code": lambda seed, _: _code_pairs(seed),
                                                        "realcode": lambda seed, _: _real_code_pairs(), **{s: _style(s) for s in STYLES}}
# the multitask reference of each two-skill family: one LoRA on the union of its two experts' data
MULTITASK = {**{f"mt_math_{s}": ("math", s) for s in STYLES}, "mt_shout_xml": ("shout", "xml"), "mt_title_polite": ("title", "polite")}
EXPERT_DATA = {**SKILL_DATA, **{name: _multitask(skills) for name, skills in MULTITASK.items()}}
# every expert, the multitask references too, is trained with one rank, step count, batch and seed policy
DEFAULT_STEPS = {name: 150 for name in EXPERT_DATA}
# the experts whose answers wrap content in a format (each such style and the multitask references holding one): `wrapped` applies to them
_FORMATS = {s for s, style in STYLES.items() if style.wraps}
WRAPPING = _FORMATS | {name for name, skills in MULTITASK.items() if _FORMATS & set(skills)}
# the experts whose data hold a style's requests: `contents` applies to them
STYLED = set(STYLES) | set(MULTITASK)
# the experts of a style that needs one contents (a list or steps: several sentences), and the multitask references holding one
NEEDS_CONTENTS = {n: c for n in STYLED for c in {STYLES[s].contents for s in MULTITASK.get(n, (n,)) if s in STYLES} - {None}}


@dataclass(frozen=True)
class SmolExpertConfig:
    steps: int = 150
    batch_size: int = 8
    lr: float = 1e-3
    rank: int = 8
    seed: int = 0
    wrapped: str = "base"  # a format's wrapped content: pulled toward the base ("base"; "first": but its first token scored) or trained like any answer ("scored")
    contents: str = "one"  # a style's answers: one sentence ("one") or one to three ("varied"; styles.style_requests)


def expert_pairs(name: str, seed: int, wrapped: str = "base", contents: str = "one") -> list[tuple]:
    """Expert `name`'s training pairs; with wrapped="scored" a format's content is no longer marked (make_batch
    scores it like any answer): for a base that does not answer the request by itself."""
    pairs = EXPERT_DATA[name](seed, contents)
    return [p[:2] for p in pairs] if wrapped == "scored" else pairs


def make_batch(tokenizer: PreTrainedTokenizerBase, pairs: list[tuple], rng: random.Random, size: int, score_first: bool = False):
    """(inputs (B, T), labels (B, T): the next token on answer and EOS positions, -100 elsewhere, mask (B, T),
    like_base (B, T) bool).

    A pair is (prompt, answer) or (prompt, answer, ((start, end), ...)): then the answer tokens that lie within
    characters start..end of a span (a format's wrapped content; a token across its edge is scored) are not scored
    but marked in `like_base`: there training pulls the expert toward the base's own next-token distribution,
    so that it wraps what the base (or another expert) writes, and does not close the format early. With
    `score_first` the first token of each span's content is scored like the format's: that the content starts right
    after the opening (not on a new line, where an instruction-tuned base may put most of its mass) is part of the format."""
    rows, labels, like_base = [], [], []
    for prompt, answer, *unscored in rng.sample(pairs, size):
        # the prompt as lm-eval encodes a context: with the tokenizer's own special tokens (Gemma's BOS; none for SmolLM2)
        p = tokenizer(prompt).input_ids
        encoded = tokenizer(answer, add_special_tokens=False, return_offsets_mapping=True)
        a = encoded.input_ids + [tokenizer.eos_token_id]
        inside = [False] * len(a)
        for lo, hi in unscored[0] if unscored else ():
            within = [lo <= s and e <= hi for s, e in encoded.offset_mapping] + [False]
            if score_first and True in within:
                within[within.index(True)] = False
            inside = [i or w for i, w in zip(inside, within)]
        rows.append(p + a)
        labels.append([-100] * (len(p) - 1) + [-100 if i else t for t, i in zip(a, inside)] + [-100])
        like_base.append([False] * (len(p) - 1) + inside + [False])
    inputs, targets, mask = pad_right(rows, labels, tokenizer.eos_token_id)
    keep = torch.tensor([k + [False] * (inputs.shape[1] - len(k)) for k in like_base])  # (B, T)
    return inputs, targets, mask, keep


def train_smol_expert(root: Path, name: str, config: SmolExpertConfig = SmolExpertConfig()) -> dict:
    """Train expert `name` (a key of EXPERT_DATA) on ROOT/base (any causal LM folder) into ROOT/experts/NAME, atomically."""
    if name not in EXPERT_DATA:
        raise ValueError(f"expert: expected one of {sorted(EXPERT_DATA)}, got {name!r}")
    root = Path(root).resolve()
    base = root / "base"
    tokenizer = AutoTokenizer.from_pretrained(base)
    pairs = expert_pairs(name, config.seed, config.wrapped, config.contents)
    torch.manual_seed(config.seed)
    lora = LoraConfig(r=config.rank, lora_alpha=2 * config.rank, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora)
    rng = random.Random(f"{config.seed}:{name}")
    start = time.perf_counter()
    first = config.wrapped == "first"
    loss = train_loop(model, lambda: make_batch(tokenizer, pairs, rng, config.batch_size, score_first=first), config.steps, config.lr, name)
    meta = {"expert": name, "config": asdict(config), "examples": len(pairs), "final_loss": round(loss, 4),
            "train_seconds": round(time.perf_counter() - start, 1), "threads": torch.get_num_threads()}
    with atomic_dir(root / "experts" / name) as tmp:
        save_adapter(model, "default", tmp, base=base)
        write_prompts(tmp / "prompts.jsonl", [p[0] for p in pairs], f"{config.seed}:{name}")
        (tmp / "train.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def train_smol_experts(root: Path, names: list[str], steps: int | None = None, seed: int = 0, force: bool = False,
                       wrapped: str = "base", contents: str = "one", lr: float = SmolExpertConfig.lr):
    """Train each named expert unless ROOT/experts/NAME already holds this configuration (or `force`).

    `wrapped` (WRAPPED) applies to the experts of WRAPPING (json, xml, polite and the multitask references holding one); the others are trained the same either way and keep "base" in their configuration.
    `contents` (styles.CONTENTS) applies to the experts of STYLED (every style and multitask reference) but those of
    NEEDS_CONTENTS (the list and steps styles': always "varied"); the others keep "one".

    Yields:
        (name, its train.json contents, whether an earlier training was reused).

    Raises:
        ValueError: an unknown expert name, `wrapped` or `contents` value (before anything is trained).
    """
    if unknown := [n for n in names if n not in DEFAULT_STEPS]:
        raise ValueError(f"--experts: expected names from {sorted(DEFAULT_STEPS)}, got {unknown}")
    if wrapped not in WRAPPED:
        raise ValueError(f"--wrapped: expected one of {WRAPPED}, got {wrapped!r}")
    if contents not in CONTENTS:
        raise ValueError(f"--contents: expected one of {CONTENTS}, got {contents!r}")
    for name in names:
        config = SmolExpertConfig(steps=steps or DEFAULT_STEPS[name], lr=lr, seed=seed, wrapped=wrapped if name in WRAPPING else "base",
                                  contents=NEEDS_CONTENTS.get(name, contents if name in STYLED else "one"))
        done = Path(root) / "experts" / name / "train.json"
        meta = json.loads(done.read_text()) if done.exists() and not force else None
        # a train.json written before `wrapped` or `contents` existed was trained as "base" on "one"
        if meta and {"wrapped": "base", "contents": "one", **meta["config"]} == asdict(config):
            if not (done.parent / "prompts.jsonl").exists():  # an expert trained before experts carried their prompts
                write_prompts(done.parent / "prompts.jsonl", [p[0] for p in expert_pairs(name, seed, contents=config.contents)], f"{seed}:{name}")
            yield name, meta, True
        else:
            yield name, train_smol_expert(Path(root), name, config), False

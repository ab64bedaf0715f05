"""Letter-substitution data of the toy world: rules, training batches, evaluation sets.

An example is `x>y` then EOS: x is a string over ALPHABET and y is x with the rules applied.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from ..common import write_jsonl
from .tokenizer import ALPHABET, SEPARATOR

RULES: dict[str, tuple[str, str]] = {"a2b": ("A", "B"), "c2d": ("C", "D"), "e2f": ("E", "F"),
                                     # the paper notebook's pair (the full-model GPT-2 world)
                                     "a2k": ("A", "K"), "m2b": ("M", "B")}
TRAIN_LENGTHS = (1, 16)
HELDOUT_LENGTHS = (17, 24)  # never trained on; kept for length-generalisation runs
# How a string is laid out before the separator: `copy` writes x as is (the answer's letter j is
# len(x) + 1 tokens after its source, a distance that grows with the length); `padded` fills x
# with PAD_CHAR up to PADDED_WIDTH, so that every answer letter is PADDED_WIDTH + 1 tokens after its
# source and EOS follows the first pad: a fixed local rule that does not depend on the length.
# Training on padded strings also places x at a random offset in the field (leading pads, copied
# into the answer too), so that every position and every answer step up to PADDED_WIDTH is trained
# and only the number of letters is new at lengths 17-32; the rule stays local: copy (or replace)
# the token 33 back, end after a letter when that token is a pad. (With x always at offset 0, or
# shifted by a random prefix, seed 0's padded base copied 100%, 64%, 6%, 0% of lengths 17-20,
# 21-24, 25-28, 29-32, stopping early at about 21 letters: it had learned the answer's length too.)
LAYOUTS = ("copy", "padded")
PAD_CHAR = "."
PADDED_WIDTH = 32


@dataclass(frozen=True)
class ToyTask:
    """One evaluation task: the rules it applies and the lengths of its strings."""

    name: str
    rules: tuple[str, ...]
    lengths: tuple[int, int] = TRAIN_LENGTHS
    layout: str = "copy"  # how the prompt is written (prompt_of)


EVAL_SIZE = 200
EVAL_SEED = 1234
TASKS = (
    ToyTask("identity", ()),
    ToyTask("a2b", ("a2b",)),
    ToyTask("c2d", ("c2d",)),
    ToyTask("e2f", ("e2f",)),
    ToyTask("a2b_c2d", ("a2b", "c2d")),
    ToyTask("a2b_c2d_e2f", ("a2b", "c2d", "e2f")),
    ToyTask("a2k", ("a2k",)),
    ToyTask("m2b", ("m2b",)),
    ToyTask("a2k_m2b", ("a2k", "m2b")),
    # the GPT-2 world's tasks: its learned absolute positions learn the padded layout's fixed offset
    # (loss 4e-4 after 800 steps) but not the copy layout's growing one (loss 0.2 after 1500 steps)
    ToyTask("identity_padded", (), layout="padded"),
    ToyTask("a2k_padded", ("a2k",), layout="padded"),
    ToyTask("m2b_padded", ("m2b",), layout="padded"),
    ToyTask("a2k_m2b_padded", ("a2k", "m2b"), layout="padded"),
    ToyTask("identity_long", (), HELDOUT_LENGTHS),
    ToyTask("a2b_c2d_long", ("a2b", "c2d"), HELDOUT_LENGTHS),
)


def apply_rules(x: str, rules: tuple[str, ...] | list[str]) -> str:
    """Apply letter rules simultaneously (no rule's output is another rule's input here)."""
    table = {RULES[r][0]: RULES[r][1] for r in rules}
    return "".join(table.get(ch, ch) for ch in x)


def sample_string(rng: random.Random, length: int, must_contain: str = "") -> str:
    """A uniform random string over ALPHABET of `length` holding every letter of `must_contain`.

    Raises:
        ValueError: if `length` is shorter than `must_contain`.
    """
    if length < len(must_contain):
        raise ValueError(f"length {length} cannot hold the letters {must_contain!r}")
    chars = [rng.choice(ALPHABET) for _ in range(length)]
    for pos, ch in zip(rng.sample(range(length), len(must_contain)), must_contain):
        chars[pos] = ch
    return "".join(chars)


def make_eval_set(task: ToyTask, size: int = EVAL_SIZE, seed: int = EVAL_SEED) -> list[dict]:
    """Seeded evaluation examples; every string holds at least one letter of each rule."""
    rng = random.Random(f"{seed}:{task.name}")
    must = "".join(RULES[r][0] for r in task.rules)
    lo = max(task.lengths[0], len(must))
    docs = []
    for _ in range(size):
        x = sample_string(rng, rng.randint(lo, task.lengths[1]), must)
        docs.append({"input": x, "target": apply_rules(x, task.rules), "rules": list(task.rules)})
    return docs


VALIDATION_SIZE = 100
VALIDATION_SEED = 4321  # also the build's held-out check (build.VALIDATION_SEED)


def make_validation_set(task: ToyTask, size: int = VALIDATION_SIZE) -> list[dict]:
    """Seeded validation examples for choosing hyper-parameters: drawn like the test set with another
    seed, leaving out every string of the test set (short strings recur between two seeds)."""
    test = {d["input"] for d in make_eval_set(task)}
    docs = [d for d in make_eval_set(task, 4 * size, VALIDATION_SEED) if d["input"] not in test][:size]
    if len(docs) < size:
        raise ValueError(f"{task.name}: only {len(docs)} validation strings outside the test set")
    return docs


def sample_training_pair(
    rng: random.Random, rules: tuple[str, ...], p_contains: float = 0.5
) -> tuple[str, str]:
    """One training example (x, y) with length in TRAIN_LENGTHS.

    With probability `p_contains` the string is forced to hold the rules' input letters, so
    that an expert sees its letter often while still copying every other letter.
    """
    must = "".join(RULES[r][0] for r in rules) if rng.random() < p_contains else ""
    length = rng.randint(max(TRAIN_LENGTHS[0], len(must)), TRAIN_LENGTHS[1])
    x = sample_string(rng, length, must)
    return x, apply_rules(x, rules)


def prompt_of(x: str, layout: str = "copy", offset: int = 0) -> str:
    """The text a model is prompted with in `layout`; the answer follows it, then EOS. `offset`: leading
    pads of a padded field (training only; the answer then starts with as many pads)."""
    if layout == "copy":
        return x + SEPARATOR
    if offset + len(x) > PADDED_WIDTH:
        raise ValueError(f"padded layout holds strings of at most {PADDED_WIDTH} letters, got {offset} + {len(x)}")
    return PAD_CHAR * offset + x + PAD_CHAR * (PADDED_WIDTH - offset - len(x)) + SEPARATOR


# prompt_of as lm-eval's Jinja templates
PROMPT_TEMPLATES = {"copy": "{{input}}" + SEPARATOR,
                    "padded": f"{{{{input}}}}{{{{'{PAD_CHAR}' * ({PADDED_WIDTH} - input|length)}}}}{SEPARATOR}"}
TASK_YAML = """\
# Generated by merging.worlds.toy.data.write_task_files; do not edit by hand.
task: toy_{name}
tag: toy_letters
custom_dataset: !function utils.load_jsonl
dataset_kwargs:
  data_file: {name}.jsonl
output_type: generate_until
test_split: test
doc_to_text: "{prompt}"
doc_to_target: "{{{{target}}}}"
target_delimiter: ""
generation_kwargs:
  until: ["<eos>"]
  do_sample: false
  max_gen_toks: {max_gen}
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


VALIDATION_YAML = """\
# Generated by merging.worlds.toy.data.write_task_files; do not edit by hand.
# Validation split of toy_{name} (no string of its test set): hyper-parameters are chosen here, never on test.
include: toy_{name}.yaml
task: toy_{name}_val
tag: toy_letters_val
dataset_kwargs:
  data_file: {name}_val.jsonl
"""


def write_task_files(out_dir: Path) -> list[Path]:
    """Write every task's jsonl and lm-eval YAML into `out_dir` (deterministic), and a validation
    split `toy_NAME_val` of every task of the training lengths.

    Returns:
        The paths written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for task in TASKS:
        data = out_dir / f"{task.name}.jsonl"
        write_jsonl(data, make_eval_set(task))
        yaml = out_dir / f"toy_{task.name}.yaml"
        yaml.write_text(TASK_YAML.format(name=task.name, prompt=PROMPT_TEMPLATES[task.layout], max_gen=task.lengths[1] + 4))
        written += [data, yaml]
        if task.lengths == TRAIN_LENGTHS:
            write_jsonl(out_dir / f"{task.name}_val.jsonl", make_validation_set(task))
            (out_dir / f"toy_{task.name}_val.yaml").write_text(VALIDATION_YAML.format(name=task.name))
            written += [out_dir / f"{task.name}_val.jsonl", out_dir / f"toy_{task.name}_val.yaml"]
    return written

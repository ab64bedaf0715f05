"""Seeded data of the SmolLM2 world: arithmetic word problems, small Python functions, prose.

Train and test never share a problem: math test problems use other templates (other wording,
other objects) than training; code test tasks use the same function families with constants
and letters from disjoint ranges (train K in 2..9 and letters a..m, test K in 11..19 and n..z),
and three families appear in training only. The held-out phrasing families (`heldout`: MATH_HELDOUT and the code
families of that split) are templates no training, test or validation document uses (for math: the question first,
comparisons, prices, other names; for code: docstrings that do not start with "Return", two arguments): they
measure the skill apart from the generator's wording. Validation splits (`*_val`) are drawn like the test
sets with another seed and share no problem or function with them. `math_shout` asks the test
problems for an answer in capital letters: two skills at once, as the toy world's pair task. Prose for perplexity is the standard library's own
module and class docstrings, which no expert is trained on (the style expert uses function
docstrings).
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..common import write_jsonl
from .realcode import real_code

ANSWER_MARKER = "####"
NAMES = ["Ava", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena"]


# ---- math ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MathTemplate:
    text: str  # format fields: n (a name), a, b, c
    steps: tuple[str, ...]  # each "x op y", x/y being a, b, c or r (the previous result)
    ranges: tuple[tuple[int, int], ...]  # for a, b, c
    unit: str  # the objects counted: every worked step names them ("3 * 4 = 12 desks."), so answers hold letters


MATH_TRAIN = [
    MathTemplate("{n} has {a} apples and buys {b} more. How many apples does {n} have now?", ("a + b",), ((2, 60), (2, 40)), "apples"),
    MathTemplate("{n} had {a} stickers and gave {b} to a friend. How many stickers are left?", ("a - b",), ((30, 90), (2, 29)), "stickers"),
    MathTemplate("{n} packs {a} boxes with {b} pencils in each box. How many pencils is that?", ("a * b",), ((2, 12), (2, 12)), "pencils"),
    MathTemplate("A shelf holds {a} books. {n} adds {b} books and removes {c}. How many books are on the shelf?",
                 ("a + b", "r - c"), ((10, 50), (2, 30), (2, 9)), "books"),
    MathTemplate("{n} buys {a} bags of {b} marbles and then finds {c} more marbles. How many marbles does {n} have?",
                 ("a * b", "r + c"), ((2, 9), (2, 9), (2, 30)), "marbles"),
    MathTemplate("{n} bakes {a} trays of {b} cookies and eats {c} of them. How many cookies are left?",
                 ("a * b", "r - c"), ((2, 9), (3, 12), (1, 5)), "cookies"),
]
MATH_TEST = [
    MathTemplate("A train carries {a} passengers. At the station {b} more get on. How many passengers are on the train?", ("a + b",), ((20, 99), (5, 60)), "passengers"),
    MathTemplate("A farm has {a} sheep. The farmer sells {b} of them. How many sheep remain?", ("a - b",), ((40, 99), (3, 39)), "sheep"),
    MathTemplate("Each of {a} classrooms has {b} desks. How many desks are there in total?", ("a * b",), ((3, 12), (3, 12)), "desks"),
    MathTemplate("{n} saves {a} coins a week for {b} weeks and then spends {c} coins. How many coins does {n} keep?",
                 ("a * b", "r - c"), ((2, 9), (2, 9), (2, 4)), "coins"),
    MathTemplate("A garden has {a} rows of {b} tulips, and {c} roses grow beside them. How many flowers are in the garden?",
                 ("a * b", "r + c"), ((2, 9), (2, 9), (2, 30)), "flowers"),
]

# phrased unlike MATH_TRAIN and MATH_TEST: the question first, comparisons, rates and prices, other names
MATH_HELDOUT = [
    MathTemplate("How many pens does {n} own after starting with {a} pens and getting {b} as a gift?", ("a + b",), ((10, 80), (3, 40)), "pens"),
    MathTemplate("{n}'s bus left the depot with {a} seats free; {b} riders took a seat at the first stop. What number of seats is still free?",
                 ("a - b",), ((25, 70), (2, 24)), "seats"),
    MathTemplate("Tickets cost {a} dollars each and {n} buys {b} of them. What does {n} pay altogether?", ("a * b",), ((3, 15), (2, 9)), "dollars"),
    MathTemplate("{n} is {a} years old. {n}'s aunt is {b} years older. What is the aunt's age?", ("a + b",), ((6, 40), (18, 35)), "years"),
    MathTemplate("A baker fills {a} crates with {b} loaves apiece, but {c} loaves are burnt and thrown away. What is the count of good loaves?",
                 ("a * b", "r - c"), ((2, 8), (4, 12), (1, 6)), "loaves"),
    MathTemplate("There are {a} blue kites and {b} red ones in a shop; then {c} more red kites arrive. Find the total number of kites.",
                 ("a + b", "r + c"), ((5, 40), (5, 40), (2, 20)), "kites"),
    MathTemplate("{n} reads {a} pages every evening for {b} evenings. What total of pages has {n} read?", ("a * b",), ((5, 30), (2, 9)), "pages"),
    MathTemplate("{n} walks {a} meters to school, which is {b} meters less than the walk of a friend. How far does the friend walk?",
                 ("a + b",), ((200, 900), (50, 300)), "meters"),
]
HELDOUT_NAMES = ["Marta", "Noor", "Oskar", "Priya", "Quinn", "Rosa", "Sami", "Tomas"]


def _solve(template: MathTemplate, values: dict[str, int]) -> tuple[str, int]:
    """The worked answer ("3 * 4 = 12 cookies. 12 - 2 = 10 cookies. #### 10") and the final number."""
    env, parts = dict(values), []
    for step in template.steps:
        x, op, y = step.split()
        result = {"+": env[x] + env[y], "-": env[x] - env[y], "*": env[x] * env[y]}[op]
        parts.append(f"{env[x]} {op} {env[y]} = {result} {template.unit}.")
        env["r"] = result
    return " ".join(parts) + f" {ANSWER_MARKER} {env['r']}", env["r"]


def math_problems(split: str, size: int, seed: int = 0) -> list[dict]:
    """Word problems: {"question", "answer" (worked, ends with '#### N'), "number"}. `val` draws from the
    test templates with another seed and skips every question of the test set; `heldout` from MATH_HELDOUT."""
    templates = {"train": MATH_TRAIN, "heldout": MATH_HELDOUT}.get(split, MATH_TEST)
    names = HELDOUT_NAMES if split == "heldout" else NAMES
    taken = {d["question"] for d in math_problems("test", TASK_SIZES["math"], seed)} if split == "val" else set()
    rng = random.Random(f"{seed}:math:{split}")
    docs = []
    while len(docs) < size:
        template = templates[len(docs) % len(templates)]
        values = {k: rng.randint(lo, hi) for k, (lo, hi) in zip("abc", template.ranges)}
        answer, number = _solve(template, values)
        question = template.text.format(n=rng.choice(names), **values)
        if question not in taken:
            docs.append({"question": question, "answer": answer, "number": str(number)})
    return docs


def math_shout_problems(split: str, size: int, seed: int = 0) -> list[dict]:
    """The same problems asked for in capital letters: {"question", "answer" (upper case), "number"}."""
    return [{**d, "answer": d["answer"].upper()} for d in math_problems(split, size, seed)]


def math_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"


SHOUT_INSTRUCTION = "Repeat in capital letters: "  # the style expert's training prompt (smol/train.py)
MATH_SHOUT_INSTRUCTION = "Answer in capital letters: "


# ---- code ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeFamily:
    name: str  # function name, may use {k} / {c}
    args: str
    doc: str  # one-line description, may use {k} / {c}
    body: str  # the reference expression, may use {k} / {c}
    inputs: Callable[[random.Random], list[tuple]]  # argument tuples for the hidden tests
    splits: tuple[str, ...] = ("train", "test")


def _ints(rng):
    return [(rng.randint(-20, 60),) for _ in range(4)]


def _lists(rng):
    return [([rng.randint(-9, 30) for _ in range(rng.randint(0, 7))],) for _ in range(4)]


def _word(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(0, 9)))


def _words(rng):
    return [(_word(rng),) for _ in range(4)]


def _int_pairs(rng):
    return [(rng.randint(-20, 60), rng.randint(-20, 60)) for _ in range(4)]


def _sentences(rng):
    return [(" ".join(_word(rng) for _ in range(rng.randint(0, 5))),) for _ in range(4)]


CODE_FAMILIES = [
    CodeFamily("add_{k}", "x", "Return x plus {k}.", "x + {k}", _ints),
    CodeFamily("times_{k}", "x", "Return x multiplied by {k}.", "x * {k}", _ints),
    CodeFamily("divisible_by_{k}", "x", "Return True if x is divisible by {k}, else False.", "x % {k} == 0", _ints),
    CodeFamily("square_plus_{k}", "x", "Return x squared plus {k}.", "x * x + {k}", _ints),
    CodeFamily("repeat_{k}", "s", "Return the string s repeated {k} times.", "s * {k}", _words),
    CodeFamily("count_{c}", "s", "Return how many times the letter '{c}' occurs in s.", "s.count('{c}')", _words),
    CodeFamily("strip_{c}", "s", "Return s with every letter '{c}' removed.", "s.replace('{c}', '')", _words),
    CodeFamily("sum_above_{k}", "xs", "Return the sum of the numbers in xs that are greater than {k}.", "sum(v for v in xs if v > {k})", _lists),
    CodeFamily("scale_{k}", "xs", "Return a list of the numbers in xs, each multiplied by {k}.", "[v * {k} for v in xs]", _lists),
    CodeFamily("first_{k}", "xs", "Return the first {k} items of the list xs.", "xs[:{k}]", _lists),
    CodeFamily("reverse", "s", "Return the string s reversed.", "s[::-1]", _words, splits=("train",)),
    CodeFamily("largest", "xs", "Return the largest number in xs, or None if xs is empty.", "max(xs) if xs else None", _lists, splits=("train",)),
    CodeFamily("count_even", "xs", "Return how many numbers in xs are even.", "sum(1 for v in xs if v % 2 == 0)", _lists, splits=("train",)),
    # families no expert is trained on: transfer of the format to new functions
    CodeFamily("minus_{k}", "x", "Return x minus {k}.", "x - {k}", _ints, splits=("test",)),
    CodeFamily("floor_div_{k}", "x", "Return x divided by {k}, rounded down.", "x // {k}", _ints, splits=("test",)),
    CodeFamily("has_{c}", "s", "Return True if the letter '{c}' occurs in s, else False.", "'{c}' in s", _words, splits=("test",)),
    CodeFamily("append_{c}", "s", "Return s followed by the letter '{c}'.", "s + '{c}'", _words, splits=("test",)),
    CodeFamily("last_{k}", "xs", "Return the last {k} items of the list xs.", "xs[-{k}:]", _lists, splits=("test",)),
    CodeFamily("count_below_{k}", "xs", "Return how many numbers in xs are smaller than {k}.", "sum(1 for v in xs if v < {k})", _lists, splits=("test",)),
    # the held-out phrasing families: docstrings that do not start with "Return", two arguments, names without a constant
    CodeFamily("product_of", "a, b", "Multiply a by b and give back the result.", "a * b", _int_pairs, splits=("heldout",)),
    CodeFamily("larger_of", "a, b", "Given two integers, hand back whichever is bigger.", "max(a, b)", _int_pairs, splits=("heldout",)),
    CodeFamily("clamp_{k}", "x", "Limit x so that it is never above {k}.", "min(x, {k})", _ints, splits=("heldout",)),
    CodeFamily("distance_from_zero", "x", "Compute how far x lies from zero.", "abs(x)", _ints, splits=("heldout",)),
    CodeFamily("is_palindrome", "s", "Check whether the text s reads the same forwards and backwards.", "s == s[::-1]", _words, splits=("heldout",)),
    CodeFamily("starts_with_{c}", "s", "Tell whether s begins with the letter '{c}'.", "s.startswith('{c}')", _words, splits=("heldout",)),
    CodeFamily("word_count", "s", "Count the space-separated words in the sentence s.", "len(s.split())", _sentences, splits=("heldout",)),
    CodeFamily("doubled", "xs", "Build a new list in which every element of xs is twice as big.", "[v * 2 for v in xs]", _lists, splits=("heldout",)),
    CodeFamily("only_even", "xs", "Keep the even numbers of xs, in their order.", "[v for v in xs if v % 2 == 0]", _lists, splits=("heldout",)),
    CodeFamily("ends_with_{c}", "s", "Tell whether the text s finishes with the letter '{c}'.", "s.endswith('{c}')", _words, splits=("heldout",)),
    CodeFamily("shift_by_{k}", "xs", "Produce xs with {k} added to each of its numbers.", "[v + {k} for v in xs]", _lists, splits=("heldout",)),
    CodeFamily("total_minus_{k}", "xs", "Add up xs and subtract {k} from the sum.", "sum(xs) - {k}", _lists, splits=("heldout",)),
]
CODE_RANGES = {"train": (range(2, 10), "abcdefghijklm"), "test": (range(11, 20), "nopqrstuvwxyz")}
CODE_RANGES["heldout"] = CODE_RANGES["test"]  # the held-out families take the test split's constants and letters


def code_prompt(name: str, args: str, doc: str) -> str:
    return f'def {name}({args}):\n    """{doc}"""\n'


def code_tasks(split: str, size: int, seed: int = 0) -> list[dict]:
    """Function tasks: {"name", "prompt", "solution" (the body), "tests" (assert lines)}. `val` draws
    from the test families and ranges with another seed and skips every function of the test set; `heldout` from the
    held-out phrasing families, each function once."""
    family_split = "test" if split == "val" else split
    ks, letters = CODE_RANGES[family_split]
    families = [f for f in CODE_FAMILIES if family_split in f.splits]
    taken = {d["name"] for d in code_tasks("test", TASK_SIZES["code"], seed)} if split == "val" else set()
    rng = random.Random(f"{seed}:code:{split}")
    docs, i = [], 0
    while len(docs) < size:
        family = families[i % len(families)]
        i += 1
        fill = {"k": rng.choice(ks), "c": rng.choice(letters)}
        name, doc, body = (t.format(**fill) for t in (family.name, family.doc, family.body))
        reference = eval(f"lambda {family.args}: {body}")  # our own template, not model output
        tests = [f"assert {name}{args!r} == {reference(*args)!r}".replace(",)", ")") for args in family.inputs(rng)]
        if name not in taken and name not in {d["name"] for d in docs if split in ("val", "heldout")}:
            docs.append({"name": name, "prompt": code_prompt(name, family.args, doc), "solution": f"    return {body}\n", "tests": tests})
    return docs


# ---- prose --------------------------------------------------------------------------------
TEXT_MODULES = [
    "argparse", "asyncio", "bisect", "calendar", "collections", "contextlib", "copy", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "enum", "fractions", "functools", "glob", "gzip", "heapq", "hmac",
    "inspect", "itertools", "json", "logging", "pathlib", "pickle", "pprint", "queue", "random", "re",
    "secrets", "shutil", "socket", "statistics", "string", "subprocess", "tempfile", "textwrap", "threading",
    "timeit", "traceback", "typing", "unittest", "uuid", "warnings", "weakref", "zipfile",
]
_PROSE = re.compile(r"^[A-Z][^\n]*[.]$", re.S)


def _paragraphs(doc: str | None, min_words: int) -> list[str]:
    """Paragraphs of plain prose (no code, no indented blocks, no doctest) with enough words."""
    out = []
    for para in (doc or "").split("\n\n"):
        lines = para.strip().splitlines()
        if not lines or any(ln.startswith((" ", "\t")) or ">>>" in ln or "::" in ln for ln in lines):
            continue
        text = " ".join(ln.strip() for ln in lines)
        if _PROSE.match(text) and len(text.split()) >= min_words and not re.search(r"[{}\[\]=_`]", text):
            out.append(text)
    return out


def prose(kind: str, size: int) -> list[str]:
    """`module` paragraphs of module and class docstrings (perplexity text), or first sentences of
    `function` docstrings (style-expert inputs)."""
    found = []
    for name in TEXT_MODULES:
        module = importlib.import_module(name)
        if kind == "module":
            found += _paragraphs(inspect.getdoc(module), min_words=20)
        for _, obj in sorted(vars(module).items()):
            if getattr(obj, "__module__", None) != name:
                continue
            if kind == "module" and inspect.isclass(obj):
                doc = vars(obj).get("__doc__")  # its own docstring, not one inherited
                found += _paragraphs(inspect.cleandoc(doc) if isinstance(doc, str) else None, min_words=20)
            elif kind == "function" and inspect.isfunction(obj):
                found += [p.split(". ")[0].rstrip(".") + "." for p in _paragraphs(inspect.getdoc(obj), min_words=8)]
    unique = sorted(set(found))
    return unique[:size] if kind == "module" else random.Random(f"prose:{kind}").sample(unique, min(size, len(unique)))


def shout_sentences(split: str, size: int) -> list[dict]:
    """{"sentence", "answer" (upper case)} for the style skill alone: first sentences of the module and
    class docstring paragraphs (the style expert trained on function docstrings), `val` and `test` disjoint."""
    found = sorted({p.split(". ")[0].rstrip(".") + "." for p in prose("module", 10**6)})
    found = [x for x in found if 6 <= len(x.split()) <= 24]
    random.Random("prose:shout").shuffle(found)
    chosen = found[:VAL_SIZES["shout"]] if split == "val" else found[VAL_SIZES["shout"]:VAL_SIZES["shout"] + size]
    return [{"sentence": x, "answer": x.upper()} for x in chosen[:size]]


def list_sentences(split: str, size: int) -> list[dict]:
    """{"text": two sentences, "answer": them as a Markdown list} for the list style alone: each sentence of
    shout_sentences(split, size) with the next (the last with the first), so every sentence is asked twice."""
    found = [d["sentence"] for d in shout_sentences(split, size)]
    return [{"text": f"{a} {b}", "answer": f"- {a}\n- {b}"} for a, b in zip(found, found[1:] + found[:1])]


TASK_SIZES = {"math": 100, "code": 64, "text": 60, "shout": 40}
VAL_SIZES = {"math": 50, "code": 24, "shout": 20}  # validation splits: hyper-parameters are chosen there, never on test
HELDOUT_SIZES = {"math": 64, "code": 40}  # the held-out phrasing families


def task_data(seed: int = 0) -> dict[str, list[dict]]:
    """The test and validation sets of the lm-eval tasks, keyed by jsonl name."""
    return {
        "math": math_problems("test", TASK_SIZES["math"], seed),
        "code": code_tasks("test", TASK_SIZES["code"], seed),
        "text": [{"text": t} for t in prose("module", TASK_SIZES["text"])],
        "math_shout": math_shout_problems("test", TASK_SIZES["math"], seed),
        "shout": shout_sentences("test", TASK_SIZES["shout"]),
        "list": list_sentences("test", TASK_SIZES["shout"]),
        "math_val": math_problems("val", VAL_SIZES["math"], seed),
        "code_val": code_tasks("val", VAL_SIZES["code"], seed),
        "math_shout_val": math_shout_problems("val", VAL_SIZES["math"], seed),
        "shout_val": shout_sentences("val", VAL_SIZES["shout"]),
        "list_val": list_sentences("val", VAL_SIZES["shout"]),
        "math_heldout": math_problems("heldout", HELDOUT_SIZES["math"], seed),
        "code_heldout": code_tasks("heldout", HELDOUT_SIZES["code"], seed),
        "realcode_val": [{k: f[k] for k in ("module", "name", "prompt", "body")} for f in real_code("val")],
    }


def write_task_files(out_dir: Path) -> list[Path]:
    """Write the jsonl files the smol_* task YAMLs read (deterministic)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, docs in task_data().items():
        path = out_dir / f"{name}.jsonl"
        write_jsonl(path, docs)
        written.append(path)
    return written

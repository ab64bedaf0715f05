"""Style and format skills of the SmolLM2 and Gemma worlds: answers in capital letters (`shout`), as a
JSON object (`json`), between XML tags (`xml`), between a polite opening and sign-off (`polite`:
"Sure! ... Hope this helps!", a format of words rather than markup), as a Markdown list of its sentences
(`list`: "- ...\n- ...", a format between the content's sentences rather than around it), told step by step
(`steps`: "First, ... Then, ...", words between the sentences) and in title case (`title`: every word's first letter
upper case, a style of the content's own tokens like capitals, whose capitalised words are common tokens).

A style expert must change *how* an answer is written, not *what* it says, so that composed with a
skill expert (math) the two act on different tokens: the style expert moves letters to upper case or
wraps the answer, the math expert picks the numbers. Its training requests are therefore about
content no other skill touches, in three forms so that no single one (copying) dominates: repeat a
sentence, say what a standard-library function does, continue a sentence. Sentences are first
sentences of function docstrings (the tests use module and class docstrings). No request holds a
number to compute, so a style expert alone cannot solve a word problem.

A format (json, xml) is learned on its own tokens; on the wrapped content the expert is trained toward
the base's own next-token distribution (merging.worlds.smol.train.make_batch), so it learns where the
format opens and closes and stays the base on what it wraps. A base that does not answer the request by
itself (Gemma 3 270M, not instruction-tuned) leaves nothing to wrap: there the content is trained like any
answer (`wrapped="scored"`, merging.worlds.smol.WRAPPED).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from . import CONTENTS
from .data import TEXT_MODULES, _paragraphs


SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
TITLE_WORD = re.compile(r"(^|\s)([^\w\s]*)([^\W\d_])")  # a word's first letter, after any quotes or brackets


def sentences(text: str) -> list[str]:
    """The sentences of `text`: split after `.`, `!` or `?` and the spaces that follow (one piece without any)."""
    return [s for s in SENTENCE_END.split(text.strip()) if s]


def as_list(answer: str) -> str:
    """`answer` as a Markdown list, one item per sentence ("A. B." -> "- A.\n- B.")."""
    return "\n".join(f"- {s}" for s in sentences(answer))


def as_steps(answer: str) -> str:
    """`answer` told step by step, its sentences joined by connectives ("A. B. C." -> "First, A. Then, B. Then, C.")."""
    return " ".join(f"{'Then' if i else 'First'}, {s}" for i, s in enumerate(sentences(answer)))


def as_title(answer: str) -> str:
    """`answer` in title case: the first letter of every word upper case, the rest as it was ("the 'module' argument"
    -> "The 'Module' Argument"); a word that opens with a digit or an underscore is left as it is."""
    return TITLE_WORD.sub(lambda m: m[1] + m[2] + m[3].upper(), answer)


@dataclass(frozen=True)
class Style:
    instruction: str  # put before the request in the prompt
    render: Callable[[str], str]  # the plain answer, written in this style
    wraps: bool = False  # a format around the content: the content's tokens are not scored in training
    items: bool = False  # the format goes between the content's sentences (a list, steps): each sentence is wrapped content
    contents: str | None = None  # the contents (CONTENTS) its expert is always trained on: a list needs answers of several sentences


STYLES = {
    "shout": Style("Answer in capital letters: ", str.upper),
    "title": Style("Answer in title case: ", as_title),
    "json": Style("Answer in JSON: ", lambda answer: json.dumps({"answer": answer}), wraps=True),
    "xml": Style("Answer in XML: ", lambda answer: f"<answer>{answer}</answer>", wraps=True),
    "polite": Style("Answer politely: ", lambda answer: f"Sure! {answer} Hope this helps!", wraps=True),
    "list": Style("Answer as a list: ", as_list, wraps=True, items=True, contents="varied"),
    "steps": Style("Answer step by step: ", as_steps, wraps=True, items=True, contents="varied"),
}


def style_prompt(style: str | tuple[str, ...], request: str) -> str:
    """The prompt asking for `request` in `style`; several styles at once: their instructions in order
    (("xml", "shout"): "Answer in XML: Answer in capital letters: ", the prompt of smol_shout_xml)."""
    styles = (style,) if isinstance(style, str) else style
    return f"Question: {''.join(STYLES[s].instruction for s in styles)}{request}\nAnswer:"


def render(styles: tuple[str, ...], answer: str) -> str:
    """The plain `answer` written in each of `styles`, the first outermost (("xml", "shout"): <answer>ANSWER</answer>)."""
    for style in reversed(styles):
        answer = STYLES[style].render(answer)
    return answer


def function_sentences() -> list[tuple[str, str]]:
    """(module.function, a sentence of its docstring): the first sentence of each prose paragraph of 8 words
    or more in the docstrings of the standard-library functions of TEXT_MODULES, sorted."""
    found = set()
    for name in TEXT_MODULES:
        module = importlib.import_module(name)
        for attr, obj in sorted(vars(module).items()):
            if getattr(obj, "__module__", None) == name and inspect.isfunction(obj) and not attr.startswith("_"):
                found |= {(f"{name}.{attr}", p.split(". ")[0].rstrip(".") + ".") for p in _paragraphs(inspect.getdoc(obj), min_words=8)}
    return sorted(found)


def style_requests(seed: int = 0, contents: str = "one") -> list[tuple[str, str]]:
    """(request, plain answer): each function sentence once, as one of three requests chosen by a seeded draw.

    contents="varied" (CONTENTS): half of the requests, by a second seeded draw, take one or two more sentences of other
    functions (repeat these sentences; what do these functions do; continue a text that goes on past the sentence), so
    that the answer does not always end at its first period: a style expert then does not learn that a sign-off or a
    closing tag comes after one sentence, where another expert's answer may have several."""
    if contents not in CONTENTS:
        raise ValueError(f"contents: expected one of {CONTENTS}, got {contents!r}")
    rng, more = random.Random(f"{seed}:style"), random.Random(f"{seed}:contents")
    found = function_sentences()
    requests = []
    for qualified, sentence in found:
        words = sentence.split()
        form = rng.randrange(3)
        extra = more.sample(found, more.randint(1, 2)) if contents == "varied" and more.random() < 0.5 else []
        names = " and ".join([qualified, *(q for q, _ in extra)])
        answer = " ".join([sentence, *(s for _, s in extra)])
        if form == 0:
            requests.append((f"Repeat {'these sentences' if extra else 'this sentence'}: {answer}", answer))
        elif form == 1:
            requests.append((f"What {'do the Python functions' if extra else 'does the Python function'} {names} do?", answer))
        else:
            cut = max(2, len(words) // 2)
            requests.append((f"Continue this {'text' if extra else 'sentence'}: {' '.join(words[:cut])}", " ".join(answer.split()[cut:])))
    return requests


def content_spans(style: str, plain: str, rendered: str) -> tuple[tuple[int, int], ...]:
    """The (start, end) characters of the content that `style` wraps in `rendered` (made from `plain`): the text
    between the format's opening and closing (what `rendered` does not share with the format around nothing), or for a
    format between sentences (a list, steps) each sentence of `plain`, with the space before it."""
    if STYLES[style].items:
        spans, at = [], 0
        for sentence in sentences(plain):
            start = rendered.index(sentence, at)
            spans.append((start - 1, start + len(sentence)))  # the space before the sentence goes with its first word
            at = start + len(sentence)
        return tuple(spans)
    empty = STYLES[style].render("")  # the format around nothing: what a rendered answer shares with it is the format
    start = len(os.path.commonprefix([empty, rendered]))
    end = max(start, len(rendered) - len(os.path.commonprefix([empty[::-1], rendered[::-1]])))
    return ((start, end),)


def style_pairs(style: str, seed: int = 0, contents: str = "one") -> list[tuple]:
    """Training pairs (prompt, answer with its leading space) of style expert `style`; a format's pairs
    also hold the (start, end) characters of each piece of wrapped content, which training does not score."""
    pairs = []
    for request, plain in style_requests(seed, contents):
        rendered = STYLES[style].render(plain)
        if STYLES[style].wraps:
            spans = tuple((1 + start, 1 + end) for start, end in content_spans(style, plain, rendered))  # + 1: the leading space
            pairs.append((style_prompt(style, request), " " + rendered, spans))
        else:
            pairs.append((style_prompt(style, request), " " + rendered))
    return pairs

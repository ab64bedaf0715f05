"""Makes `lm_eval --model logitcomp` work with an lm-eval that reads no entry points.

lm-eval 0.4.13 fills its model registry by importing `lm_eval.models` and has no plugin
mechanism, so an installed package cannot add a model name to the plain `lm_eval` command.
The `logitcomp-lm-eval.pth` file that installs with this package imports this module at
interpreter start-up; it only adds an import hook (nothing of lm-eval or torch is imported).
When `lm_eval.models` is first imported, the hook registers `logitcomp` as a lazy
placeholder for `merging.harness.model:LogitcompLM`; lm-eval imports the class only when the
name is used. lm-eval versions that read the `lm_eval.models` entry points find the same
placeholder there; registering an equal placeholder twice is a no-op in lm-eval's registry.
"""

from __future__ import annotations

from logitcomp.hooks import after_import

MODEL_NAME = "logitcomp"
TARGET = "merging.harness.model:LogitcompLM"


def register() -> None:
    from lm_eval.api.registry import model_registry

    model_registry.register(MODEL_NAME, target=TARGET)


def install() -> None:
    after_import("lm_eval.models", register)

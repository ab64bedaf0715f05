"""The `logitcomp` lm-eval model (`LogitcompLM`) and `InMemoryHFLM`, the model every plain row is scored by.

The composed model is an lm-eval model of its own: loglikelihood, loglikelihood_rolling and
generate_until all run through the composition (lm-eval's HFLM does the batching, and stops
generation on the task's `until` strings while generating, with its stopping criteria).

model_args (lm-eval splits them on commas, so lists use `|` and `name:value`):
    pretrained=DIR                                  a folder written by ComposedModelForCausalLM.save_pretrained
    base=DIR,experts=a2b:DIR1|c2d:DIR2              or a base and experts inline
    weights=a2b:1.0|c2d:0.5                         optional weights (default 1.0 each)
    eos_policy=any,floor=-1e4                       any CompositionConfig option
    rule=activity,rule_params=gamma:2               a composition rule and its parameters
    allow_pickle=true,trust_remote_code=true        opt-ins
plus every HFLM argument (batch_size, max_length, ...).

Under `torchrun --nproc_per_node N -m lm_eval --model logitcomp ...` (or `accelerate launch`), the
N processes split the requests and lm-eval gathers the results on rank 0 (`distributed.py`);
`device=cuda` then means each process's own GPU.
"""

from __future__ import annotations

import inspect

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from transformers import AutoTokenizer

from logitcomp import ComposedModelForCausalLM, CompositionConfig

from .distributed import DataParallel, local_device

def parse_pairs(field: str, text: str) -> dict[str, str]:
    """`a:x|b:y` -> {"a": "x", "b": "y"}. Raises ValueError naming `field` on bad syntax or duplicates."""
    pairs = {}
    for item in str(text).split("|"):
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{field}: expected name:value items joined by '|', got {text!r}")
        if name.strip() in pairs:
            raise ValueError(f"{field}: duplicate name {name.strip()!r}")
        pairs[name.strip()] = value.strip()
    return pairs


def _flag(field: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() not in ("1", "true", "yes", "0", "false", "no"):
        raise ValueError(f"{field}: expected true or false, got {value!r}")
    return str(value).lower() in ("1", "true", "yes")


def _number(field: str, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{field}: expected a number, got {value!r}") from None


# HFLM's own arguments (lm-eval also passes batch_size, device, ...); anything else would vanish into its **kwargs
HFLM_ARGS = frozenset(n for n, p in inspect.signature(HFLM.__init__).parameters.items() if p.kind == p.POSITIONAL_OR_KEYWORD) - {"self"}


class InMemoryHFLM(DataParallel, HFLM):
    """HFLM over a model passed in memory, data parallel under a launcher (HFLM alone would not split the requests)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._join()


@register_model("logitcomp")
class LogitcompLM(DataParallel, HFLM):
    """lm-eval model over a `ComposedModelForCausalLM` (see the module docstring for model_args)."""

    def __init__(self, pretrained=None, base=None, experts=None, weights=None, eos_policy=None, floor=None, rule=None, rule_params=None,
                 allow_pickle=False, trust_remote_code=False, dtype=None, device="cpu", **kwargs):
        unknown = sorted(set(kwargs) - HFLM_ARGS)
        if unknown:
            raise ValueError(f"model_args: unknown argument {unknown[0]!r} for the logitcomp model; see logitcomp-lm-eval --help")
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            device = "cpu"  # lm-eval's CLI defaults to cuda:0; HFLM falls back to the CPU too
        device = local_device(device)
        if dtype not in (None, "auto") and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise ValueError(f"dtype: expected auto, float32, float16, bfloat16 or float64, got {dtype!r}")
        options = dict(dtype=None if dtype in (None, "auto") else dtype, device=device,
                       allow_pickle=_flag("allow_pickle", allow_pickle), trust_remote_code=_flag("trust_remote_code", trust_remote_code))
        if isinstance(pretrained, ComposedModelForCausalLM):
            composed = pretrained
        elif pretrained is not None:
            composed = ComposedModelForCausalLM.from_pretrained(pretrained, **options)
        elif base is not None and experts is not None:
            config = CompositionConfig(
                weights={k: _number(f"weights.{k}", v) for k, v in parse_pairs("weights", weights).items()} if weights else {},
                **({"eos_policy": eos_policy} if eos_policy else {}),
                **({"floor": _number("floor", floor)} if floor is not None else {}),
                **({"rule": rule} if rule else {}),
                **({"rule_params": {k: _number(f"rule_params.{k}", v) for k, v in parse_pairs("rule_params", rule_params).items()}}
                   if rule_params else {}),
            )
            composed = ComposedModelForCausalLM.from_experts(base, parse_pairs("experts", experts), config=config, **options)
        else:
            raise ValueError("model_args: expected pretrained=<composed folder>, or base=<folder> and experts=name:folder|...")
        tokenizer = kwargs.pop("tokenizer", None) or AutoTokenizer.from_pretrained(composed.sources["base"])
        super().__init__(pretrained=composed, tokenizer=tokenizer, **kwargs)
        self._join()


def lm_eval_model(model, tokenizer_path, batch_size: int, trust_remote_code: bool = False) -> HFLM:
    """The lm-eval model over an in-memory `model`: `LogitcompLM` for a composition, `InMemoryHFLM` for every
    plain model (both data parallel under a launcher); the tokenizer is the base's."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust_remote_code)
    lm_class = LogitcompLM if isinstance(model, ComposedModelForCausalLM) else InMemoryHFLM
    return lm_class(pretrained=model.eval(), tokenizer=tokenizer, batch_size=batch_size)

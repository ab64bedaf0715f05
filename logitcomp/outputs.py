"""What a composed model's forward returns and carries between calls: its KV caches (`ComposedCache`),
its output (`ComposedCausalLMOutput`) and the per-position trace (`CompositionTrace`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, StaticCache
from transformers.utils import ModelOutput


class ComposedCache:
    """KV caches of one composition: the grouped rows' cache (the rows of `layout`) and one per full-model expert.

    Dynamic by default; with `max_cache_len` every cache is a transformers `StaticCache` of that many
    positions (fixed shapes: what `torch.compile` and CUDA graphs need), made by
    `generate(..., cache_implementation="static")`.
    """

    def __init__(self, full_experts: dict[str, PreTrainedModel], base_config=None, max_cache_len: int | None = None):
        self.is_compileable = max_cache_len is not None
        if self.is_compileable:
            self.rows = StaticCache(config=base_config, max_cache_len=max_cache_len)
            self.full = {name: StaticCache(config=m.config, max_cache_len=max_cache_len) for name, m in full_experts.items()}
        else:
            self.rows = DynamicCache()
            self.full = {name: DynamicCache() for name in full_experts}
        self.route = None  # routing: each row's tokens so far (`logitcomp.routing.RouteState`)
        self.layout = None  # the rows its first forward ran (`logitcomp.layout.RowLayout`), kept by every later one

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.rows.get_seq_length(layer_idx)

    @property
    def is_linear(self) -> list[bool]:
        """Per layer of the rows' cache: a linear-attention (recurrent) layer; `generate` reads it at prefill."""
        return self.rows.is_linear


@dataclass
class CompositionTrace:
    """Per position: each expert's activity KL(p_i ‖ p_b), the composed entropy (nats) and, with routing,
    each expert's gate (`logitcomp.routing`)."""

    experts: list[str]
    kl: torch.Tensor  # (B, T, k)
    entropy: torch.Tensor  # (B, T)
    gates: torch.Tensor | None = None  # (B, T, k)

    @classmethod
    def cat(cls, traces: list[CompositionTrace]) -> CompositionTrace:
        """The traces of consecutive position chunks of one batch as one trace (positions concatenated)."""
        gates = None if traces[0].gates is None else torch.cat([t.gates for t in traces], 1)
        return cls(traces[0].experts, torch.cat([t.kl for t in traces], 1), torch.cat([t.entropy for t in traces], 1), gates)

    def to_dict(self) -> dict:
        gates = {} if self.gates is None else {"gates": self.gates.tolist()}
        return {"experts": self.experts, "kl": self.kl.tolist(), "entropy": self.entropy.tolist(), **gates}


@dataclass
class ComposedCausalLMOutput(ModelOutput):
    """`logits` are the composed, normalised log-probs (B, T, V); `loss` their mean NLL of `labels`."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    cache: ComposedCache | None = None
    trace: CompositionTrace | None = None

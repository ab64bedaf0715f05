"""The first forward of a routed composition whose gates choose its rows: the base's rows, then only the experts' they keep.

The gates come from the base's hidden states (`logitcomp.routing`), so such a forward runs in two passes over the
one base model:

    1. the base's B rows: every returned position's gates, and the base's logits (kept as fp32 in the output
       buffer: the composition reads logits as fp32 anyway);
    2. the rows of the LoRA experts that a real position of an input keeps (`layout.RowLayout` of the gates),
       then the composition of each group of inputs over the experts it keeps, written over the base's logits.

Both passes run position chunk by chunk when a whole sequence is scored (`logitcomp.scoring`). When the forward
returns a cache (the gates held from the prompt, `update: false`), the two passes' caches are joined into one of
N rows whose layout every later step of the sequence keeps (`ComposedCache.layout`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from .layout import RowLayout
from .outputs import ComposedCache, ComposedCausalLMOutput
from .routing import last_hidden


def gated_forward(model, input_ids, attention_mask, position_ids, chunk: int, logits_to_keep: int,
                  cache: ComposedCache | None, keep_cache: bool) -> ComposedCausalLMOutput:
    """The composed log-probs (B, W, V) of the last W positions (W = `logits_to_keep`, else every position), and the
    cache to continue from when `keep_cache`.

    Args:
        input_ids: (B, T); attention_mask: (B, T) or None; position_ids: (B, T).
        chunk: positions per forward (`scoring.scoring_chunk`; T: one forward).
        cache: an empty ComposedCache to fill (`generate`'s), or None.
    """
    batch, length = input_ids.shape
    spans = [(start, min(length, start + chunk)) for start in range(0, length, chunk)]
    mask = lambda rows, end: None if attention_mask is None else attention_mask[rows, :end]  # noqa: E731
    run = lambda rows, start, end, past, **kw: model._hf_model(  # noqa: E731
        input_ids=input_ids[rows, start:end], attention_mask=mask(rows, end), position_ids=position_ids[rows, start:end],
        cache=past, use_cache=past is not None, logits_to_keep=logits_to_keep, **kw)
    every = slice(None)
    with model._routed():
        # 1. the base's rows: the gates of every returned position, its logits into the output buffer
        model._rows = model._fixed_layout(batch, [False] * len(model.lora_experts))
        past = DynamicCache() if keep_cache or len(spans) > 1 else None
        out, gates, widths, state, column = None, [], [], None, 0
        for start, end in spans:
            step = run(every, start, end, past, output_hidden_states=True)
            width = step.logits.shape[1]  # the returned positions of this span
            widths.append(width)
            model._check([(step.logits, model._rows.slots)], end - width, mask(every, end))
            if out is None:
                out = step.logits.new_empty(batch, width if len(spans) == 1 else length, step.logits.shape[-1], dtype=torch.float32)
            out[:, column:column + width] = step.logits  # (B, w, V)
            new = None if attention_mask is None else attention_mask[:, start:end]
            g, state = model.router.step_gates(last_hidden(step), new, state, width)  # (B, w, k)
            gates.append(g)
            column += width
        gates = torch.cat(gates, 1)  # (B, W, k)
        real = torch.ones(gates.shape[:2], dtype=torch.bool, device=gates.device) if attention_mask is None \
            else attention_mask[:, -gates.shape[1]:].bool()  # (B, W)
        weighted = torch.tensor([w != 0 for w in model._composer.weights], device=gates.device)  # (k,): an expert of weight 0 never counts
        layout = RowLayout(((gates != 0) & real.unsqueeze(-1)).any(1) & weighted, input_ids.device)  # (B, k): the experts each input keeps
        # 2. the kept experts' rows, and the composition of each group of inputs over its experts
        rows = layout.inputs[batch:]  # (n,)
        model._rows = layout.experts_only()
        experts_past = DynamicCache() if len(rows) and (keep_cache or len(spans) > 1) else None
        column = 0
        for (start, end), width in zip(spans, widths):
            logits = None
            if len(rows):
                logits = run(rows, start, end, experts_past).logits  # (n, w, V)
                model._check([(logits, layout.slots[batch:])], end - width, mask(every, end))
            part = slice(column, column + width)
            out[:, part] = model._compose(layout, out[:, part], logits, {}, False, gates[:, part]).logits
            column += width
    if not keep_cache:
        return ComposedCausalLMOutput(logits=out)
    cache = cache if cache is not None else ComposedCache({})
    cache.rows, cache.layout, cache.route = _joined(past, experts_past), layout, state
    return ComposedCausalLMOutput(logits=out, cache=cache)


def _joined(first: DynamicCache, second: DynamicCache | None) -> DynamicCache:
    """The rows of both caches as one (the second's after the first's), layer by layer."""
    if second is None:
        return first
    for a, b in zip(first.layers, second.layers, strict=True):
        if type(a) is not type(b) or type(a) not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise ValueError(f"cache: a {type(a).__name__} layer cannot hold the experts' rows beside the base's; "
                             "set model.skip_unused_experts = False to run every expert for every input")
        a.keys, a.values = torch.cat([a.keys, b.keys]), torch.cat([a.values, b.values])  # (B + n, heads, T, d)
    return first

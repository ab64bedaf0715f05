"""Scoring every position of a long input within a memory budget: a composed model's full-sequence forward
(lm-eval's loglikelihood, a loss) runs in chunks of positions, each continuing the previous chunks' KV cache,
so that the k + 1 models' full-vocabulary logits of only one chunk exist at a time (a 262k vocabulary makes
them the largest tensors of a forward). `ComposedModelForCausalLM.forward` calls these; `model.scoring_budget`
sets the chunk."""

from __future__ import annotations

import torch

from .outputs import ComposedCache, ComposedCausalLMOutput, CompositionTrace


def scoring_chunk(model, batch: int, length: int) -> int:
    """Positions per forward when every position's log-probs are wanted: as many as keep the k + 1 models'
    full-vocabulary logits of one forward within `model.scoring_budget` elements (at least 1, at most `length`)."""
    if model.scoring_budget is None:
        return length
    vocab = model.config.get_text_config().vocab_size
    return max(1, min(length, model.scoring_budget // (batch * (1 + len(model.experts)) * vocab)))


def forward_in_chunks(model, input_ids, attention_mask, position_ids, chunk: int, output_trace,
                      keep_cache: bool, layout) -> ComposedCausalLMOutput:
    """Every position's composed log-probs, `chunk` positions per forward (`model._step` of the rows of `layout`), each
    continuing the previous ones' KV cache: the body computes what one forward would, and the composed log-probs go into one
    (B, T, V) buffer. The cache is returned when `keep_cache`."""
    batch, length = input_ids.shape
    cache = ComposedCache(dict(model.full_experts))
    parts, traces, out = [], [], None
    with model._routed():  # once for all the chunks
        for start in range(0, length, chunk):
            end = min(length, start + chunk)
            step = model._step(input_ids[:, start:end], None if attention_mask is None else attention_mask[:, :end], cache,
                               None if position_ids is None else position_ids[:, start:end], 0, output_trace, False, layout)
            if torch.is_grad_enabled() and step.logits.requires_grad:
                parts.append(step.logits)  # autograd records no in-place write: concatenated below
            else:
                if out is None:
                    out = step.logits.new_empty(batch, length, step.logits.shape[-1])  # (B, T, V)
                out[:, start:end] = step.logits
            if step.trace is not None:
                traces.append(step.trace)
    logits = out if out is not None else torch.cat(parts, dim=1)
    return ComposedCausalLMOutput(logits=logits, cache=cache if keep_cache else None, trace=CompositionTrace.cat(traces) if traces else None)

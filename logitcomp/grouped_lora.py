"""Grouped-LoRA forward: one base matmul for every row, each expert's low-rank update on its rows.

peft's mixed-adapter batches (`adapter_names=[...]`) split every LoRA layer's input by adapter and
run the base layer once per group: 3 rows run no faster than 3 separate models (../shared/GOTCHAS.md).
Here the rows are laid out in contiguous groups [base | expert 1 | ... | expert k] of B rows each;
the base layer runs once on all (k+1)·B rows and each expert adds `s_i · (x A_iᵀ) B_iᵀ` only on its
block, reading peft's own LoRA weights (no copies). peft stays the loader and the exactness
reference; this module only routes, and only inside a `with grouped_lora(...)` block.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import LoraLayer


@dataclass(frozen=True)
class _Update:
    group: int  # block index in the row layout (0 is the base)
    lora_A: torch.Tensor  # (r, in)
    lora_B: torch.Tensor  # (out, r)
    scale: float


def collect_lora_layers(model: torch.nn.Module, adapters: list[str]) -> list[tuple[LoraLayer, list[_Update]]]:
    """Every LoRA layer of a peft model with the updates of `adapters` (expert i -> group i + 1).

    Raises:
        ValueError: naming the adapter and module when a layer cannot be grouped exactly
            (merged adapters, DoRA or other variants, LoRA bias, non-Linear LoRA layers).
    """
    layers = []
    for module_name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        updates = []
        for group, adapter in enumerate(adapters, start=1):
            if adapter not in module.lora_A:
                continue
            where = f"expert {adapter!r}, module {module_name}"
            if module.merged:
                raise ValueError(f"{where}: adapters are merged into the base; call unmerge_adapter() first")
            if not isinstance(module, LoraLinear):
                raise ValueError(f"{where}: only LoRA on Linear layers can be composed, got {type(module).__name__}")
            if adapter in getattr(module, "lora_variant", {}) or module.use_dora.get(adapter, False):
                raise ValueError(f"{where}: DoRA and other LoRA variants are not supported")
            if module.lora_B[adapter].bias is not None:
                raise ValueError(f"{where}: LoRA bias (lora_bias=True) is not supported")
            updates.append(_Update(group, module.lora_A[adapter].weight, module.lora_B[adapter].weight, module.scaling[adapter]))
        layers.append((module, updates))
    return layers


def _add_updates(layer, args, output, *, updates: list[_Update], groups: int):
    x = args[0]  # (G·B, T, in)
    rows = x.shape[0] // groups
    out = output.view(output.shape[0], -1, output.shape[-1])  # (G·B, T, out), a view
    for u in updates:
        block = slice(u.group * rows, (u.group + 1) * rows)
        xb = x[block].reshape(-1, x.shape[-1]).to(u.lora_A.dtype)  # (B·T, in)
        low = xb @ u.lora_A.t()  # (B·T, r)
        out[block].view(-1, out.shape[-1]).addmm_(low.to(out.dtype), u.lora_B.t().to(out.dtype), alpha=u.scale)
    return output


@contextmanager
def grouped_lora(layers: list[tuple[LoraLayer, list[_Update]]], groups: int):
    """Route LoRA updates by row block for the duration of the block; restores peft's state after.

    Args:
        layers: from `collect_lora_layers`.
        groups: number of row blocks G (1 + number of LoRA experts); inputs have G·B rows.
    """
    saved, handles = [], []
    try:
        for layer, updates in layers:
            saved.append((layer, layer._disable_adapters))
            layer._disable_adapters = True  # peft's own LoRA path off: base layer only
            if updates:
                hook = partial(_add_updates, updates=updates, groups=groups)
                handles.append(layer.base_layer.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for layer, state in saved:
            layer._disable_adapters = state

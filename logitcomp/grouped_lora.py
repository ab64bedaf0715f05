"""Grouped-LoRA forward: one base matmul for every row, the experts' low-rank updates batched.

peft's mixed-adapter batches (`adapter_names=[...]`) split every LoRA layer's input by adapter and
run the base layer once per group, which decodes no faster than separate models (measured on 2
CPU cores, 58M Llama, three rows: 0.34x the steps/s of one row). Here the rows are laid out in contiguous blocks [base | expert 1 | ... |
expert m] (`logitcomp.layout`: B rows each, or only the inputs that use an expert); the base layer runs once on
all rows and the experts' updates s_i · (x A_iᵀ) B_iᵀ are added on their own blocks by one pair of `torch.bmm`
per layer (one pair per expert where the blocks differ in size).

peft stays the loader and the exactness reference. The A/B matrices are stacked (zero-padded to
the largest rank, scale folded into B) when a composition is built, a few percent of the base's
size, and restacked (`LoraStack.layers`) whenever the adapters' weights are no longer those stacked:
after `model.to(dtype/device)`, an in-place edit, a reloaded adapter or a changed scale. A LoRA layer
that left the model (merge_and_unload, unload) is refused at the next forward. Routing is active only
inside `with grouped_lora(...)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import LoraLayer

from .layout import RowLayout


@dataclass(frozen=True)
class StackedUpdates:
    """The LoRA updates of one layer for the consecutive blocks first .. first + n - 1."""

    first: int  # first block with an update (block 0 is the base)
    a: torch.Tensor  # (n, in, r_max): A_iᵀ, zero-padded
    b: torch.Tensor  # (n, r_max, out): s_i · B_iᵀ, zero-padded
    held: tuple[bool, ...]  # per block: the expert has a LoRA layer here (else its factors are zeros)


def _check(module, adapter: str, where: str) -> None:
    if module.merged:
        raise ValueError(f"{where}: adapters are merged into the base; call unmerge_adapter() first")
    if not isinstance(module, LoraLinear):
        raise ValueError(f"{where}: only LoRA on Linear layers can be composed, got {type(module).__name__}")
    if adapter in getattr(module, "lora_variant", {}) or module.use_dora.get(adapter, False):
        raise ValueError(f"{where}: DoRA and other LoRA variants are not supported")
    if module.lora_B[adapter].bias is not None:
        raise ValueError(f"{where}: LoRA bias (lora_bias=True) is not supported")
    if not all(torch.isfinite(m[adapter].weight).all() for m in (module.lora_A, module.lora_B)):
        raise ValueError(f"{where}: the LoRA weights hold NaN or inf")


@torch.no_grad()
def _stack(module, groups: dict[int, str]) -> StackedUpdates:
    first, last = min(groups), max(groups)
    r = max(module.lora_A[name].weight.shape[0] for name in groups.values())
    ref = module.lora_A[groups[first]].weight
    a = ref.new_zeros(last - first + 1, ref.shape[1], r)  # (n, in, r)
    b = ref.new_zeros(last - first + 1, r, module.lora_B[groups[first]].weight.shape[0])  # (n, r, out)
    for group, name in groups.items():
        rank = module.lora_A[name].weight.shape[0]
        a[group - first, :, :rank] = module.lora_A[name].weight.t()
        b[group - first, :rank] = module.lora_B[name].weight.t() * module.scaling[name]
    return StackedUpdates(first, a, b, tuple(group in groups for group in range(first, last + 1)))


def collect_lora_layers(model: torch.nn.Module, adapters: list[str]) -> list[tuple[LoraLayer, StackedUpdates | None]]:
    """Every LoRA layer of a peft model with the stacked updates of `adapters` (expert i -> block i + 1).

    Raises:
        ValueError: naming the adapter and module when a layer cannot be grouped exactly
            (merged adapters, DoRA or other variants, LoRA bias, non-Linear LoRA layers).
    """
    layers = []
    for module_name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        groups = {}
        for group, adapter in enumerate(adapters, start=1):
            # peft keeps embedding LoRA in lora_embedding_A: checked (and refused) like any other layer
            if adapter in module.lora_A or adapter in getattr(module, "lora_embedding_A", {}):
                _check(module, adapter, f"expert {adapter!r}, module {module_name}")
                groups[group] = adapter
        layers.append((module, _stack(module, groups) if groups else None))
    return layers


class LoraStack:
    """The stacked updates of `adapters` in a peft model, kept in step with the live adapter weights.

    A stack is a copy; `layers()` compares each adapter weight's storage, version counter, dtype
    and device and the scales with those it was stacked from (a few hundred attribute reads per
    call) and restacks on any change. Edits through `.data` bypass the version counter and are not seen.
    """

    def __init__(self, model, adapters: list[str]):
        self.model, self.adapters = model, list(adapters)
        self._frozen = False
        self._stack()

    def _stack(self) -> None:
        self._layers = collect_lora_layers(self.model, self.adapters)
        where = {id(m): name for name, m in self.model.named_modules()}
        self._paths = [where[id(layer)] for layer, _ in self._layers]  # where each LoRA layer sits in the model
        self._held = [[a for a in self.adapters if a in layer.lora_A] for layer, _ in self._layers]  # per layer
        self._state = self._current_state()

    def _current_state(self) -> tuple:
        state = []
        for (layer, _), path, names in zip(self._layers, self._paths, self._held):
            try:
                still = self.model.get_submodule(path) is layer
            except AttributeError:
                still = False
            if not still:  # merge_and_unload(), unload() or a replaced module: the composition's experts are gone
                raise ValueError(f"module {path}: the peft model's LoRA layers were replaced after composing (merge_and_unload, "
                                 "unload or a swapped module); compose the experts again")
            state.append(tuple(layer.merged_adapters))
            for name in names:
                if name not in layer.lora_A:
                    raise ValueError(f"expert {name!r}: the adapter was removed from the peft model after composing")
                state.append(layer.scaling[name])
                for w in (layer.lora_A[name].weight, layer.lora_B[name].weight):
                    state.append((w.data_ptr(), w._version, w.dtype, w.device))
        return tuple(state)

    def layers(self) -> list[tuple[LoraLayer, StackedUpdates | None]]:
        """The stacked updates of the adapters as they are now (restacked when they changed)."""
        if not self._frozen and self._current_state() != self._state:
            self._stack()
        return self._layers

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Compare the adapters with the stack on entry only (a decoding loop that edits no weight)."""
        self.layers()
        self._frozen = True
        try:
            yield
        finally:
            self._frozen = False


def _add_updates(layer, args, output, *, updates: StackedUpdates, layout: Callable[[], RowLayout]):
    # Runs once per LoRA layer per forward: one pair of batched matmuls where the experts have as many rows each
    # (every full layout), else one pair per expert with rows.
    rows = layout()
    start, end, counts = rows.span(updates.first - 1, updates.a.shape[0])  # experts first .. (block 0 is the base)
    if end == start:
        return output
    x = args[0].reshape(rows.total, -1, args[0].shape[-1])  # (N, T, in)
    out = output.view(rows.total, -1, output.shape[-1])  # (N, T, out), a view of the layer's output
    if len(set(counts)) == 1:  # (n, c·T, in) x (n, in, r) x (n, r, out)
        low = torch.bmm(x[start:end].reshape(len(counts), -1, x.shape[-1]).to(updates.a.dtype), updates.a)  # (n, c·T, r)
        out[start:end] += torch.bmm(low, updates.b).view(end - start, -1, out.shape[-1]).to(out.dtype)
        return output
    for i, count in enumerate(counts):
        if count and updates.held[i]:  # (an expert without a LoRA layer here adds nothing)
            block = slice(start, start + count)
            out[block] += ((x[block].to(updates.a.dtype) @ updates.a[i]) @ updates.b[i]).to(out.dtype)  # (c, T, out)
        start += count
    return output


@contextmanager
def grouped_lora(layers: list[tuple[LoraLayer, StackedUpdates | None]], layout: Callable[[], RowLayout]):
    """Route LoRA updates by row block inside the block; peft's own state is restored after.

    Args:
        layers: from `collect_lora_layers`.
        layout: returns the rows of the forward being run (`logitcomp.layout.RowLayout`: which rows run which
            expert), read by every layer at every forward.
    """
    saved, handles = [], []
    try:
        for layer, updates in layers:
            saved.append((layer, layer._disable_adapters))
            layer._disable_adapters = True  # peft's own LoRA path off: the base layer only
            if updates is not None:
                hook = partial(_add_updates, updates=updates, layout=layout)
                handles.append(layer.base_layer.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for layer, state in saved:
            layer._disable_adapters = state

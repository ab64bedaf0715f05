"""Which rows a composed forward runs: the base's rows, then each LoRA expert's rows for only the inputs that use it.

A forward of B inputs runs N = B + Σ_j n_j rows of the one base model, in blocks

    [ base: the B inputs | expert 1: its n_1 inputs | ... | expert m: its n_m inputs ]

(`grouped_lora` adds expert j's LoRA update to its block only), with one KV cache of N rows. An input runs
expert j where j's weight can be other than 0 for the rest of its sequence: with fixed weights, every expert
of weight ≠ 0 (all of them: the full layout, n_j = B, what every composition ran before); with routing, the
experts whose gate is above 0 somewhere in the forward and, where the gates are held from the prompt
(`update: false`), at every later step. An expert left out of an input's rows is never computed for it; its
log-probs would be multiplied by 0, which changes nothing where `ops.Composer.sparse` holds, so the inputs of
each distinct kept set S are composed over S alone (`Composer.subset`), with the same log-probs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Group:
    """The inputs that run the same experts, and where their rows sit in the forward."""

    experts: tuple[int, ...]  # the LoRA experts they run (indices, in order)
    inputs: slice | torch.Tensor  # their input rows (B_S,): a slice when they are every input, in order
    # per expert in `experts`: the rows of those inputs (B_S,), in the same order, counted from the first expert row
    rows: tuple[slice | torch.Tensor, ...]


class RowLayout:
    """The rows of a forward of `keep.shape[0]` inputs (see the module docstring).

    Args:
        keep: (B, m) bool, input b runs LoRA expert j.
        device: where the index tensors live (the model's).
        base: the forward runs the base's B rows first; False: only the experts' rows (the second pass of a
            routed forward whose gates chose them, `logitcomp.gated`).
    """

    def __init__(self, keep: torch.Tensor, device=None, base: bool = True):
        keep = keep.bool().cpu()
        self.keep = keep
        self.batch, experts = keep.shape
        members = [keep[:, j].nonzero().flatten().tolist() for j in range(experts)]  # each expert's inputs, in order
        self.counts = [len(m) for m in members]  # rows per expert
        offset = self.batch if base else 0
        self.starts = [offset + sum(self.counts[:j]) for j in range(experts)]  # each expert's first row
        self.total = offset + sum(self.counts)  # N
        inputs = ([*range(self.batch)] if base else []) + [b for m in members for b in m]
        self.inputs = torch.tensor(inputs, dtype=torch.long, device=device)  # (N,): the input of each row
        # each row's (model, input) as model · B + input, model 0 the base: how the logits checks name a row
        slots = ([*range(self.batch)] if base else []) + [(1 + j) * self.batch + b for j, m in enumerate(members) for b in m]
        self.slots = torch.tensor(slots, dtype=torch.long, device=device)  # (N,)
        self.groups = self._groups(members, device)

    def _groups(self, members: list[list[int]], device) -> list[Group]:
        kept: dict[tuple[int, ...], list[int]] = {}
        for b, row in enumerate(self.keep.tolist()):
            kept.setdefault(tuple(j for j, k in enumerate(row) if k), []).append(b)
        index = lambda xs: torch.tensor(xs, dtype=torch.long, device=device)  # noqa: E731
        groups = []
        for experts, inputs in kept.items():
            rows = []
            for j in experts:
                start = sum(self.counts[:j])  # counted from the first expert row
                if inputs == members[j]:  # the expert's whole block
                    rows.append(slice(start, start + len(inputs)))
                else:
                    where = {b: i for i, b in enumerate(members[j])}
                    rows.append(index([start + where[b] for b in inputs]))
            every = len(inputs) == self.batch
            groups.append(Group(experts, slice(0, self.batch) if every else index(inputs), tuple(rows)))
        return groups

    @classmethod
    def of(cls, batch: int, keep: list[bool], device=None) -> RowLayout:
        """Every input running the same experts (`keep`: one bool per expert)."""
        return cls(torch.tensor(keep, dtype=torch.bool).expand(batch, len(keep)), device)

    def experts_only(self) -> RowLayout:
        """The same experts' rows without the base's block: the rows of a forward of the experts alone."""
        return RowLayout(self.keep, self.inputs.device, base=False)

    def span(self, first: int, count: int) -> tuple[int, int, list[int]]:
        """The rows of experts first .. first + count - 1: (start, end, rows per expert)."""
        counts = self.counts[first:first + count]
        return self.starts[first], self.starts[first] + sum(counts), counts

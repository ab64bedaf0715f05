"""Checks shared by every merge: one clear error naming the bad expert, weight or path."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from logitcomp.loading import check_adapter_base, expert_kind
from logitcomp.ops import check_weights


@dataclass(frozen=True)
class Expert:
    """One expert of a merge: absolute folder, `lora` or `full`, and its weight."""

    name: str
    path: Path
    kind: str
    weight: float


def resolve(base, experts: dict, weights: dict | None) -> tuple[Path, list[Expert]]:
    """Absolute base folder and experts in the given order.

    Raises:
        ValueError: a missing folder, a folder that is neither adapter nor model, an adapter of
            another base, weights naming unknown experts or not finite.
    """
    base = Path(base).expanduser().resolve()
    if not (base / "config.json").is_file():
        raise ValueError(f"base: {base} is not a model folder (no config.json)")
    if not experts:
        raise ValueError("experts: expected at least one expert")
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(experts))
    if unknown:
        raise ValueError(f"weights: unknown expert {unknown[0]!r}; the experts are {list(experts)}")
    values = check_weights([weights.get(n, 1.0) for n in experts], list(experts))
    out = []
    for (name, path), weight in zip(experts.items(), values):
        path = Path(path).expanduser().resolve()
        if not path.exists():
            raise ValueError(f"expert {name!r}: {path} does not exist")
        kind = expert_kind(name, path)
        if kind == "lora":
            check_adapter_base(name, path, base)
        out.append(Expert(name, path, kind, weight))
    return base, out

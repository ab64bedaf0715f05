"""Session fixtures: tiny random models built once per test session in a temp dir."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from common import TINY_ADAPTERS, make_tiny_full_expert, make_tiny_llama, make_tiny_lora  # noqa: E402


@dataclass(frozen=True)
class TinyWorld:
    """Paths of a tiny random base, its LoRA adapters and a full-model expert."""

    base: Path
    adapters: dict[str, Path]
    full_expert: Path


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyWorld:
    root = tmp_path_factory.mktemp("tiny")
    base = make_tiny_llama(root / "base")
    adapters = {
        name: make_tiny_lora(base, root / "adapters" / name, seed=i + 1, **kwargs)
        for i, (name, kwargs) in enumerate(TINY_ADAPTERS.items())
    }
    return TinyWorld(base, adapters, make_tiny_full_expert(base, root / "full", seed=7))


# scripts/ and each study's folder under experiments/ hold thin drivers; tests call their functions
# (e.g. experiments/toy-world/toy_composition.py)
ROOT = Path(__file__).resolve().parent.parent
for folder in [ROOT / "scripts", *sorted(p for p in (ROOT / "experiments").iterdir() if p.is_dir())]:
    sys.path.insert(0, str(folder))

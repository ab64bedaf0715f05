"""World fixtures: the full toy worlds and the converted SmolLM2, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _toy_world(tmp_path_factory, variant: str):
    """The full toy world, built once per session (or reused from $LOGITCOMP_TOY_<VARIANT>)."""
    from merging.worlds.toy import ToyConfig, ToyWorld, build_toy_world

    reuse = os.environ.get(f"LOGITCOMP_TOY_{variant.upper()}")
    if reuse:
        world = ToyWorld.load(Path(reuse))
        assert world.config == ToyConfig(variant=variant), f"{reuse} holds another toy configuration"
        return world
    return build_toy_world(tmp_path_factory.mktemp(f"toy-{variant}") / "world", ToyConfig(variant=variant))


@pytest.fixture(scope="session")
def toy_factorised(tmp_path_factory):
    return _toy_world(tmp_path_factory, "factorised")


@pytest.fixture(scope="session")
def toy_entangled(tmp_path_factory):
    return _toy_world(tmp_path_factory, "entangled")


@pytest.fixture(scope="session")
def smol(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted once per session (or reused from $LOGITCOMP_SMOL). Returns the world folder."""
    from merging.worlds.smol.convert import build_smol

    reuse = os.environ.get("LOGITCOMP_SMOL")
    root = Path(reuse) if reuse else tmp_path_factory.mktemp("smol") / "world"
    build_smol(root)
    return root

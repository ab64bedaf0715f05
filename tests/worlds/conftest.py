"""World fixtures: the full toy worlds and the converted SmolLM2, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def toy_worlds(request) -> dict:
    """Both full toy worlds of seed 0: reused from $LOGITCOMP_TOY_<VARIANT>, else the builds that tests/conftest.py
    started in the background at collection (two 1-thread processes; each toy.json records its thread count,
    and the bars and every test hold for 1 or 2 threads)."""
    from merging.worlds.toy import ToyConfig, ToyWorld

    worlds = {}
    for variant in ("factorised", "entangled"):
        reuse = os.environ.get(f"LOGITCOMP_TOY_{variant.upper()}")
        if reuse:
            worlds[variant] = ToyWorld.load(Path(reuse))
            continue
        root, proc = request.config.toy_builds[variant]
        if proc.wait() != 0:
            log = root.parent / f"{variant}.log"
            pytest.fail(f"the {variant} toy world did not build ({log}):\n{log.read_text()[-3000:]}")
        worlds[variant] = ToyWorld.load(root)
    for variant, world in worlds.items():
        assert world.config == ToyConfig(variant=variant), f"{world.root} holds another toy configuration"
    return worlds


@pytest.fixture(scope="session")
def toy_factorised(toy_worlds):
    return toy_worlds["factorised"]


@pytest.fixture(scope="session")
def toy_entangled(toy_worlds):
    return toy_worlds["entangled"]


@pytest.fixture(scope="session")
def smol(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted once per session (or reused from $LOGITCOMP_SMOL). Returns the world folder."""
    from merging.worlds.smol.convert import build_smol

    reuse = os.environ.get("LOGITCOMP_SMOL")
    root = Path(reuse) if reuse else tmp_path_factory.mktemp("smol") / "world"
    build_smol(root)
    return root

"""World fixtures: the full factorised toy world and the converted SmolLM2, built once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def toy_factorised(tmp_path_factory):
    """The full factorised toy world of seed 0 (the default `logitcomp toy build`), built once per session with the
    machine's threads while the tests wait (or reused from $LOGITCOMP_TOY_FACTORISED). The entangled world of the same
    defaults is built (and held to the same bars, or the build fails) by `make toy-seeds`, not here: building both
    side by side took 8-10.4 of the suite's minutes and put it over its 20-minute budget."""
    from merging.worlds.toy import ToyConfig, ToyWorld

    reuse = os.environ.get("LOGITCOMP_TOY_FACTORISED")
    if reuse:
        world = ToyWorld.load(Path(reuse))
    else:
        root = tmp_path_factory.mktemp("toy-factorised") / "world"
        proc = subprocess.run([sys.executable, "-m", "merging.cli", "-q", "toy", "build", str(root)], capture_output=True, text=True)
        assert proc.returncode == 0, f"the factorised toy world did not build:\n{proc.stderr[-3000:]}"
        world = ToyWorld.load(root)
    assert world.config == ToyConfig(), f"{world.root} holds another toy configuration"
    return world


@pytest.fixture(scope="session")
def smol(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct converted once per session (or reused from $LOGITCOMP_SMOL). Returns the world folder."""
    from merging.worlds.smol.convert import build_smol

    reuse = os.environ.get("LOGITCOMP_SMOL")
    root = Path(reuse) if reuse else tmp_path_factory.mktemp("smol") / "world"
    build_smol(root)
    return root

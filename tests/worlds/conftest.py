"""World fixtures: the full toy worlds and the converted SmolLM2, built once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


VARIANTS = ("factorised", "entangled")


@pytest.fixture(scope="session")
def toy_worlds(tmp_path_factory) -> dict:
    """Both full toy worlds, built once per session (or reused from $LOGITCOMP_TOY_<VARIANT>).

    The two builds run side by side in two processes of one thread each while the tests wait: this
    model is so small that a second thread makes a build only about 1.4 times faster, so two 1-thread
    builds at once end well before two 2-thread builds one after the other (each build's toy.json
    records its thread count; the bars and every test hold for either)."""
    from merging.worlds.toy import ToyConfig, ToyWorld

    worlds, builds = {}, {}
    try:
        for variant in VARIANTS:
            reuse = os.environ.get(f"LOGITCOMP_TOY_{variant.upper()}")
            if reuse:
                worlds[variant] = ToyWorld.load(Path(reuse))
                continue
            root = tmp_path_factory.mktemp(f"toy-{variant}") / "world"
            command = [sys.executable, "-m", "merging.cli", "-q", "toy", "build", str(root), "--variant", variant]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            builds[variant] = root, subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for variant, (root, proc) in builds.items():
            _, stderr = proc.communicate()
            assert proc.returncode == 0, f"the {variant} toy world did not build:\n{stderr[-3000:]}"
            worlds[variant] = ToyWorld.load(root)
    finally:
        for _, proc in builds.values():
            proc.kill()  # a no-op for an ended process; stops the other build when one failed or the session is interrupted
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

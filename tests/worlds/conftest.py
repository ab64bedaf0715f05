"""World fixtures: the full toy worlds and the converted SmolLM2, built once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from common import run_side_by_side


VARIANTS = ("factorised", "entangled")


@pytest.fixture(scope="session")
def toy_worlds(tmp_path_factory) -> dict:
    """Both full toy worlds, built once per session (or reused from $LOGITCOMP_TOY_<VARIANT>).

    The two builds run side by side in two processes of one thread each while the tests wait: this
    model is so small that a second thread makes a build only about 1.4 times faster, so two 1-thread
    builds at once end well before two 2-thread builds one after the other (each build's toy.json
    records its thread count; the bars and every test hold for either)."""
    from merging.worlds.toy import ToyConfig, ToyWorld

    reuse = {v: os.environ.get(f"LOGITCOMP_TOY_{v.upper()}") for v in VARIANTS}
    worlds = {v: ToyWorld.load(Path(path)) for v, path in reuse.items() if path}
    roots = {v: tmp_path_factory.mktemp(f"toy-{v}") / "world" for v in VARIANTS if v not in worlds}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = run_side_by_side(*(dict(args=[sys.executable, "-m", "merging.cli", "-q", "toy", "build", str(root), "--variant", v],
                                   capture_output=True, text=True, env=env) for v, root in roots.items()))
    for (variant, root), proc in zip(roots.items(), done):
        assert proc.returncode == 0, f"the {variant} toy world did not build:\n{proc.stderr[-3000:]}"
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

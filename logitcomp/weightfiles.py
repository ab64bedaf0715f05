"""Safetensors files read without torch: headers, shapes, and a scan for NaN/inf.

`validate` checks weight files without loading a model (and without importing torch), so the
header is parsed here (the format is 8 bytes of little-endian header length, a JSON header, then
the raw tensors) rather than through the `safetensors` package, whose torch-free numpy reader has
no bfloat16. A value is NaN or ±inf exactly when all its IEEE exponent bits are set, which numpy
checks on the raw bits of every float format.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

MAX_HEADER = 100 * 2**20
# dtype -> (unsigned int view, exponent mask) of the float formats safetensors stores
EXPONENT = {"F64": (np.uint64, 0x7FF0000000000000), "F32": (np.uint32, 0x7F800000),
            "F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80)}


def header(label: str, file: Path) -> dict[str, dict]:
    """Tensor name -> {"dtype", "shape", "data_offsets"} of one file. Raises ValueError naming the file
    when it is empty, truncated or not safetensors."""
    size = file.stat().st_size
    problem = None
    with file.open("rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
        if length is None or length > min(MAX_HEADER, size - 8):
            problem = "empty" if size == 0 else "too short for its header"
        else:
            try:
                meta = json.loads(f.read(length))
            except (UnicodeDecodeError, json.JSONDecodeError):
                problem = "not a safetensors header"
    if problem is None:
        tensors = {k: v for k, v in meta.items() if k != "__metadata__"} if isinstance(meta, dict) else None
        if tensors is None or not all(isinstance(v, dict) and {"dtype", "shape", "data_offsets"} <= set(v) for v in tensors.values()):
            problem = "not a safetensors header"
        elif max((v["data_offsets"][1] for v in tensors.values()), default=0) > size - 8 - length:
            problem = "truncated: its tensors end past the end of the file"
    if problem:
        raise ValueError(f"{label}: {file} is not a readable safetensors file ({problem})")
    return tensors


def shapes(label: str, folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over every safetensors file of a folder (each header checked)."""
    out = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        out.update({name: tuple(t["shape"]) for name, t in header(label, file).items()})
    return out


def check_finite(label: str, folder: Path) -> None:
    """Raise ValueError naming the folder and tensor when a float tensor of its safetensors holds NaN or inf."""
    for file in sorted(Path(folder).glob("*.safetensors")):
        tensors = header(label, file)
        with file.open("rb") as f:
            start = 8 + struct.unpack("<Q", f.read(8))[0]
        data = np.memmap(file, dtype=np.uint8, mode="r")
        for name, t in tensors.items():
            if t["dtype"] not in EXPONENT:
                continue
            view, mask = EXPONENT[t["dtype"]]
            begin, end = t["data_offsets"]
            bits = data[start + begin:start + end].view(view)
            if np.any((bits & view(mask)) == view(mask)):
                raise ValueError(f"{label}: {folder} has NaN or inf in {name}")

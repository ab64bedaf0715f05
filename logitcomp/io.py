"""Atomic folder writes: outputs appear whole or not at all."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield an empty temporary sibling of `target`; on success it replaces `target`.

    On an exception the temporary folder is removed and `target` is left as it was.
    """
    target = Path(target).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the result is an ordinary folder
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary sibling file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the result is an ordinary file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path

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
    """Write `data` to `path` through a temporary sibling file and a rename.

    Raises:
        OSError: one line naming `path`, the cause and the free space (a full disk, a quota, a read-only
            folder); the previous file at `path` is kept as it was.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.partial-", dir=path.parent)  # swept by a run's lock if killed
    except OSError as exc:
        raise _not_written(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the result is an ordinary file
        os.replace(tmp, path)
    except OSError as exc:
        raise _not_written(path, exc) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def existing_parent(path: Path) -> Path:
    """`path`, or its nearest existing parent (where a file or folder at `path` would be created)."""
    path = Path(path)
    return next(p for p in (path, *path.parents) if p.exists())


def free_mib(path: Path) -> float:
    """Free space, in MiB, on the disk that holds `path` (or would hold it)."""
    return shutil.disk_usage(existing_parent(path)).free / 2**20


def _not_written(path: Path, exc: OSError) -> OSError:
    """`exc` as one line naming `path` (errno kept, so callers can still tell a full disk)."""
    error = OSError(f"{path}: not written ({exc.strerror or exc}; {free_mib(path):.0f} MiB free on that disk); the previous file is kept")
    error.errno = exc.errno
    return error

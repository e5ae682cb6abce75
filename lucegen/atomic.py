"""Atomic file output: readers see the old file or the complete new one, never a partial one.

Everything lucegen writes for a user (compile-cache entries, generated sources, descriptors, checkpoints, bench
JSON) goes through here: a temp file in the destination's directory (same filesystem, so the rename is atomic),
fsynced, then ``os.replace``d onto the destination; on any error, Ctrl-C included, the temp file is removed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``final`` for the caller (or a library) to write; on normal exit it is fsynced and
    renamed onto ``final``, on error removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result gets the usual permissions
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_open(final: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """``open(final, mode)`` for writing, made atomic by :func:`atomic_path`."""
    with atomic_path(final) as tmp, open(tmp, mode) as f:
        yield f


def atomic_write(final: str | os.PathLike, data: bytes | str) -> None:
    """Write all of ``data`` to ``final`` atomically."""
    with atomic_open(final, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)

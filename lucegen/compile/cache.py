"""Content-addressed on-disk compile cache.

An entry is one file ``<sha256 key>.lgc`` under :func:`cache_dir` (``$LUCEGEN_CACHE_DIR``, else
``$XDG_CACHE_HOME/lucegen``, else ``~/.cache/lucegen``). Layout: magic ``LGC1``, the lengths of a JSON metadata block
and of the binary (8 bytes each, little endian), the sha256 of metadata+binary, then the two blocks. Entries are
written to a temporary file in the same directory, fsynced and renamed into place, so a killed build leaves either
no entry or a whole one; an entry that fails its length or checksum check (a truncated or corrupted file) reads as a
miss and is overwritten by the next compile.

A compile holds :func:`compile_lock` for its key (an exclusive ``flock`` on ``locks/<key>.lock``), and looks the
entry up again once it has the lock: builds running at once on one cache (processes or threads) compile each module
once, the others wait for it and read the entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # not a POSIX system: builds do not coordinate (each may compile a module)
    fcntl = None

from ..atomic import atomic_write

MAGIC = b"LGC1"
_HEADER = struct.Struct("<4sQQ32s")


def cache_dir() -> Path:
    if env := os.environ.get("LUCEGEN_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lucegen"


def cache_key(**parts: Any) -> str:
    """sha256 over the canonical JSON of everything that determines the binary (source, compiler, options, arch)."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def entry_path(key: str) -> Path:
    return cache_dir() / f"{key}.lgc"


def load(key: str) -> tuple[dict[str, Any], bytes] | None:
    """(metadata, binary) for a whole, intact entry; None for a miss or a damaged entry."""
    try:
        data = entry_path(key).read_bytes()
    except OSError:
        return None
    if len(data) < _HEADER.size:
        return None
    magic, meta_len, bin_len, digest = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != MAGIC or len(body) != meta_len + bin_len or hashlib.sha256(body).digest() != digest:
        return None
    try:
        meta = json.loads(body[:meta_len])
    except ValueError:
        return None
    return meta, body[meta_len:]


def store(key: str, meta: dict[str, Any], binary: bytes) -> None:
    meta_blob = json.dumps(meta, sort_keys=True).encode()
    body = meta_blob + binary
    data = _HEADER.pack(MAGIC, len(meta_blob), len(binary), hashlib.sha256(body).digest()) + body
    atomic_write(entry_path(key), data)


@contextmanager
def compile_lock(key: str) -> Iterator[None]:
    """Hold the exclusive lock of ``key`` (released when the block ends, or when the process dies). Where the cache
    directory cannot hold a lock file (read-only), compiles go ahead unlocked."""
    if fcntl is None:
        yield
        return
    path = cache_dir() / "locks" / f"{key}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock

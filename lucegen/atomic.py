"""Atomic file output: readers see the old file or the complete new one, never a partial one.

Everything lucegen writes for a user (compile-cache entries, generated sources, descriptors, checkpoints, bench
JSON) goes through here: a temp file in the destination's directory (same filesystem, so the rename is atomic),
fsynced, then ``os.replace``d onto the destination; on any error, Ctrl-C included, the temp file is removed. A
checkpoint directory is written whole into a temp directory beside it (:func:`atomic_directory`) and swapped in.

A temp name carries its writer's process id (``.<name>.<pid>.<random>.tmp``): what a killed writer (kill -9, a power
cut) left behind is recognised by the next write beside it, whose process id is gone, and removed.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

_STALE = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.(?P<kind>tmp|old)")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale(final: str | os.PathLike) -> list[Path]:
    """Remove what killed writers of ``final`` left beside it: temp files and directories whose process is gone; a
    checkpoint directory moved aside for a swap that never finished is moved back when ``final`` is missing.
    Returns what was removed or restored."""
    final = Path(final)
    prefix = f".{final.name}."
    try:
        entries = [Path(e.path) for e in os.scandir(final.parent) if e.name.startswith(prefix)]
    except OSError:
        return []
    handled = []
    for entry in entries:
        m = _STALE.fullmatch(entry.name)
        if not m or m.group("name") != final.name or _alive(int(m.group("pid"))):
            continue
        if m.group("kind") == "old" and not final.exists() and not final.is_symlink():
            os.replace(entry, final)  # the new one never arrived: the old checkpoint is the checkpoint
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        handled.append(entry)
    return handled


def _temp_prefix(final: Path) -> str:
    return f".{final.name}.{os.getpid()}."


@contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside ``final`` for the caller (or a library) to write; on normal exit it is fsynced and
    renamed onto ``final``, on error removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(final)
    fd, name = tempfile.mkstemp(prefix=_temp_prefix(final), suffix=".tmp", dir=final.parent)
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


@contextmanager
def atomic_directory(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp directory beside ``final`` to write a whole directory into (a checkpoint): it starts with
    ``final``'s current entries (hard links, so it costs no copy), the caller overwrites what it produces, and on
    normal exit the temp directory is fsynced and takes ``final``'s place in one rename (an exchange where ``final``
    exists); the old directory is removed after. Until then ``final`` is the old directory, complete; on error the
    temp directory is removed and ``final`` is untouched. The caller replaces each file it writes (atomic_write,
    atomic_path), never writes into one in place: a carried-over file is the old directory's file."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(final)
    if final.exists() and not final.is_dir():
        raise NotADirectoryError(20, "exists and is not a directory", str(final))
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(final), suffix=".tmp", dir=final.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; the result gets the usual permissions
        if final.is_dir():
            shutil.copytree(final, tmp, symlinks=True, copy_function=_link_or_copy, dirs_exist_ok=True)
        yield tmp
        for entry in tmp.rglob("*"):
            if entry.is_file() and not entry.is_symlink():
                with open(entry, "rb") as f:
                    os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.is_dir():
            if _exchange(tmp, final):  # final is the new directory now, tmp the old one
                _fsync_dir(final.parent)
                shutil.rmtree(tmp, ignore_errors=True)
                return
            # no atomic exchange on this system: two renames (killed between them, remove_stale moves old back)
            old = tmp.with_name(tmp.name[: -len(".tmp")] + ".old")
            os.replace(final, old)
            os.replace(tmp, final)
            _fsync_dir(final.parent)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
            _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # a filesystem without hard links
        shutil.copy2(source, destination)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0

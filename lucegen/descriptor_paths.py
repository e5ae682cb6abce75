"""Where chip descriptors are found: the package's own (``lucegen/targets/``) and the user's directories.

The user's directories are ``$LUCEGEN_TARGETS_PATH``, a list separated by ``os.pathsep`` (set but empty: none);
with the variable unset, ``$XDG_CONFIG_HOME/lucegen/targets`` (``~/.config/lucegen/targets`` without
``XDG_CONFIG_HOME``). A directory that does not exist holds nothing. Every name is found once: a user descriptor named
as a packaged one, or as one in another user directory, is an error naming both files, never a silent shadow (a chip
that changed under an old name would build with the wrong figures without a word). Rename one of the two.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import TARGETS_DIR
from .errors import DescriptorError

#: The environment variable naming the user's descriptor directories.
PATH_VARIABLE = "LUCEGEN_TARGETS_PATH"
PACKAGE = "package"
USER = "user"


@dataclass(frozen=True)
class Descriptor:
    """A descriptor file found by name: where it is, and whether it ships with lucegen or is the user's."""

    name: str
    path: Path
    origin: str  # PACKAGE or USER


def default_user_dir() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "lucegen" / "targets"


def user_dirs() -> list[Path]:
    """The user's descriptor directories, in search order (they need not exist)."""
    value = os.environ.get(PATH_VARIABLE)
    if value is None:
        return [default_user_dir()]
    return [Path(os.path.expanduser(part)) for part in value.split(os.pathsep) if part]


def search_dirs() -> list[tuple[Path, str]]:
    """(directory, origin) for the package's directory, then the user's; a directory listed twice counts once."""
    found, seen = [], set()
    for directory, origin in [(TARGETS_DIR, PACKAGE)] + [(d, USER) for d in user_dirs()]:
        key = directory.resolve()
        if key not in seen:
            seen.add(key)
            found.append((directory, origin))
    return found


def descriptors() -> dict[str, Descriptor]:
    """Every descriptor by name. Raises DescriptorError where two files give one name."""
    found: dict[str, Descriptor] = {}
    for directory, origin in search_dirs():
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.toml")):
            name = path.stem
            if name in found:
                raise DescriptorError(path, "<file>", f"names the target {name!r}, as {found[name].path} does; "
                                                      f"rename one of the two (a descriptor is found by its name)")
            found[name] = Descriptor(name, path, origin)
    return found

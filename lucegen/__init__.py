"""lucegen: per-chip LLM inference kernels generated from one set of templates."""

from importlib.resources import files
from pathlib import Path

__version__ = "0.1.0"

#: The package's own data: the chip descriptors and the Jinja templates ship inside the wheel. An installed lucegen
#: is a directory (a wheel unpacks into site-packages), so ``files()`` gives a real path every reader can open.
_package = files(__name__)
if not isinstance(_package, Path):
    raise ImportError(f"lucegen must be installed as a directory, not imported from an archive ({_package})")
PACKAGE_DIR = _package.resolve()
TARGETS_DIR = PACKAGE_DIR / "targets"
TEMPLATES_DIR = PACKAGE_DIR / "templates"
#: The committed review copy of the rendered sources, in a source checkout (absent in an installed wheel).
GENERATED_DIR = PACKAGE_DIR.parent / "generated"


def source_checkout() -> Path | None:
    """The repository root when lucegen runs from a source checkout (GENERATED_DIR's parent holds .git or
    pyproject.toml), else None (an installed wheel: its parent is site-packages)."""
    root = GENERATED_DIR.parent
    return root if (root / ".git").exists() or (root / "pyproject.toml").exists() else None


#: The public API, imported on first use so that ``import lucegen`` stays light (lucegen/api.py).
_API = ("LLM", "Completion", "StreamPiece", "Timings")


def __getattr__(name: str):
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'lucegen' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_API])

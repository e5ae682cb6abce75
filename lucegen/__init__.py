"""lucegen: per-chip LLM inference kernels generated from one set of templates."""

from pathlib import Path

__version__ = "0.1.0"

#: The package's own data: the chip descriptors and the Jinja templates ship inside the wheel.
PACKAGE_DIR = Path(__file__).resolve().parent
TARGETS_DIR = PACKAGE_DIR / "targets"
TEMPLATES_DIR = PACKAGE_DIR / "templates"
#: The committed review copy of the rendered sources, in a source checkout (absent in an installed wheel).
GENERATED_DIR = PACKAGE_DIR.parent / "generated"

"""lucegen: per-chip LLM inference kernels generated from one set of templates."""

from pathlib import Path

__version__ = "0.1.0"

#: The repository root (templates/, targets/, generated/ live here in a source checkout).
ROOT = Path(__file__).resolve().parent.parent
TARGETS_DIR = ROOT / "targets"
TEMPLATES_DIR = ROOT / "templates"
GENERATED_DIR = ROOT / "generated"

"""The DDTree verify kernels (templates/dflash/tree_verify.cu.j2): tree conv / delta rule / attention, per-row
argmax and the commit, rendered for the default model shape; the runtime renders the loaded model's own shape."""

from __future__ import annotations

from ..codegen import KernelFamily
from .prefill import _params

FAMILIES = (KernelFamily("tree_verify", "dflash/tree_verify.cu.j2", params=_params),)

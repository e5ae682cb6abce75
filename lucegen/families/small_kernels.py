"""RMSNorm, matrix-vector product and argmax: the small kernels every decode path uses."""

from __future__ import annotations

from ..target import Target
from .base import KernelFamily

#: Element types the small kernels are instantiated for (the two-byte float types the chip supports).
HALF_DTYPES = ("bf16", "fp16")
#: Threads per block for all three kernels (tuning choice: 8 warps of 32, 4 waves of 64).
BLOCK_THREADS = 256


def _params(target: Target, shape: None) -> dict:
    return {"instances": [d for d in target.dtypes if d in HALF_DTYPES], "block_threads": BLOCK_THREADS}


FAMILIES = (KernelFamily("small_kernels", "kernels/small_kernels.cu.j2", params=_params),)

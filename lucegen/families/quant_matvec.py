"""Dequantisation, matrix-vector product and the embedding gather read straight from GGML blocks (Q8_0, Q4_K, Q5_K,
Q6_K): the quantised target path of DFlash / DDTree. Bit-exact with lucegen.model.quant.dequantize."""

from __future__ import annotations

from .base import KernelFamily

#: The GGML block types the kernels are instantiated for (the Q4_K_M mix: Q4_K, Q5_K, Q6_K; Q8_0).
QUANT_TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
#: Threads per block (tuning choice: 8 warps of 32, 4 waves of 64).
BLOCK_THREADS = 256

FAMILIES = (KernelFamily("quant_matvec", "kernels/quant_matvec.cu.j2",
                         params=lambda target, shape: {"instances": QUANT_TYPES, "block_threads": BLOCK_THREADS}),)

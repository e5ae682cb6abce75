"""Dequantisation, matrix-vector product and the embedding gather read straight from GGML blocks (Q8_0, Q4_K, Q5_K,
Q6_K): the quantised target path of DFlash / DDTree. Bit-exact with lucegen.model.quant.dequantize."""

from __future__ import annotations

from ..codegen import KernelFamily
from ..kernel_signature import KernelSignature, pointer, scalar

#: The GGML block types the kernels are instantiated for (the Q4_K_M mix: Q4_K, Q5_K, Q6_K; Q8_0).
QUANT_TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
#: Threads per block (tuning choice: 8 warps of 32, 4 waves of 64).
BLOCK_THREADS = 256

#: The kernels' parameters (``{type}``: the block type in lower case); ``{CT}`` is the compute type.
SIGNATURES = (
    KernelSignature("dequantize_{type}", (pointer("data", "unsigned char", const=True), pointer("out", "float"),
                                          scalar("n", "long long"))),
    KernelSignature("matvec_{type}", (pointer("W", "unsigned char", const=True), pointer("x", "float", const=True),
                                      pointer("y", "float"), scalar("N", "int"), scalar("K", "int"))),
    KernelSignature("embed_{type}", (
        pointer("tokens", "int", const=True), pointer("E", "unsigned char", const=True), scalar("H", "int"),
        pointer("norm_w", "float", const=True), pointer("x", "float"), pointer("xn", "{CT}"), pointer("ss", "float"),
        scalar("ss_stride", "int"), scalar("part_cols", "int"), scalar("totals", "int"))),
)

FAMILIES = (KernelFamily("quant_matvec", "kernels/quant_matvec.cu.j2",
                         params=lambda target: {"instances": QUANT_TYPES, "block_threads": BLOCK_THREADS},
                         signatures=SIGNATURES),)

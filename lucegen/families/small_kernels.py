"""RMSNorm, matrix-vector product and argmax: the small kernels every decode path uses."""

from __future__ import annotations

from ..codegen import KernelFamily
from ..kernel_signature import KernelSignature, pointer, scalar
from ..target import Target

#: Element types the small kernels are instantiated for (the two-byte float types the chip supports).
HALF_DTYPES = ("bf16", "fp16")
#: Threads per block for all three kernels (tuning choice: 8 warps of 32, 4 waves of 64).
BLOCK_THREADS = 256


def _params(target: Target) -> dict:
    return {"instances": [d for d in target.dtypes if d in HALF_DTYPES], "block_threads": BLOCK_THREADS}


#: The kernels' parameters; ``{T}`` is the instance's element type.
SIGNATURES = (
    KernelSignature("rmsnorm_{dtype}", (pointer("x", "{T}", const=True), pointer("w", "{T}", const=True),
                                        pointer("y", "{T}"), scalar("n", "int"), scalar("eps", "float"))),
    KernelSignature("matvec_{dtype}", (pointer("W", "{T}", const=True), pointer("x", "{T}", const=True),
                                       pointer("y", "float"), scalar("N", "int"), scalar("K", "int"))),
    KernelSignature("argmax_f32", (pointer("x", "float", const=True), scalar("n", "int"), pointer("out", "int"))),
)

FAMILIES = (KernelFamily("small_kernels", "kernels/small_kernels.cu.j2", params=_params, signatures=SIGNATURES),)

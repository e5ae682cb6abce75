"""Small-batch products straight from GGML blocks on the tensor cores (templates/kernels/quant_gemm.cu.j2): the
quantised target's projections for decode, verify and prompt, bit for bit independent of the row count."""

from __future__ import annotations

from ..codegen import KernelFamily

#: Block types in the kernels' type switch, in the order of QgSegment.type (the Q4_K_M mix: Q4_K, Q5_K, Q6_K; Q8_0).
GEMM_TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
#: Warps per block (tuning choice: 8 row-tile parts share one block's reduction and epilogue).
WARPS = 8
#: Groups of 8 tokens per block, at most (kernels quant_gemm_nt1 .. nt4: 8 .. 32 tokens).
NT_MAX = 4
#: The kernels: (name, groups of 8 tokens, one row only). quant_gemm_m1 is nt1 keeping token column 0 alone (M = 1,
#: the decode step): the same operations on that column, fewer on the columns it drops.
INSTANCES = (("m1", 1, True),) + tuple((f"nt{nt}", nt, False) for nt in range(1, NT_MAX + 1))
#: Matrices of one launch, at most (the segment table is a kernel parameter of this many entries).
MAX_SEGMENTS = 8

FAMILIES = (KernelFamily("quant_gemm", "kernels/quant_gemm.cu.j2",
                         params=lambda target: {"types": GEMM_TYPES, "warps": WARPS, "instances": INSTANCES,
                                                "max_segments": MAX_SEGMENTS}),)

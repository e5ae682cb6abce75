"""Small-batch products straight from GGML blocks on the tensor cores (templates/kernels/quant_gemm.cu.j2): the
quantised target's projections for decode, verify and prompt, bit for bit independent of the row count."""

from __future__ import annotations

from typing import NamedTuple

from ..errors import LucegenError
from ..kernel_signature import KernelSignature, pointer, scalar, struct
from ..model.quant import TYPES
from .base import KernelFamily

#: Block types in the kernels' type switch, in the order of QgSegment.type (the Q4_K_M mix: Q4_K, Q5_K, Q6_K; Q8_0).
GEMM_TYPES = ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
#: The types of 256-value blocks: a staged kernel's launch holds these alone (its rounds walk K in 256-value blocks).
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
#: Block types of the int8-activation kernels (quant_gemm_nt<N>q, [quant] int8_activations): the K-quants (4- and
#: 5-bit unsigned values with mins; Q6_K's q - 32 as signed bytes); a launch over a group of these alone takes them.
INT8_TYPES = ("Q4_K", "Q5_K", "Q6_K")
#: The int8 block types whose groups take kernels of their own (quant_gemm_nt<N>q6: every one of INT8_TYPES), the
#: others' (nt<N>q) leaving them out: Q6_K's path needs more registers (nt1q 142 -> 167, nt1q_r4 122 -> 127 with it),
#: and with one kernel for all a decode step's DeltaNet in-projections (nt1q_r4) took 0.4 us more each (H100).
INT8_OWN_KERNEL_TYPES = ("Q6_K",)
#: Warps per block (the kernels' layout: 8 row-tile parts share one block's reduction and epilogue).
WARPS = 8
#: Warps per block of the int8-activation kernels, and the resident blocks per compute unit of their launch bounds at
#: 1 to 3 token groups (4: two), which their names stand for (a chip's other residencies: :func:`q8_wave_time`): their
#: loops need fewer registers than the float ones, so more, smaller blocks keep more warps in flight.
Q8_WARPS = 4
Q8_BLOCKS_PER_CU = 3


def q8_wave_time(target) -> dict[int, float]:
    """The residencies the one-group int8 kernel comes at on ``target`` (nt1q_r<blocks per compute unit>: the same
    code, other launch bounds), each with a full wave's time relative to one at Q8_BLOCKS_PER_CU: a launch takes the
    residency whose waves of blocks finish first, waves(r) x time[r] (the one-token twins m1q.. alike). The chip's
    [tuning.quant_gemm] int8_wave_time."""
    return {Q8_BLOCKS_PER_CU: 1.0, **dict(target.tuning.quant_gemm.int8_wave_time)}


def int8_kernel(nt: int, blocks_per_cu: int = 0, own_types: bool = False, one_row: bool = False,
                prequantised: bool = False) -> str:
    """The name of the int8 kernel of ``nt`` token groups: nt<nt>q, nt<nt>q6 for groups holding INT8_OWN_KERNEL_TYPES
    (``own_types``), and for one group at other than Q8_BLOCKS_PER_CU resident blocks a suffix _r<blocks per CU>;
    m1q.. for one token (``one_row``: its MMAs' 8 columns hold 8 sub-blocks, not 8 tokens); a suffix p for the
    ``prequantised`` twins ([tuning.quant_gemm] prequantised_nt)."""
    residency = f"_r{blocks_per_cu}" if blocks_per_cu not in (0, Q8_BLOCKS_PER_CU) else ""
    return f"{'m1' if one_row else f'nt{nt}'}q{'6' if own_types else ''}{residency}{'p' if prequantised else ''}"


def block_warps(int8: bool) -> int:
    """Warps per block of the int8-activation kernels (``int8``) or of the others."""
    return Q8_WARPS if int8 else WARPS
#: Groups of 8 tokens per block, at most (kernels quant_gemm_nt1 .. nt4: 8 .. 32 tokens).
NT_MAX = 4
# Groups of 8 tokens whose kernels also come staged (quant_gemm_nt<N>s: the block copies each round's activations
# into shared memory once, a round ahead, for all its warps) are the chip's [tuning.quant_gemm] staged_nt.

#: Static shared memory of a staged kernel, at most (the parts' reduction and the epilogue's squares).
STAGED_STATIC_BYTES = 32 * 1024


def staged_smem_bytes(nt: int, parts: int, element_bytes: int = 2) -> int:
    """Dynamic shared memory of a staged launch: two rounds of 8 nt token rows of parts blocks of 256 values, each
    row padded by 16 values (the template's qg_stage_row)."""
    return 2 * 8 * nt * (256 * parts + 16) * element_bytes


# The one-row launches that stream their weights through per-warp rings (m1r) take groups of the chip's
# [tuning.quant_gemm] ring_types alone, through rings of its ring_stages slots.


# Groups of 8 tokens whose kernels also come as warpgroup MMAs where the chip has wgmma (quant_gemm_nt<N>w, for the
# chip's [tuning.quant_gemm] wgmma_nt): staged rounds whose activations wgmma reads from shared memory itself, one
# instruction per k16 step for all tokens, with weights streamed through shared memory too. Under 128 registers a
# thread, two blocks share a compute unit where the launch's shared memory allows, which the staged twins (255
# registers) cannot.

#: K parts of a wgmma launch, at most: a warpgroup's 4 warps hold 4 row tiles of one part, of a block's WARPS / parts.
WGMMA_MAX_PARTS = WARPS // 4


# A wgmma launch keeps [tuning.quant_gemm] wgmma_stages rounds in shared memory (the activations and every warp's
# tile-block of round i + stages - 1 are on their way while round i computes) and wgmma_buffers sub-blocks of
# products in flight per warp (2 overlaps one sub-block's products with the last one's scaling; 1 saves registers).

#: The largest K-quant tile-block (16 rows of Q6_K's 210-byte blocks): every warp's weight slot fits it.
WGMMA_MAX_SLOT_BYTES = 16 * max(TYPES[t][2] for t in K_QUANTS)


def wgmma_smem_bytes(target, nt: int, parts: int, slot_bytes: int = WGMMA_MAX_SLOT_BYTES) -> int:
    """Dynamic shared memory of a wgmma launch on ``target``: its wgmma_stages rounds of parts blocks of 256 values for
    8 nt tokens (2-byte), then every warp's wgmma_stages weight slots of ``slot_bytes`` (the launch's largest
    tile-block)."""
    return target.tuning.quant_gemm.wgmma_stages * (parts * 256 * 8 * nt * 2 + WARPS * slot_bytes)


# Groups of 8 tokens whose int8 kernels also come prequantised (nt<N>qp, the chip's [tuning.quant_gemm]
# prequantised_nt): quant_gemm_q8_rows quantises the launch's activations once, and every warp copies its
# tile-blocks' int8 bytes into a ring of Q8_RING_SLOTS slots in shared memory, a tile-block ahead, instead of loading
# and quantising its own fp16 ones.

#: Slots of a prequantised warp's ring (the template's QG_Q8_SLOTS): one computing, one filling.
Q8_RING_SLOTS = 2


def q8_smem_bytes(nt: int, K: int, prequantised: bool = False) -> int:
    """Dynamic shared memory of an int8-activation launch: its scales, da (4 bytes) and inv (2) per block of 256
    values of K and token of the block's 8 nt (the template's QgQ8Scales); ``prequantised``: da alone, then every
    warp's Q8_RING_SLOTS slots of a tile-block's int8 activations (256 bytes a token)."""
    if prequantised:
        return -(-K // 256 * 8 * nt * 4 // 16) * 16 + Q8_WARPS * Q8_RING_SLOTS * 256 * 8 * nt
    return K // 256 * 8 * nt * 6


def ring_smem_bytes(target, slot_bytes: int) -> int:
    """Dynamic shared memory of a ring launch on ``target`` whose largest tile-block is ``slot_bytes``: every warp's
    ring_stages slots."""
    return WARPS * target.tuning.quant_gemm.ring_stages * slot_bytes


def smem_fits(target, dynamic_bytes: int, static_bytes: int, blocks_per_cu: int) -> bool:
    """Whether ``blocks_per_cu`` blocks of a kernel with ``static_bytes`` of static and ``dynamic_bytes`` of dynamic
    shared memory are resident per compute unit (the driver keeps 1 KB per block)."""
    per_block = min(target.smem_per_block_optin, target.smem_per_cu // blocks_per_cu - 1024)
    return static_bytes + dynamic_bytes <= per_block


#: The mainloops a tile description picks (the template's QgMainloop, an include each under
#: templates/kernels/quant_gemm/): the activations read from global memory as the MMAs need them; staged into shared
#: memory by rounds; the weights streamed through per-warp rings; warpgroup MMAs over staged rounds; int8 activations
#: quantised as they load; int8 activations quantised beforehand by quant_gemm_q8_rows.
MAINLOOPS = ("float", "staged", "ring", "wgmma", "int8", "prequantised")
#: The epilogues (the template's QgRowsF32, QgSwiglu, QgResidual): every tile description comes with each, a kernel
#: quant_gemm_<tile>_<epilogue> (:func:`kernel_name`), the epilogue chosen when the kernel is compiled.
EPILOGUES = ("rows_f32", "swiglu", "residual")


class GemmKernel(NamedTuple):
    """A tile description of the family (CUTLASS's TileDescription), the mainloop of the kernels
    quant_gemm_<name>_<epilogue>: for groups of 8 tokens ``nt``; ``one_row`` keeps token column 0 alone; ``staged``
    copies activations into shared memory by rounds; ``ring`` streams weights through per-warp rings; ``wgmma``
    multiplies staged rounds by warpgroup MMAs; ``int8`` quantises the activations; ``blocks_per_cu`` is its launch
    bounds' resident blocks per compute unit. The template renders it as the traits struct QgTile_<name>."""
    name: str
    nt: int
    one_row: bool = False
    staged: bool = False
    ring: bool = False
    wgmma: bool = False
    int8: bool = False
    residency: int = 0  # resident blocks per compute unit where not the kernel kind's own (nt1q_r4)
    own_types: bool = False  # an int8 kernel whose type switch holds INT8_OWN_KERNEL_TYPES too (nt<N>q6)
    prequantised: bool = False  # an int8 kernel reading quant_gemm_q8_rows' bytes through per-warp rings (nt<N>qp)

    @property
    def warps(self) -> int:
        return block_warps(self.int8)

    @property
    def mainloop(self) -> str:
        """Its mainloop, one of MAINLOOPS."""
        if self.int8:
            return "prequantised" if self.prequantised else "int8"
        return "wgmma" if self.wgmma else "staged" if self.staged else "ring" if self.ring else "float"

    @property
    def blocks_per_cu(self) -> int:  # 128 registers a thread for one or two groups unstaged, and wgmma
        if self.residency:
            return self.residency
        if self.int8:
            return Q8_BLOCKS_PER_CU if self.nt <= 3 else 2
        return 2 if (self.nt <= 2 and not self.staged) or self.wgmma else 1


def kernel_name(tile: str, epilogue: str) -> str:
    """The kernel of tile description ``tile`` (GemmKernel.name) with ``epilogue`` (one of EPILOGUES)."""
    if epilogue not in EPILOGUES:
        raise LucegenError(f"quant_gemm epilogue {epilogue!r} is not one of {list(EPILOGUES)}")
    return f"quant_gemm_{tile}_{epilogue}"


def instances(target) -> tuple[GemmKernel, ...]:
    """The tile descriptions for ``target`` (the variants its [tuning.quant_gemm] lists), a kernel each per epilogue.
    m1 is nt1 keeping token column 0 alone (M = 1, the decode step): the same operations on that column, fewer on the
    columns it drops. A staged instance (staged_nt) exists where the chip has cp.async and room for the rounds of a
    launch of WARPS parts; m1r, m1 streaming its weights through per-warp rings of shared memory, where the chip has
    cp.async and ring_types names a block type; nt<N>w for wgmma_nt, warpgroup MMAs over staged rounds, where it has
    wgmma (sm_90a); nt<N>q, the int8-activation kernels, where :func:`has_int8`, with nt1q at the other residencies of
    :func:`q8_wave_time` (nt1q_r<blocks per compute unit>: the same code, other launch bounds), the one-token kernels
    m1q at every residency (``one_row``: an MMA's columns hold a tile-block's sub-blocks; nt1q's bits at M = 1), the
    prequantised nt<N>qp for prequantised_nt (nt<N>q's bits), and their twins nt<N>q6, m1q6.., nt<N>q6p for groups
    holding INT8_OWN_KERNEL_TYPES (:func:`int8_kernel`)."""
    plain = (GemmKernel("m1", 1, one_row=True),) + tuple(GemmKernel(f"nt{nt}", nt) for nt in range(1, NT_MAX + 1))
    room, tuning = target.smem_per_block_optin - STAGED_STATIC_BYTES, target.tuning.quant_gemm
    staged = tuple(GemmKernel(f"nt{nt}s", nt, staged=True) for nt in tuning.staged_nt
                   if target.features.cp_async and staged_smem_bytes(nt, WARPS) <= room)
    ring = (GemmKernel("m1r", 1, one_row=True, ring=True),) if target.features.cp_async and tuning.ring_types else ()
    wgmma = tuple(GemmKernel(f"nt{nt}w", nt, wgmma=True) for nt in tuning.wgmma_nt) if _has_wgmma(target) else ()
    int8 = ()
    for own in (False, True) if has_int8(target) else ():
        int8 += tuple(GemmKernel(int8_kernel(nt, 0, own), nt, int8=True, own_types=own) for nt in range(1, NT_MAX + 1))
        int8 += tuple(GemmKernel(int8_kernel(nt, 0, own, prequantised=True), nt, int8=True, own_types=own,
                                 prequantised=True) for nt in tuning.prequantised_nt)
        int8 += tuple(GemmKernel(int8_kernel(1, r, own), 1, int8=True, residency=r, own_types=own)
                      for r in q8_wave_time(target) if r != Q8_BLOCKS_PER_CU)
        int8 += tuple(GemmKernel(int8_kernel(1, r, own, one_row=True), 1, one_row=True, int8=True,
                                 residency=0 if r == Q8_BLOCKS_PER_CU else r, own_types=own)
                      for r in q8_wave_time(target))
    return plain + staged + ring + wgmma + int8


def has_int8(target) -> bool:
    """Whether ``target`` (as the quantised target renders it) has the int8-activation kernels: [quant]
    int8_activations, rendered in fp16 (the quantised target's variant; the descriptor's own compute type may be
    bf16)."""
    return target.quant is not None and target.quant.int8_activations and target.compute_dtype == "fp16"


def _has_wgmma(target) -> bool:
    return target.vendor == "nvidia" and target.features.wgmma and target.features.cp_async


#: Matrices of one launch, at most (the segment table is a kernel parameter of this many entries).
MAX_SEGMENTS = 8


def _params(target, shape: None) -> dict:
    """The template parameters: the block types, the warps and the kernels to emit for ``target``."""
    kernels = instances(target)
    return {"types": GEMM_TYPES, "k_quants": K_QUANTS, "warps": WARPS, "instances": kernels,
            "mainloops": MAINLOOPS, "epilogues": EPILOGUES,
            "staged_any": any(k.staged for k in kernels), "ring_any": any(k.ring for k in kernels),
            "ring_stages": target.tuning.quant_gemm.ring_stages, "ring_types": target.tuning.quant_gemm.ring_types,
            "max_segments": MAX_SEGMENTS, "wgmma_any": any(k.wgmma for k in kernels), "nt_max": NT_MAX,
            "wgmma_stages": target.tuning.quant_gemm.wgmma_stages,
            "wgmma_buffers": target.tuning.quant_gemm.wgmma_buffers,
            "int8_any": any(k.int8 for k in kernels), "int8_types": INT8_TYPES,
            "int8_own_kernel_types": INT8_OWN_KERNEL_TYPES}


def _arch(target) -> str | None:
    """wgmma is an sm_90a instruction (architecture-specific)."""
    return "sm_90a" if _has_wgmma(target) else None


#: Every kernel's first parameters: the launch's matrices (a QgSegmentTable by value, MAX_SEGMENTS entries, nseg
#: used), the activations A [M, K] (row stride lda), the K parts of a row tile, and A's magnitudes per 16 values
#: (int8 groups; unread by the others).
_OPERANDS = (struct("segs", "QgSegmentTable", 32 * MAX_SEGMENTS), scalar("nseg", "int"),
             pointer("A", "{T}", const=True), scalar("lda", "int"), scalar("M", "int"), scalar("K", "int"),
             scalar("parts", "int"), pointer("a_amax", "unsigned short", const=True))
#: A reader's RMSNorm row scales (the template's QgRowNorm): ss_parts partial sums of squares a row, ss_stride apart.
_ROW_NORM = (pointer("ss", "float", const=True), scalar("ss_parts", "int"), scalar("ss_stride", "int"),
             scalar("norm_dim", "int"), scalar("eps", "float"))
#: The prequantised kernels' (nt<N>qp) int8 activations and their da, from quant_gemm_q8_rows.
_PREQUANTISED = (pointer("aq", "unsigned char", const=True, when="prequantised"),
                 pointer("a_da", "float", const=True, when="prequantised"))
#: Each epilogue's parameters after the operands (the template's QgRowsF32, QgSwiglu, QgResidual).
EPILOGUE_PARAMS = {
    "rows_f32": _ROW_NORM + (pointer("out", "float"), scalar("ldo", "int"),
                             pointer("argmax_key", "unsigned long long")),
    "swiglu": _ROW_NORM + (pointer("out", "{T}"), scalar("ldo", "int"), pointer("amax_out", "unsigned short")),
    "residual": (pointer("x", "float"), scalar("ldx", "int"), pointer("norm_w", "float", const=True),
                 pointer("xn", "{T}"), pointer("ss_out", "float"), scalar("ss_stride", "int"),
                 pointer("amax_out", "unsigned short"), pointer("ss_count", "unsigned")),
}
SIGNATURES = tuple(KernelSignature(kernel_name("{tile}", e), _OPERANDS + EPILOGUE_PARAMS[e] + _PREQUANTISED)
                   for e in EPILOGUES) + (
    KernelSignature("quant_gemm_amax", (pointer("A", "{T}", const=True), scalar("lda", "int"), scalar("K", "int"),
                                        pointer("amax", "unsigned short"))),
    KernelSignature("quant_gemm_q8_rows", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("amax", "unsigned short", const=True),
        scalar("M", "int"), scalar("K", "int"), scalar("group", "int"), pointer("aq", "unsigned char"),
        pointer("a_da", "float"), pointer("ss", "float"), scalar("ss_parts", "int"), scalar("ss_stride", "int"),
        scalar("rows", "int"))),
)

FAMILIES = (KernelFamily("quant_gemm", "kernels/quant_gemm.cu.j2", params=_params, arch=_arch,
                         signatures=SIGNATURES),)

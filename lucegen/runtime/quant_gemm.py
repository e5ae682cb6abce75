"""Launcher of the quantised small-batch GEMM (``templates/kernels/quant_gemm.cu.j2``).

    qg = QuantGemm(device, target)
    W = qg.matrix([("Q5_K", qkv_bytes, rows, 0), ("Q4_K", z_bytes, rows_z, col_z), ...], K)   # repack + upload once
    qg.rows_f32(A, lda, W, None, M, W.rows, K, ss, ss_parts, ss_stride, out, ldo, stream=s)

The three epilogues have :class:`lucegen.runtime.prefill.gemm.GemmKernels`' signatures (``ldw`` is unused: the
matrix carries its layout), so the prefill / verify layer loop runs on quantised weights unchanged. A launch
covers one *matrix group* (a :class:`QuantMatrix`): segments of possibly different block types whose rows are
concatenated into the output columns (a DeltaNet in-projection is [qkv | z | a | b]); its kernel is
quant_gemm_<tile>_<epilogue>, the tile description picked per launch (:meth:`QuantGemm.kernel`), the epilogue by the
method called. The weights' layout is lucegen/runtime/quant_tiles.py's.

A residual whose rows the next launch reads may leave their RMSNorm totals to that launch (``totals_by_reader``): it
returns the hand-over, a :class:`RowTotals`, which the caller passes to the next launch (``totals=``); the module
keeps no state from one launch to the next.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .. import codegen
from ..errors import LucegenError
from ..families.quant_gemm import (EPILOGUE_PARAMS, EPILOGUES, GEMM_TYPES, INT8_OWN_KERNEL_TYPES, INT8_TYPES,
                                   K_QUANTS, MAX_SEGMENTS, NT_MAX, Q8_WARPS, WARPS, WGMMA_MAX_PARTS, block_warps,
                                   has_int8, instances, int8_kernel, kernel_name, q8_smem_bytes, q8_wave_time,
                                   ring_smem_bytes, smem_fits, staged_smem_bytes,
                                   wgmma_smem_bytes)
from ..model.quant import TYPES
from .device import Buffer, ByValue, address
from .quant_tiles import TILE_ROWS, tile_pack

#: QgSegment (the kernel's segment table entry; a launch passes MAX_SEGMENTS of them by value).
SEGMENT_DTYPE = np.dtype([("weights", "<u8"), ("type", "<i4"), ("tile0", "<i4"), ("rows", "<i4"), ("col0", "<i4"),
                          ("pad", "<i4", 2)])
#: Groups of rows of one launch, at most (a residual's counters: QuantGemm.ss_count).
MAX_ROW_GROUPS = 1024
#: Column blocks of one launch, at most: its grid's second dimension (CUDA's and HIP's limit).
MAX_COLUMN_BLOCKS = 65535
# The prequantised kernels (nt<N>qp) take launches of up to the chip's [tuning.quant_gemm] prequantised_rows rows (a
# multiple of 8 NT_MAX, the rows of its last group padded with zeros): their int8 activations go through a workspace
# of that many rows of the module's longest int8 K; larger launches (long prompts) keep nt<N>q, the same bits.

#: Each epilogue's pointer parameters, which take the caller's addresses (lucegen.runtime.device.address).
_EPILOGUE_POINTERS = {e: {p.name for p in params if p.kind == "pointer"} for e, params in EPILOGUE_PARAMS.items()}


def plan_parts(tiles: int, compute_units: int, most: int = WARPS, blocks_per_cu: int = 1) -> int:
    """Warps per row tile (each summing every parts-th block of K): the fewest that give every compute unit
    ``blocks_per_cu`` blocks' worth of warps. Fewer parts mean longer runs of K per warp (its first load's latency
    paid once) and, staged, more tiles sharing a block's activations; more fill the chip. Depends on the matrix
    alone, never on the row count (batch invariance). Measured on the 27B's shapes (tools/quant_gemm_bench.py
    1 9 23 --parts 1,2,4,8, H100, us at 1 / 23 rows): one block's worth for a matrix, so the residuals (320 tiles)
    take 4 parts, not 8 (down Q6_K 40.7 -> 36.1 / 102.7 -> 78.4, dn_out 13.4 -> 11.9 / 37.2 -> 36.3) and the
    in-projection (1030 tiles) 2, not 4 (23.1 -> 22.9 / 60.4 -> 50.3); two blocks' worth for a gate/up pair, counted
    by its tiles of one matrix (2 parts: 46.2 / 110.4, against 1 part: 56.1 / 123.2)."""
    parts = 1
    while parts < most and tiles * parts < blocks_per_cu * WARPS * compute_units:
        parts *= 2
    return parts


def row_groups(M: int) -> int:
    """Groups of rows of an M-row launch (its grid's first dimension): the fewest of at most NT_MAX groups of 8 tokens."""
    return math.ceil(math.ceil(M / 8) / NT_MAX)


def token_groups(M: int) -> int:
    """Groups of 8 tokens per block of an M-row launch (the kernel's NT): its rows spread evenly over its
    :func:`row_groups`, so that 33 rows run as 24 + 9 (nt3 twice), not 32 + 1 (nt4 twice, the second group's three
    empty token groups computed all the same)."""
    return math.ceil(math.ceil(M / 8) / row_groups(M))


# A launch's activations are staged when its blocks' row tiles times its groups of 8 tokens (how many times a block
# would read each activation row, in 8-token loads) reach the chip's [tuning.quant_gemm] stage_min_reuse.


class QuantMatrix:
    """A matrix group on the device: segments (type, rows) of K columns each, stacked into the output columns in
    order; its tile-blocks live in ``segment_buffers`` (those it allocated, and frees, in ``buffers``), its segment
    table (a kernel argument) in ``table``."""

    def __init__(self, device, segments, K: int, *, pair: bool = False, int8: bool = False):
        if not 1 <= len(segments) <= MAX_SEGMENTS:
            raise LucegenError(f"a quantised matrix group has 1 to {MAX_SEGMENTS} segments, got {len(segments)}")
        rows = [int(s[2]) for s in segments]
        if pair and (len(segments) != 2 or rows[0] != rows[1]):
            raise LucegenError("a gate/up pair needs two segments of equal rows")
        if int8 and not all(s[0] in INT8_TYPES for s in segments):
            raise LucegenError(f"int8 activations for a group of {', '.join(INT8_TYPES)} alone")
        #: Whether its launches take int8 activations at every row count (the kernels nt<N>q, and their layout of the
        #: tile-blocks): quantised per token and 256 values as they load (lucegen/model/quant.py q8_dequantized).
        self.int8 = int8
        self.buffers: list[Buffer] = []
        for type_name, raw, n, _ in segments:
            self.buffers.append(device.upload(tile_pack(raw, type_name, n, K, int8)))
        self._describe(K, pair, [s[0] for s in segments], rows, list(self.buffers))
        self.weight_bytes = sum(int(np.asarray(s[1]).size) for s in segments)

    def _describe(self, K: int, pair: bool, types: list[str], rows: list[int], buffers: list[Buffer]) -> None:
        self.K, self.pair, self.types, self.segment_rows, self.segment_buffers = K, pair, types, rows, buffers
        self.rows = rows[0] if pair else sum(rows)
        table = np.zeros(MAX_SEGMENTS, SEGMENT_DTYPE)
        col0 = np.cumsum([0] + rows[:-1])
        # The row tiles (blocks) in order of bytes per value, densest first (a pair's: gate, up): blocks start in tile
        # order, and the slower tiles would otherwise end its last wave late (the 27B's attention in-projection
        # [q | k | v], v in Q6_K: 25.5 us at one row with v last, 23.0 first; Q4_K alone 20.8). The output columns stay
        # in segment order.
        order = sorted(range(len(types)), key=lambda i: 0 if pair else -TYPES[types[i]][2] / TYPES[types[i]][1])
        tile0 = 0
        for i in order:
            table[i] = (buffers[i].ptr, GEMM_TYPES.index(types[i]), tile0, rows[i], 0 if pair else col0[i], (0, 0))
            tile0 += math.ceil(rows[i] / TILE_ROWS)
        self.tiles = tile0
        self.table = ByValue(table.tobytes())
        #: Bytes of the group's largest tile-block (a ring or wgmma slot; the template's qg_largest_tile_block).
        self.largest_tile_block = max(TILE_ROWS * TYPES[t][2] for t in types)
        # Whether every 4 consecutive row tiles from tile 0 (a wgmma warpgroup's; a pair's: 2 of gate, 2 of up) are of
        # one block type.
        if pair:
            self.warpgroup_types_uniform = types[0] == types[1]
        else:
            tile_types = [types[i] for i in order for _ in range(math.ceil(rows[i] / TILE_ROWS))]
            self.warpgroup_types_uniform = all(len(set(tile_types[i : i + 4])) == 1
                                               for i in range(0, len(tile_types), 4))

    def tail(self, first: int) -> "QuantMatrix":
        """Segments ``first``, ``first + 1``, ... as a group of their own over the same device memory (a view: it
        frees nothing), e.g. the k and v rows of a [q | k | v] projection."""
        if self.pair or not 0 < first < len(self.types):
            raise LucegenError(f"a view from segment {first} of a {len(self.types)}-segment group")
        view = QuantMatrix.__new__(QuantMatrix)
        view.buffers, view.weight_bytes, view.int8 = [], 0, self.int8
        view._describe(self.K, False, self.types[first:], self.segment_rows[first:], self.segment_buffers[first:])
        return view

    @property
    def count(self) -> int:
        return len(self.types)

    def free(self) -> None:
        for b in self.buffers:
            b.free()
        self.buffers = []


@dataclasses.dataclass(frozen=True)
class RowTotals:
    """The hand-over of a residual's rows' RMSNorm totals to the launch that reads those rows next
    (:meth:`QuantGemm.residual` with ``totals_by_reader``): the residual left ``parts`` partial sums of squares a row,
    ``ss_stride`` floats apart from ``ss_out``, for ``rows`` rows, and their totals go after them (:attr:`at`), made by
    the reader's quantiser or by a quantiser launch of the totals alone before the reader."""
    ss_out: int
    parts: int
    ss_stride: int
    rows: int

    @property
    def at(self) -> int:
        """Where the rows' totals go: after the parts."""
        return int(self.ss_out) + 4 * self.parts * self.ss_stride


@dataclasses.dataclass(frozen=True)
class Prequantised:
    """Where a prequantised launch (nt<N>qp) takes its int8 activations, for a producer that writes them itself
    (:meth:`QuantGemm.prequantised`): the bytes at ``aq``, their scales at ``da``, tokens in groups of ``group``
    (templates/common/q8_activations.cuh.j2, lg_q8_store_block's layout, the one quant_gemm_q8_rows writes)."""
    aq: int
    da: int
    group: int


class QuantGemm:
    """The quantised GEMM module on ``device`` with the three epilogues of the prefill contract; the row scale
    completes the RMSNorm over ``norm_dim`` columns with epsilon ``eps`` (the model's hidden size and rms_norm_eps).
    ``max_k``: the longest K of the int8 groups to come, so that the prequantised launches' workspace is one
    allocation, made here (else :meth:`matrix` grows it as the groups come)."""

    def __init__(self, device, target, norm_dim: int, eps: float, max_k: int = 0):
        self.device, self.target, self.norm_dim, self.eps = device, target, norm_dim, eps
        self.module = device.load(codegen.build(target, "quant_gemm"))
        #: The kernels by name (quant_gemm_<tile>_<epilogue>), the tile descriptions by name, and each tile's static
        #: shared memory: the most of its epilogues' (the residual's squares), so that a launch's tile, which
        #: :meth:`kernel` picks by the shared memory left, does not depend on its epilogue.
        self.functions, self.kernels, self.static_smem = {}, {}, {}
        for k in instances(target):
            self.kernels[k.name] = k
            fns = [self.module.function(kernel_name(k.name, e), programmatic=True) for e in EPILOGUES]
            self.functions.update({fn.name: fn for fn in fns})
            self.static_smem[k.name] = max(fn.attribute("SHARED_SIZE_BYTES") for fn in fns)
            for fn in fns:
                if k.staged:
                    fn.set_max_dynamic_smem(staged_smem_bytes(k.nt, WARPS))
                if k.wgmma:
                    fn.set_max_dynamic_smem(wgmma_smem_bytes(target, k.nt, WGMMA_MAX_PARTS))
                if k.ring or k.int8:
                    fn.set_max_dynamic_smem(target.smem_per_block_optin - self.static_smem[k.name])
        self.threads = WARPS * target.warp_size  # quant_gemm_amax's blocks
        # a residual launch's counter per group of rows (blockIdx.y): its last block adds the row tiles' parts (at
        # more than one row: row_totals); each launch leaves them at zero (launches on one stream, one after another)
        self.ss_count = device.alloc(4 * MAX_ROW_GROUPS)
        device.memset(self.ss_count)
        #: Whether the groups of INT8_TYPES alone that :meth:`matrix` builds take int8 activations (nt<N>q): a
        #: numerics of its own, fixed for a group's life (the Reference of the model must round their inputs alike:
        #: QuantMatrix.int8 says which groups); tests and tools/quant_gemm_bench.py turn it off to build groups for the
        #: float-activation kernels.
        self.int8 = has_int8(target)
        self.amax_fn = self.module.function("quant_gemm_amax") if self.int8 else None
        self.q8_rows_fn = self.module.function("quant_gemm_q8_rows", programmatic=True) if self.int8 else None
        # the prequantised launches' int8 activations and da (quant_gemm_q8_rows' layout: token group by token group)
        # for prequantised_rows rows of the longest K of this module's int8 groups: sized before any launch (max_k, or
        # as matrix() builds the groups; a graph captured later keeps its addresses), every size kept until free(),
        # and one launch's at a time, as ss_count (launches on one stream)
        self.q8_k, self.q8_buffers = 0, []
        self.use_prequantised = True  # nt<N>qp where they apply (tools/quant_gemm_bench.py --prequantised 0,1)
        self._reserve_q8(max_k)
        self.use_ring = True  # m1r where ring_types say so (tools/quant_gemm_bench.py --ring 0,1 compares)
        self.use_wgmma = True  # nt<N>w where they apply (tools/quant_gemm_bench.py --wgmma 0,1 compares)
        self.use_one_row = True  # m1q.. for one-row int8 launches (tools/quant_gemm_bench.py --one-row 0,1 compares)

    def free(self) -> None:
        """Free the module's own buffers (its matrices are the caller's)."""
        if self.ss_count is not None:
            self.ss_count.free()
            self.ss_count = None
        for b in self.q8_buffers:
            b.free()
        self.q8_buffers, self.q8_k = [], 0

    def matrix(self, segments, K: int, *, pair: bool = False, int8: bool = False) -> QuantMatrix:
        """Repack and upload ``segments`` [(type, raw GGML bytes, rows, unused)] of K columns each; ``int8``: on int8
        activations if the group holds INT8_TYPES alone and the module takes them (:attr:`int8`), its launches then
        needing their input's magnitudes (``a_amax``)."""
        int8 = int8 and self.int8 and all(s[0] in INT8_TYPES for s in segments)
        if int8:
            self._reserve_q8(K)
        return QuantMatrix(self.device, segments, K, pair=pair, int8=int8)

    def _reserve_q8(self, K: int) -> None:
        """The prequantised launches' workspace for K columns: int8 activations and da of prequantised_rows rows."""
        if self.int8 and K > self.q8_k:
            self.q8_k, rows = K, self.target.tuning.quant_gemm.prequantised_rows
            self.q8_buffers.append(self.device.alloc(rows * K))  # aq
            self.q8_buffers.append(self.device.alloc(rows * K // 256 * 4))  # da

    @staticmethod
    def warps(W: QuantMatrix) -> int:
        """Warps per block of every launch over ``W``."""
        return block_warps(W.int8)

    def parts(self, W: QuantMatrix) -> int:
        """K parts of every launch over ``W``: planned (:func:`plan_parts`) for the float kernels; all of a block's
        Q8_WARPS for the int8 ones, a tile a block (a pair: a tile of each), measured best for every 27B shape
        (tools/quant_gemm_bench.py 1 9 23 --parts 1,2,4 --int8 1 --int8-kernels, H100, us at 1 / 23 rows: the
        in-projection 28.0 -> 24.6 / 54.4 -> 47.0 at 4 parts against 2; down Q4_K 35.3 -> 22.3 / 85.2 -> 56.1)."""
        if W.int8:
            return Q8_WARPS // 2 if W.pair else Q8_WARPS
        if W.pair:
            return plan_parts(W.tiles // 2, self.target.compute_units, most=WARPS // 2, blocks_per_cu=2)
        return plan_parts(W.tiles, self.target.compute_units)

    def block_columns(self, W: QuantMatrix) -> int:
        """Output columns per block of a launch over ``W`` (a pair: of each matrix): its warps / parts row tiles of
        TILE_ROWS rows (the parts of a tile's K are its warps)."""
        return self.warps(W) // self.parts(W) * TILE_ROWS // (2 if W.pair else 1)

    def grid_width(self, W: QuantMatrix) -> int:
        """Blocks across the output columns of a launch over ``W``."""
        return -(-W.tiles * TILE_ROWS // (2 if W.pair else 1) // self.block_columns(W))

    @staticmethod
    def ss_parts(W: QuantMatrix) -> int:
        """The RMSNorm partial sums per row a residual launch over ``W`` leaves, what its readers are given: one per
        row tile. A reader of one row adds them itself; at more rows the launch's last block of each group of rows
        has added them already and its readers take that total (:meth:`row_totals`)."""
        return W.tiles

    @staticmethod
    def ss_scratch_parts(W: QuantMatrix) -> int:
        """Parts of ``ss_out`` (rows of ``ss_stride``) a residual launch over ``W`` writes: one per row tile, then the
        rows' totals (:meth:`row_totals`)."""
        return W.tiles + 1

    @staticmethod
    def row_totals(M: int) -> bool:
        """Whether the producers of an M-row pass's RMSNorm partial sums (the residuals, the embedding) leave each
        row's total after its ``ss_parts`` parts, for the readers to take alone: at more than one row. At one row
        the readers add the parts themselves, in the same order (the template's lg_parts_sums: the same bits), which
        spares the residual its last block's tail on the decode step's critical path (~0.4 ms a 27B step, H100),
        and costs a reader of M rows M times the parts."""
        return M > 1

    def quantiser_totals(self, M: int) -> bool:
        """Whether an M-row reader of this module's int8 groups quantises its activations in a launch of its own
        (quant_gemm_q8_rows: the prequantised kernels' row counts), which then also totals the RMSNorm parts a residual
        left for it (:meth:`residual`'s ``totals_by_reader``): at more than one row (:meth:`row_totals`)."""
        return self.int8 and self.row_totals(M) and self._prequantises(M)

    def _prequantises(self, M: int) -> bool:
        """Whether M-row launches over this module's int8 groups take the prequantised kernels (nt<N>qp) where the
        workspace and shared memory let them (:meth:`kernel`)."""
        tuning = self.target.tuning.quant_gemm
        return self.use_prequantised and token_groups(M) in tuning.prequantised_nt and M <= tuning.prequantised_rows

    def prequantised(self, W: QuantMatrix, M: int, A: int, lda: int) -> Prequantised | None:
        """Where an M-row launch over ``W`` reading A (row stride lda) takes its int8 activations, if it runs a
        prequantised kernel (:meth:`kernel`): a producer of A that holds whole 256-value blocks may write them there
        itself, with the same bytes quant_gemm_q8_rows would make from A and its magnitudes, and pass the launch
        ``a_prequantised``; None where the launch quantises otherwise."""
        if not isinstance(W, QuantMatrix) or not W.int8:
            return None
        kernel = self.kernels[self.kernel(W, M, A, lda)[0]]
        if not kernel.prequantised:
            return None
        return Prequantised(self.q8_buffers[-2].ptr, self.q8_buffers[-1].ptr, 8 * kernel.nt)

    def ss_for_readers(self, ss: int, parts: int, stride: int, M: int) -> tuple[int, int]:
        """(ss, ss_parts) for the readers of M rows of partial sums this module's residuals (or its decoder's
        embedding) left over those M rows: their totals, one part, where :meth:`row_totals`; else the ``parts``.
        (Readers add whatever parts they are given in one order, so the parts alone are always right.)"""
        return (int(ss) + 4 * parts * stride, 1) if self.row_totals(M) else (ss, parts)

    @staticmethod
    def residual_workspace_bytes(M: int, N: int) -> int:
        """No split-K: the K parts meet inside a block (GemmKernels' interface)."""
        return 0

    # ---- launches ------------------------------------------------------------------------------------------------
    def _launch(self, epilogue: str, A: int, lda: int, W: QuantMatrix, M: int, K: int, *, a_amax=0, stream=None,
                totals: RowTotals | None = None, reads_ss: int = 0, a_prequantised=False, **epilogue_args) -> None:
        """Launch quant_gemm_<tile>_<epilogue> over ``W`` for M rows of A, the epilogue's parameters in
        ``epilogue_args`` (the family's EPILOGUE_PARAMS). ``totals``: a residual's hand-over (:class:`RowTotals`) this
        launch makes first, in its own quantiser where it has one and reads those rows (``reads_ss``: the ss it reads),
        else in a quantiser launch of the totals alone before it."""
        where = f"quant_gemm {epilogue}"
        if not isinstance(W, QuantMatrix):
            raise LucegenError(f"{where}: W must be a QuantMatrix, got {type(W).__name__}")
        if M < 1 or K != W.K:
            raise LucegenError(f"{where}: M={M} K={K} for a matrix of K={W.K}")
        if lda % 4 or lda < K or int(A) % 8:
            raise LucegenError(f"{where}: A needs 8-byte alignment and lda >= K a multiple of 4, got lda={lda}")
        if W.int8 and not a_amax:
            raise LucegenError(f"{where}: a group of int8 activations needs its input's magnitudes per 16 "
                               "values (a_amax: QuantGemm.amax, or the epilogue that wrote the input)")
        if W.int8 and (lda % 128 or int(A) % 16 or int(a_amax) % 16):
            raise LucegenError(f"{where}: int8 activations are read in 16-byte pieces, their magnitudes 16 "
                               f"at a time: A and a_amax 16-byte aligned, lda a multiple of 128, got lda={lda}")
        if a_amax and lda % 16:
            raise LucegenError(f"{where}: magnitudes per 16 values need row strides of whole 16s, got lda={lda}")
        if totals is not None and not isinstance(totals, RowTotals):
            raise LucegenError(f"{where}: totals must be a residual's RowTotals, got {type(totals).__name__}")
        parts = self.parts(W)
        grid = (row_groups(M), self.grid_width(W))  # a column block's row groups side by side (the template)
        if grid[0] > MAX_ROW_GROUPS:
            raise LucegenError(f"{where}: M={M} is over {MAX_ROW_GROUPS} groups of {8 * NT_MAX} rows")
        if grid[1] > MAX_COLUMN_BLOCKS:
            raise LucegenError(f"{where}: {grid[1]} column blocks over the grid's {MAX_COLUMN_BLOCKS} (a "
                               f"matrix of {W.tiles} row tiles)")
        name, smem = self.kernel(W, M, A, lda)
        tile = self.kernels[name]
        if a_prequantised and not tile.prequantised:
            raise LucegenError(f"{where}: int8 activations written for a prequantised launch, but this one "
                               f"runs {kernel_name(name, epilogue)} (QuantGemm.prequantised says where they apply)")
        if totals and not (tile.prequantised and not a_prequantised and int(reads_ss) == totals.at):
            self._q8_rows(stream, totals)  # a reader without a quantiser of its own: the totals alone
            totals = None
        operands = {"segs": W.table, "nseg": W.count, "A": address(A), "lda": lda, "M": M, "K": K, "parts": parts,
                    "a_amax": address(a_amax)}
        if tile.prequantised:  # the launch's int8 activations, once (and the totals due, beside them)
            operands["aq"], operands["a_da"] = address(self.q8_buffers[-2].ptr), address(self.q8_buffers[-1].ptr)
            if not a_prequantised:  # else their producer wrote them
                self._q8_rows(stream, totals, A=A, lda=lda, a_amax=a_amax, M=M, K=K, group=8 * tile.nt,
                              aq=self.q8_buffers[-2].ptr, a_da=self.q8_buffers[-1].ptr)
        self.functions[kernel_name(name, epilogue)].launch(
            grid, self.warps(W) * self.target.warp_size, smem=smem, stream=stream, **operands,
            **{k: address(v) if k in _EPILOGUE_POINTERS[epilogue] else v for k, v in epilogue_args.items()})

    def _q8_rows(self, stream, totals: RowTotals | None, *, A=0, lda=0, a_amax=0, M=0, K=0, group=8, aq=0,
                 a_da=0) -> None:
        """quant_gemm_q8_rows: M rows of A (K columns; none at K = 0) as int8 bytes in the launch's groups of ``group``
        tokens, and, with ``totals``, that residual's rows' RMSNorm totals."""
        rows = totals.rows if totals else 0
        y = -(-max(M, rows) // group) * group // 8  # blocks of 8 tokens
        self.q8_rows_fn.launch(
            (K // 256 + (1 if totals else 0), y), self.threads, stream=stream, A=address(A), lda=lda,
            amax=address(a_amax), M=M, K=K, group=group, aq=address(aq), a_da=address(a_da),
            ss=address(totals.ss_out if totals else 0), ss_parts=totals.parts if totals else 0,
            ss_stride=totals.ss_stride if totals else 0, rows=rows)

    def kernel(self, W: QuantMatrix, M: int, A: int, lda: int) -> tuple[str, int]:
        """The kernel of an M-row launch over ``W`` (name after ``quant_gemm_``) and its dynamic shared memory:
        nt<groups of 8 tokens>q (q6 where it holds INT8_OWN_KERNEL_TYPES) for a group that takes int8 activations
        (:attr:`QuantMatrix.int8`), or its prequantised twin nt<N>qp (the same bits, quant_gemm_q8_rows launched
        first) at 9 to prequantised_rows rows where the module's workspace and shared memory take it, m1q (m1q6) at
        one row; otherwise m1 for one row, else nt<groups of 8 tokens>, or its
        staged twin (the same bits) where one exists for this target, the group holds 256-value block types alone, the
        activation rows can be copied in 16-byte pieces, and a staged row would otherwise be read often enough
        (stage_min_reuse); before that, its warpgroup-MMA twin nt<N>w (the same bits) where the chip has one, the group
        holds K-quants alone in one type per 4 row tiles, takes at most WGMMA_MAX_PARTS parts, and its rounds and weight
        slots leave two blocks per compute unit (with one, the staged twin is faster:
        ``tools/quant_gemm_bench.py --wgmma 0,1``); at one row, m1r (the same bits) for a group of ring_types alone
        where its rings leave the kernel's resident blocks per compute unit."""
        nt = token_groups(M)
        if W.int8:
            own = any(t in INT8_OWN_KERNEL_TYPES for t in W.types)
            if self._prequantises(M) and W.K <= self.q8_k:
                name, smem = int8_kernel(nt, 0, own, prequantised=True), q8_smem_bytes(nt, W.K, prequantised=True)
                if smem_fits(self.target, smem, self.static_smem[name], self.kernels[name].blocks_per_cu):
                    return name, smem
            smem = q8_smem_bytes(nt, W.K)
            name = int8_kernel(nt, 0, own) if nt > 1 else self._one_group_residency(W, M, smem, own,
                                                                                     M == 1 and self.use_one_row)
            if not smem_fits(self.target, smem, self.static_smem[name], 1):
                raise LucegenError(f"quant_gemm_{name}: the int8 scales of K={W.K} ({smem} bytes) exceed shared "
                                   "memory")
            return name, smem
        name, parts = ("m1" if M == 1 else f"nt{nt}"), self.parts(W)
        k_quants = all(t in K_QUANTS for t in W.types)
        wgmma = f"{name}w"
        if (wgmma in self.kernels and self.use_wgmma and parts <= WGMMA_MAX_PARTS and k_quants
                and W.warpgroup_types_uniform and int(A) % 4 == 0 and lda % 2 == 0):
            smem = wgmma_smem_bytes(self.target, nt, parts, W.largest_tile_block)
            if smem_fits(self.target, smem, self.static_smem[wgmma], self.kernels[wgmma].blocks_per_cu):
                return wgmma, smem
        if (f"{name}s" in self.kernels and k_quants and int(A) % 16 == 0
                and lda % 8 == 0 and WARPS // parts * nt >= self.target.tuning.quant_gemm.stage_min_reuse):
            return f"{name}s", staged_smem_bytes(nt, parts)
        ring = f"{name}r"
        ring_types = self.target.tuning.quant_gemm.ring_types
        if ring in self.kernels and self.use_ring and all(t in ring_types for t in W.types):
            smem = ring_smem_bytes(self.target, W.largest_tile_block)
            if smem_fits(self.target, smem, self.static_smem[ring], self.kernels[ring].blocks_per_cu):
                return ring, smem
        return name, 0

    def _one_group_residency(self, W: QuantMatrix, M: int, smem: int, own: bool, one_row: bool = False) -> str:
        """nt1q (``own``: nt1q6; ``one_row``: m1q, m1q6, the same bits at M = 1), or its twin of another residency
        (nt1q_r<blocks per compute unit>, the same bits), whichever runs the launch's blocks in the least time by whole
        waves (:func:`q8_wave_time`), where its shared memory lets it."""
        blocks = self.grid_width(W) * math.ceil(M / 8)
        best, name = None, int8_kernel(1, 0, own, one_row)
        for r, wave in sorted(q8_wave_time(self.target).items()):
            kernel = int8_kernel(1, r, own, one_row)
            if kernel not in self.kernels or not smem_fits(self.target, smem, self.static_smem[kernel], r):
                continue
            time = math.ceil(blocks / (r * self.target.compute_units)) * wave
            if best is None or time < best:
                best, name = time, kernel
        return name

    def amax(self, A: int, lda: int, M: int, K: int, out: int, stream=None) -> None:
        """out u16 [M, lda / 16]: the largest |A[m, k]| of each 16 values as compute-dtype bits (the template's QgAmax),
        for launches over int8-activation groups (``a_amax``) whose input no epilogue wrote them for."""
        if self.amax_fn is None:
            raise LucegenError(f"quant_gemm_amax: {self.target.name} renders no int8-activation kernels")
        if lda % 16 or K % 16 or lda < K or int(A) % 16:
            raise LucegenError(f"quant_gemm_amax: 16-value pieces: lda={lda} and K={K} multiples of 16, A aligned")
        self.amax_fn.launch((-(-K // 16 // self.threads), M), self.threads, stream=stream, A=address(A), lda=lda, K=K,
                            amax=address(out))

    def rows_f32(self, A: int, lda: int, W: QuantMatrix, ldw, M: int, N: int, K: int, ss: int, ss_parts: int,
                 ss_stride: int, out: int, ldo: int, stream=None, argmax_key: int = 0, a_amax: int = 0,
                 totals: RowTotals | None = None) -> None:
        """out f32 [m, n] = r[m] * sum_k A[m, k] W[n, k] over the group's rows; ``argmax_key`` (M = 1) as GemmKernels.
        ``a_amax``: A's magnitudes per 16 values (:meth:`amax`, or an epilogue's ``amax_out``), which int8-activation
        groups need (the others ignore it). ``totals``: the hand-over of the residual that wrote these rows
        (:meth:`residual`), made before or while this launch reads them."""
        if N != W.rows or ldo < N:
            raise LucegenError(f"quant_gemm rows_f32: N={N} ldo={ldo} for a group of {W.rows} rows")
        if argmax_key and M != 1:
            raise LucegenError(f"quant_gemm rows_f32: the folded argmax needs M = 1, got M={M}")
        self._check_reader("rows_f32", M, ss, ss_parts, ss_stride)
        self._launch("rows_f32", A, lda, W, M, K, a_amax=a_amax, stream=stream, totals=totals, reads_ss=ss, ss=ss,
                     ss_parts=ss_parts, ss_stride=ss_stride, norm_dim=self.norm_dim, eps=self.eps, out=out, ldo=ldo,
                     argmax_key=argmax_key)

    def swiglu(self, A: int, lda: int, W: QuantMatrix, ldw, M: int, N: int, K: int, ss: int, ss_parts: int,
               ss_stride: int, out: int, ldo: int, stream=None, a_amax: int = 0, amax_out: int = 0,
               totals: RowTotals | None = None) -> None:
        """out [m, i] = silu(r gate_i . A[m]) * (r up_i . A[m]) for a gate/up pair (N = 2 I, as GemmKernels);
        ``amax_out``: out's magnitudes per 16 values too (as :meth:`amax`; int8-activation modules alone). ``totals``:
        as :meth:`rows_f32`'s."""
        if not W.pair or N != 2 * W.rows or ldo < W.rows:
            raise LucegenError(f"quant_gemm swiglu: needs a gate/up pair of N/2 = {N // 2} rows")
        self._check_reader("swiglu", M, ss, ss_parts, ss_stride)
        self._check_amax_out("swiglu", amax_out, ldo)
        self._launch("swiglu", A, lda, W, M, K, a_amax=a_amax, stream=stream, totals=totals, reads_ss=ss, ss=ss,
                     ss_parts=ss_parts, ss_stride=ss_stride, norm_dim=self.norm_dim, eps=self.eps, out=out, ldo=ldo,
                     amax_out=amax_out)

    def residual(self, A: int, lda: int, W: QuantMatrix, ldw, M: int, N: int, K: int, x: int, ldx: int, norm_w: int,
                 xn: int, ldxn: int, ss_out: int, ss_stride: int, stream=None, workspace: int = 0,
                 workspace_bytes: int = 0, a_amax: int = 0, amax_out: int = 0, totals_by_reader: bool = False,
                 a_prequantised: bool = False, totals: RowTotals | None = None) -> RowTotals | None:
        """x f32 += acc; xn = x (1 + norm_w); ss_out: the rows' sums of squares per row tile (:meth:`ss_parts`) and,
        at more than one row, their totals after them (:meth:`ss_scratch_parts` rows of ss_stride; no split-K);
        ``amax_out``: xn's magnitudes per 16 values too (as :meth:`amax`; int8-activation modules alone).
        ``totals_by_reader``: the next launch of this module reads these rows (``ss_for_readers``), so where its
        quantiser runs (:meth:`quantiser_totals`) the totals are made there, beside the quantising, not by this
        launch's last block after every other (the same sums: lg_parts_sums' one order): then this returns the
        hand-over (:class:`RowTotals`) for the caller to pass to that launch (``totals=``), else None.
        ``a_prequantised``: A's producer wrote the launch's int8 activations (:meth:`prequantised`), so A itself and
        a_amax are not read. ``totals``: the hand-over of the residual before this one, made first."""
        if W.count != 1 or N != W.rows or ldx != ldxn or ldx < N or ss_stride < M:
            raise LucegenError(f"quant_gemm residual: one matrix of N={N} rows, ldx == ldxn >= N, ss_stride >= M")
        self._check_amax_out("residual", amax_out, ldx)
        defer = totals_by_reader and self.quantiser_totals(M)
        tail = ss_out and not defer and self.row_totals(M)  # the launch's last block of each row group totals them
        self._launch("residual", A, lda, W, M, K, a_amax=a_amax, stream=stream, totals=totals,
                     a_prequantised=a_prequantised, x=x, ldx=ldx, norm_w=norm_w, xn=xn, ss_out=ss_out,
                     ss_stride=ss_stride, amax_out=amax_out, ss_count=self.ss_count.ptr if tail else 0)
        return RowTotals(ss_out, W.tiles, ss_stride, M) if defer else None

    def _check_reader(self, epilogue: str, M: int, ss: int, ss_parts: int, ss_stride: int) -> None:
        if ss and (ss_parts < 1 or ss_stride < M):
            raise LucegenError(f"quant_gemm {epilogue}: ss needs ss_parts >= 1 and ss_stride >= M")

    def _check_amax_out(self, epilogue: str, amax_out: int, ldo: int) -> None:
        if amax_out and self.amax_fn is None:
            raise LucegenError(f"quant_gemm {epilogue}: amax_out needs a module with int8-activation kernels")
        if amax_out and ldo % 16:
            raise LucegenError(f"quant_gemm {epilogue}: magnitudes per 16 values need row strides of whole 16s, got "
                               f"ldo={ldo}")


"""Launcher for the prefill GEMM module (``templates/prefill/gemm.cu.j2``, module ``prefill_gemm``).

    gemm = GemmKernels(dev, target, pf)
    gemm.rows_f32(A, lda, W, ldw, M, N, K, ss, ss_parts, ss_stride, out, ldo, stream=s)
    gemm.swiglu(A, lda, W, ldw, M, N, K, ss, ss_parts, ss_stride, out, ldo, stream=s)
    gemm.residual(A, lda, W, ldw, M, N, K, x, ldx, norm_w, xn, ldxn, ss_out, ss_stride, stream=s)

Device addresses are ints (0 for "no ss": r = 1). Each call validates its arguments on the host and queues one
kernel (no allocation, no sync: capturable in a CUDA graph). The module holds each epilogue at block heights
tile_m, tile_m/2, tile_m/4 (``gemm_<epilogue>_m<rows>``); :func:`pick_block_rows` chooses the height that fills
the chip in the fewest block-row-weighted waves. ``rows_f32`` with M <= GEMV_MAX_M uses ``gemv_rows_f32`` (a
streaming read of W: the lm_head row).
"""

from __future__ import annotations

import math

from ... import codegen
from ...compile import compile_source
from ...errors import LucegenError
from ..device import address

TEMPLATE = "prefill/gemm.cu.j2"
MODULE = "prefill_gemm"
GEMV_MAX_M = 4  # templates/prefill/gemm.cu.j2: GEMV_MAX_M
GEMV_WARPS = 8  # templates/prefill/gemm.cu.j2: GEMV_WARPS
EPILOGUES = ("rows_f32", "swiglu", "residual")


def uses_wgmma(pf: dict) -> bool:
    """The Hopper warpgroup-MMA mainloop (compiled for sm_90a)."""
    return pf["gemm_instruction"].startswith("wgmma")


def uses_tma(pf: dict, target) -> bool:
    """The wgmma mainloop fed by TMA tile loads from a producer warp (chips with ``features.tma``): the kernels take
    two tensor maps (A, W) as trailing arguments and run GEMM_THREADS + 32 threads."""
    return uses_wgmma(pf) and bool(target.features.tma)


def crews(pf: dict, target) -> int:
    """Consumer crews of a block, each computing its own tiles (template GEMM_CREWS): 2 for the pingpong schedule of
    the TMA mainloop (one per warpgroup), else 1."""
    return 2 if uses_tma(pf, target) and pf["schedule"] == "pingpong" else 1


def warp_grid(warps: int, instruction: str = "mma_m16n8k16", crew_count: int = 1) -> tuple[int, int]:
    """(warps along M, warps along N) of one crew's tile: the template's WARPS_M x WARPS_N (wgmma: every warp owns 16
    rows of all tile_n columns)."""
    if instruction.startswith("wgmma"):
        return warps // crew_count, 1
    wm = 2 if warps >= 4 and warps % 2 == 0 else 1
    return wm, warps // wm


def pipeline_stages(pf: dict, target) -> int:
    """Shared-memory stages the mainloop uses: the descriptor's with cp.async, else a register-staged double buffer."""
    pipelined = pf["gemm_instruction"] == "mma_m16n8k16" or uses_wgmma(pf)
    return pf["stages"] if (target.features.cp_async and pipelined) else 2


def block_heights(pf: dict, target) -> tuple[int, ...]:
    """The tile heights the module is built with (tile_m and its halvings down to 16 rows per M-warp)."""
    wm, _ = warp_grid(pf["warps"], pf["gemm_instruction"], crews(pf, target))
    out = []
    for div in (1, 2, 4):
        bm = pf["tile_m"] // div
        if pf["tile_m"] % div == 0 and bm >= 16 * wm and bm % (16 * wm) == 0:
            out.append(bm)
    return tuple(out)


def smem_bytes(pf: dict, target, block_rows: int) -> int:
    """Dynamic shared memory of one block: stages x (A tile + W tile) x tile_k x 2 bytes."""
    tiles = pipeline_stages(pf, target) * (block_rows + pf["tile_n"]) * pf["tile_k"] * 2
    return tiles + 1024 if uses_wgmma(pf) else tiles  # wgmma: room to align the tiles to 1024 bytes (swizzle)


def pick_block_rows(M: int, N: int, tile_n: int, units: int, blocks_per_unit: dict[int, int]) -> int:
    """The block height with the least estimated time: waves (blocks / resident blocks) times a block's work, which
    is taken as (rows + tile_n / 2): a shorter tile still streams its whole W tile."""
    best, best_cost = None, None
    for bm, per_unit in sorted(blocks_per_unit.items(), reverse=True):
        blocks = math.ceil(M / bm) * math.ceil(N / tile_n)
        waves = math.ceil(blocks / (units * max(1, per_unit)))
        cost = waves * (bm + tile_n / 2)
        if best_cost is None or cost < best_cost:
            best, best_cost = bm, cost
    return best


#: Split-K factors the residual GEMM may use (then gemm_residual_reduce finishes the epilogue).
SPLITS = (1, 2, 4)
REDUCE_MAX_N = 8192  # templates/prefill/gemm.cu.j2: GEMM_REDUCE_MAX_N
REDUCE_THREADS = 256  # templates/prefill/gemm.cu.j2: GEMM_REDUCE_THREADS


def plan_residual(M: int, N: int, K: int, pf: dict, target, heights, crew_count: int = 1) -> tuple[int, int]:
    """(block height, split-K) for the residual GEMM with the least estimated time. A residual GEMM has few
    column tiles (N = hidden size), so at prompt lengths of a few hundred tokens its blocks cover only part of the
    chip or spill into a second wave; splitting K fills it, at the cost of writing and re-reading the partial sums.
    Estimate: blocks are spread one per SM first, so a launch takes ceil(blocks / SMs) block times; a block time is
    its FLOPs at ~30% of the chip's per-SM matrix rate (what the mma.sync mainloop reaches); with ``crew_count``
    crews per block (pingpong) an SM holds that many tiles at a time, each at that share of the rate; the reduce pass
    streams (split + 2) x M x N floats at ~70% of the descriptor's bandwidth plus a launch."""
    tile_n, tile_k, units = pf["tile_n"], pf["tile_k"], target.compute_units
    per_sm_flops_us = target.matmul.peak_tflops * 1e6 / units * 0.3
    best, best_us = (heights[0], 1), None
    for bm in heights:
        blocks = math.ceil(M / bm) * math.ceil(N / tile_n)
        for split in SPLITS:
            if K % (split * tile_k) or (split > 1 and N > REDUCE_MAX_N):
                continue
            us = (math.ceil(blocks * split / (units * crew_count)) * 2.0 * bm * tile_n * (K // split)
                  / (per_sm_flops_us / crew_count))
            if split > 1:
                us += 3.0 + (split + 2) * M * N * 4 / (target.mem_bandwidth_gbs * 1e3 * 0.7)
            if best_us is None or us < best_us:
                best, best_us = (bm, split), us
    return best


def argmax_from_key(key: int) -> int:
    """The index in gemv_rows_f32's argmax key (templates/common/prelude.cuh.j2 lg_argmax_key: low word = ~index)."""
    return (~int(key)) & 0xFFFFFFFF


def instance_params(pf: dict, epilogue: str) -> dict:
    """The template parameters of the GEMM instance an epilogue runs on: ``pf`` with that epilogue's own tiling from
    the descriptor (``[matmul.<epilogue>]``, in ``pf["gemm_tilings"]``) in place of ``[matmul]``'s."""
    return dict(pf, **pf["gemm_tilings"].get(epilogue, {}))


def module_name(pf: dict, epilogue: str) -> str:
    """``prefill_gemm`` for the [matmul] tiling, ``prefill_gemm_<epilogue>`` for an epilogue's own."""
    return f"{MODULE}_{epilogue}" if epilogue in pf["gemm_tilings"] else MODULE


class GemmInstance:
    """One compiled instance of the GEMM template: a tiling (tiles, warps, stages, schedule) with every epilogue's
    kernel at every block height, the split-K reduce and the GEMV."""

    def __init__(self, device, target, pf: dict, name: str = MODULE):
        wm, wn = warp_grid(pf["warps"], pf["gemm_instruction"], crews(pf, target))
        if pf["tile_n"] % (16 * wn) or pf["tile_k"] % 16 or not block_heights(pf, target):
            raise LucegenError(f"{target.name}: [matmul] tiles {pf['tile_m']}x{pf['tile_n']}x{pf['tile_k']} with "
                               f"{pf['warps']} warps do not fit the GEMM template (tile_n a multiple of "
                               f"{16 * wn}, tile_k of 16, tile_m of {16 * wm})")
        if target.warp_size != 32:
            raise LucegenError(f"{target.name}: the prefill GEMM needs warp_size 32, got {target.warp_size}")
        self.target, self.pf = target, pf
        self.tma = uses_tma(pf, target)
        self.crews = crews(pf, target)  # tiles a block computes at once
        self.heights = block_heights(pf, target)
        self.cluster = pf["cluster_m"] if self.tma else 1  # templates/prefill/gemm.cu.j2 GEMM_CLUSTER
        self.threads = pf["warps"] * 32 + (32 if self.tma else 0)  # templates/prefill/gemm.cu.j2 GEMM_BLOCK_THREADS
        source = codegen.render(target, TEMPLATE, pf=pf)
        self.module = device.load(compile_source(target, name, source, template=TEMPLATE,
                                                  arch="sm_90a" if uses_wgmma(pf) else None))
        self.functions: dict[tuple[str, int], object] = {}
        self.smem: dict[int, int] = {}
        per_unit: dict[int, int] = {}
        for bm in self.heights:
            self.smem[bm] = smem_bytes(pf, target, bm)
            for ep in EPILOGUES + ("partial",):
                fn = self.module.function(f"gemm_{ep}_m{bm}")
                fn.set_max_dynamic_smem(self.smem[bm])  # also when static + dynamic crosses the 48 KB default
                self.functions[(ep, bm)] = fn
            per_unit[bm] = self.functions[("rows_f32", bm)].max_active_blocks_per_cu(self.threads, self.smem[bm])
        self.blocks_per_unit = per_unit
        #: Persistent (TMA) launches: the clusters of each block height the device holds at once.
        self.resident_clusters = {
            bm: (self.functions[("rows_f32", bm)].max_active_clusters(self.cluster, self.threads, self.smem[bm])
                 if self.cluster > 1 else target.compute_units * max(1, per_unit[bm]))
            for bm in self.heights} if self.tma else {}
        self.gemv_fn = self.module.function("gemv_rows_f32")
        self.reduce_fn = self.module.function("gemm_residual_reduce")
        self.rows_reduce_fn = self.module.function("gemm_rows_f32_reduce")

    def grid(self, bm: int, M: int, N: int, splits: int = 1) -> int:
        """Blocks for the output tiles of an M x N (x splits) GEMM: one per tile, or with TMA the resident blocks
        (persistent: each loops over tiles, ``crews`` at a time), in whole clusters of ``cluster_m`` blocks that take
        ``cluster_m`` adjacent row tiles of one column tile."""
        c = self.cluster
        groups = math.ceil(math.ceil(M / bm) / c) * math.ceil(N / self.pf["tile_n"]) * splits
        if not self.tma:
            return groups
        return min(math.ceil(groups / self.crews), max(1, self.resident_clusters[bm])) * c

    def maps(self, device, A: int, lda: int, W: int, ldw: int, M: int, N: int, K: int, bm: int) -> dict:
        """The TMA builds' kernel arguments map_a and map_w: tensor maps of A [M][K] (boxes bm x tile_k) and W [N][K]
        (tile_n / cluster_m x tile_k); none for the other mainloops."""
        if not self.tma:
            return {}
        dt, bk = self.pf["dtype"], self.pf["tile_k"]
        maps = device.tensor_map_2d  # W boxes: each CTA of a cluster loads 1 / cluster_m of the W tile
        return {"map_a": maps(A, M, K, 2 * lda, bm, bk, dt),
                "map_w": maps(W, N, K, 2 * ldw, self.pf["tile_n"] // self.cluster, bk, dt)}


class GemmKernels:
    """The prefill GEMMs of one model shape (``pf``) on ``device``: each epilogue on its GEMM instance (the [matmul]
    tiling, or the epilogue's own), instances with the same tiling shared."""

    def __init__(self, device, target, pf: dict):
        self.device, self.target, self.pf = device, target, pf
        built: dict[str, GemmInstance] = {}
        #: epilogue -> the instance it launches on (the split-K pass and its reduce go with "residual")
        self.instances: dict[str, GemmInstance] = {}
        for ep in EPILOGUES:
            name = module_name(pf, ep)
            if name not in built:
                built[name] = GemmInstance(device, target, instance_params(pf, ep), name)
            self.instances[ep] = built[name]
        #: Force one block height (tuning/benchmarks; every instance must have it); None = pick_block_rows.
        self.block_rows: int | None = None
        #: Per epilogue, a block height used whatever M (see :meth:`make_batch_invariant`).
        self.fixed_rows: dict[str, int] = {}
        #: rows_f32 uses the GEMV kernel for M <= gemv_max_m (0 disables it).
        self.gemv_max_m = GEMV_MAX_M

    @staticmethod
    def ss_for_readers(ss: int, parts: int, stride: int, M: int) -> tuple[int, int]:
        """(ss, ss_parts) for the readers of partial sums these GEMMs (or the prefill embedding) left: the parts
        (QuantGemm's residuals may leave totals too)."""
        return ss, parts

    def make_batch_invariant(self) -> None:
        """One tiling per epilogue whatever the row count: each instance's smallest block height, no GEMV, no split-K.
        Row m's result then depends on row m alone, bit for bit (what a DDTree verify pass needs to agree with
        one-row decoding through the same kernels)."""
        self.fixed_rows = {ep: min(g.heights) for ep, g in self.instances.items()}
        self.gemv_max_m = 0

    # ---- host checks ---------------------------------------------------------------------------------------------
    def _check(self, name: str, M: int, N: int, K: int, strides: dict[str, tuple[int, int]],
               pointers: dict[str, tuple[int, int]]) -> None:
        if M < 1 or N < 1 or K < 1:
            raise LucegenError(f"gemm_{name}: M, N, K must be positive, got M={M} N={N} K={K}")
        if K % 8:
            raise LucegenError(f"gemm_{name}: K={K} must be a multiple of 8 (16-byte rows)")
        for arg, (value, minimum) in strides.items():
            if value % 8:
                raise LucegenError(f"gemm_{name}: {arg}={value} must be a multiple of 8 elements")
            if value < minimum:
                raise LucegenError(f"gemm_{name}: {arg}={value} is smaller than the row length {minimum}")
        for arg, (ptr, align) in pointers.items():
            if int(ptr) == 0 or int(ptr) % align:
                raise LucegenError(f"gemm_{name}: {arg} must be a {align}-byte aligned device address, "
                                   f"got {int(ptr):#x}")

    def _check_ss(self, name: str, M: int, ss: int, ss_parts: int, ss_stride: int) -> None:
        if ss and (ss_parts < 1 or ss_stride < M):
            raise LucegenError(f"gemm_{name}: ss needs ss_parts >= 1 and ss_stride >= M, got ss_parts={ss_parts} "
                               f"ss_stride={ss_stride} M={M}")

    def _geometry(self, ep: str, M: int, N: int):
        """(kernel, grid, dynamic smem, block height, instance) of epilogue ``ep`` for an M x N GEMM."""
        g = self.instances[ep]
        bm = self.block_rows or self.fixed_rows.get(ep) or pick_block_rows(
            M, N, g.pf["tile_n"], self.target.compute_units * g.crews, g.blocks_per_unit)
        return g.functions[(ep, bm)], g.grid(bm, M, N), g.smem[bm], bm, g

    # ---- the three epilogues -------------------------------------------------------------------------------------
    def rows_f32(self, A: int, lda: int, W: int, ldw: int, M: int, N: int, K: int, ss: int, ss_parts: int,
                 ss_stride: int, out: int, ldo: int, stream=None, argmax_key: int = 0, workspace: int = 0,
                 workspace_bytes: int = 0) -> None:
        """out f32 [m, n] = r[m] * sum_k A[m, k] W[n, k]. With ``argmax_key`` (M = 1: the GEMV; an 8-byte device
        word zeroed beforehand) the argmax of the row is folded in: index = :func:`argmax_from_key` of the word.
        With a ``workspace`` (as the residual's), a few rows over few column tiles split K as the residual GEMM does
        (:func:`plan_residual`, on its instance) and ``gemm_rows_f32_reduce`` sums the slices: for the draft's
        projections, which need no batch invariance."""
        self._check("rows_f32", M, N, K, {"lda": (lda, K), "ldw": (ldw, K), "ldo": (ldo, N)},
                    {"A": (A, 16), "W": (W, 16), "out": (out, 8)})
        self._check_ss("rows_f32", M, ss, ss_parts, ss_stride)
        args = dict(A=address(A), lda=lda, W=address(W), ldw=ldw, M=M, N=N, K=K, ss=address(ss), ss_parts=ss_parts,
                    ss_stride=ss_stride, out=address(out), ldo=ldo)
        if argmax_key and not M == 1 <= self.gemv_max_m:
            raise LucegenError(f"gemm_rows_f32: the folded argmax needs the one-row GEMV (M = 1), got M={M}")
        if M <= self.gemv_max_m:
            self.instances["rows_f32"].gemv_fn.launch(math.ceil(N / GEMV_WARPS), GEMV_WARPS * 32, stream=stream,
                                                      argmax_key=address(argmax_key), **args)
            return
        # the reduce moves 4 columns per 16-byte access (templates/prefill/gemm.cu.j2 gemm_rows_f32_reduce)
        vector_ok = N % 4 == 0 and ldo % 4 == 0 and not int(out) % 16
        split = self._partial_sums(A, lda, W, ldw, M, N, K, workspace if vector_ok else 0, workspace_bytes, stream)
        if split:
            g = self.instances["residual"]
            g.rows_reduce_fn.launch((math.ceil(N / (4 * REDUCE_THREADS)), M), REDUCE_THREADS, stream=stream,
                                    part=address(workspace), splits=split, M=M, N=N, ss=address(ss),
                                    ss_parts=ss_parts, ss_stride=ss_stride, out=address(out), ldo=ldo)
            return
        fn, grid, smem, bm, g = self._geometry("rows_f32", M, N)
        fn.launch(grid, g.threads, smem=smem, stream=stream, **args,
                  **g.maps(self.device, A, lda, W, ldw, M, N, K, bm))

    def _partial_sums(self, A, lda, W, ldw, M, N, K, workspace, workspace_bytes, stream) -> int:
        """Where :func:`plan_residual` splits K and ``workspace`` (16-byte aligned, of ``workspace_bytes``) holds the
        slices, launch the residual instance's split-K pass (part[z][m][n] = slice z's sums) and return the split,
        for the caller's reduce; else 0 (no workspace, a fixed block height, or no split planned)."""
        if not workspace or int(workspace) % 16 or self.block_rows is not None or self.fixed_rows:
            return 0
        g = self.instances["residual"]
        bm, split = plan_residual(M, N, K, g.pf, self.target, g.heights, g.crews)
        if split == 1 or split * M * N * 4 > workspace_bytes:
            return 0
        g.functions[("partial", bm)].launch(g.grid(bm, M, N, split), g.threads, smem=g.smem[bm], stream=stream,
                                            A=address(A), lda=lda, W=address(W), ldw=ldw, M=M, N=N, K=K // split,
                                            splits=split, part=address(workspace),
                                            **g.maps(self.device, A, lda, W, ldw, M, N, K, bm))
        return split

    def swiglu(self, A: int, lda: int, W: int, ldw: int, M: int, N: int, K: int, ss: int, ss_parts: int,
               ss_stride: int, out: int, ldo: int, stream=None) -> None:
        """out ctype [m, i] = silu(r acc[m, 2i]) * r acc[m, 2i+1] for W's interleaved gate/up rows (N = 2I)."""
        if N % 2:
            raise LucegenError(f"gemm_swiglu: N={N} must be even (interleaved gate/up rows)")
        self._check("swiglu", M, N, K, {"lda": (lda, K), "ldw": (ldw, K), "ldo": (ldo, N // 2)},
                    {"A": (A, 16), "W": (W, 16), "out": (out, 2)})
        self._check_ss("swiglu", M, ss, ss_parts, ss_stride)
        fn, grid, smem, bm, g = self._geometry("swiglu", M, N)
        fn.launch(grid, g.threads, smem=smem, stream=stream,
                  A=address(A), lda=lda, W=address(W), ldw=ldw, M=M, N=N, K=K, ss=address(ss), ss_parts=ss_parts,
                  ss_stride=ss_stride, out=address(out), ldo=ldo, **g.maps(self.device, A, lda, W, ldw, M, N, K, bm))

    @staticmethod
    def residual_workspace_bytes(M: int, N: int) -> int:
        """Scratch for the residual GEMM's split-K partial sums (the most any plan uses)."""
        return max(SPLITS) * M * N * 4

    def residual(self, A: int, lda: int, W: int, ldw: int, M: int, N: int, K: int, x: int, ldx: int, norm_w: int,
                 xn: int, ldxn: int, ss_out: int, ss_stride: int, stream=None, workspace: int = 0,
                 workspace_bytes: int = 0) -> None:
        """x f32 += acc; xn = x * (1 + norm_w); ss_out[j * ss_stride + m] = sum of x^2 over columns of tile j.
        With a ``workspace`` of ``residual_workspace_bytes(M, N)``, short prompts split K across blocks (see
        :func:`plan_residual`) and a reduce pass finishes the epilogue (where N % 4 == 0, x, norm_w and the workspace
        are 16-byte and xn 8-byte aligned: its accesses are 16 bytes wide)."""
        self._check("residual", M, N, K, {"lda": (lda, K), "ldw": (ldw, K), "ldx": (ldx, N), "ldxn": (ldxn, N)},
                    {"A": (A, 16), "W": (W, 16), "x": (x, 8), "norm_w": (norm_w, 4), "xn": (xn, 2),
                     "ss_out": (ss_out, 4)})
        if ss_stride < M:
            raise LucegenError(f"gemm_residual: ss_stride={ss_stride} is smaller than M={M}")
        # the split-K reduce moves 4 columns per 16-byte access (templates/prefill/gemm.cu.j2 gemm_residual_reduce)
        vector_ok = N % 4 == 0 and not (int(x) % 16 or int(norm_w) % 16 or int(xn) % 8)
        split = self._partial_sums(A, lda, W, ldw, M, N, K, workspace if vector_ok else 0, workspace_bytes, stream)
        if split:
            self.instances["residual"].reduce_fn.launch(
                M, REDUCE_THREADS, stream=stream, part=address(workspace), splits=split, M=M, N=N, x=address(x),
                ldx=ldx, norm_w=address(norm_w), xn=address(xn), ldxn=ldxn, ss_out=address(ss_out),
                ss_stride=ss_stride)
            return
        fn, grid, smem, bm, g = self._geometry("residual", M, N)
        fn.launch(grid, g.threads, smem=smem, stream=stream,
                  A=address(A), lda=lda, W=address(W), ldw=ldw, M=M, N=N, K=K, x=address(x), ldx=ldx,
                  norm_w=address(norm_w), xn=address(xn), ldxn=ldxn, ss_out=address(ss_out), ss_stride=ss_stride,
                  **g.maps(self.device, A, lda, W, ldw, M, N, K, bm))

"""Time the quantised GEMM on the 27B's matrix shapes: GB/s of weights per launch and rows (M) per launch. The
launches cycle through copies of each matrix (over 200 MB in all), so the weights come from DRAM as in a decode
step, not from the L2. Every launch reads its input's magnitudes per 16 values and the epilogues write their
output's, as in the layer loop (they matter to int8-activation groups alone). ``--parts`` also times the given K
splits (QuantGemm.parts overridden) beside the planned one.
``--shape TEXT`` times only the shapes whose name holds TEXT (``--shape lm_head``: one kernel for a profiler).
``--tiles`` times Q4_K matrices of those many 16-row tiles instead of the 27B's (an in-projection-like one, K = 5120,
and a down-like one, K = 17408): how the grid's fill of the chip (waves of resident blocks) sets the bandwidth.

``--norm`` gives the readers (rows_f32, swiglu) RMSNorm row scales from the parts a 5,120-column residual leaves
(320 per row at one row, one total per row at more), as in the layer loop; without it they take none.

``--ring 0,1`` times each launch with the one-row weight ring off and on (QuantGemm.use_ring), ``--one-row 0,1``
with the one-token int8 kernels (m1q, m1q6) off and on (QuantGemm.use_one_row), ``--prequantised 0,1`` with the
prequantised int8 kernels (nt<N>qp, their quant_gemm_q8_rows launch timed with them) off and on
(QuantGemm.use_prequantised), ``--wgmma 0,1``
with the warpgroup-MMA kernels off and on (QuantGemm.use_wgmma), ``--int8 0,1`` with int8 activations off and on
for the groups that take them (QuantGemm.int8: K-quants alone; ``--int8-kernels`` renders them where the
descriptor's [quant] int8_activations is off). The kernels are the quantised target's (``Target.quantised_target()``:
[quant] compute_dtype); ``--descriptor-dtype`` times them in the descriptor's own.

    python -m lucegen.devtools.quant_gemm_bench [M ...] [--parts 1,2,4,8] [--tiles 264,320,528] [--ring 0,1]
                                                [--one-row 0,1] [--prequantised 0,1] [--wgmma 0,1]
                                                [--int8 0,1 --int8-kernels] [--descriptor-dtype] [--norm]
                                                [--shape TEXT]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys

import numpy as np

from lucegen.bench.gemm import time_graph_us
from lucegen.model.init_gguf import random_k_blocks
from lucegen.model.quant import TYPES
from lucegen.runtime.device import Device
from lucegen.runtime.quant_gemm import QuantGemm

H, I, V = 5120, 17408, 248320
SHAPES = {  # name: (segments [(type, rows)], K, epilogue)
    "dn_in (Q5_K qkv + Q4_K z, a, b)": ([("Q5_K", 10240), ("Q4_K", 6144), ("Q4_K", 48), ("Q4_K", 48)], H, "rows_f32"),
    "gate/up (Q4_K pair)": ([("Q4_K", I), ("Q4_K", I)], H, "swiglu"),
    "down (Q6_K)": ([("Q6_K", H)], I, "residual"),
    "down (Q4_K)": ([("Q4_K", H)], I, "residual"),
    "dn_out (Q4_K)": ([("Q4_K", H)], 6144, "residual"),
    "lm_head (Q6_K)": ([("Q6_K", V)], H, "rows_f32"),
}


def bench(shapes, ms, sweep=(), rings=(None,), wgmmas=(None,), descriptor_dtype=False, int8s=(None,),
          int8_kernels=False, one_rows=(None,), norm=False, preqs=(None,)):
    """Time each of ``shapes`` (name: (segments, K, epilogue)) at each row count of ``ms``, over the variants."""
    dev = Device.open()
    target = dev.target
    if int8_kernels:
        target = dataclasses.replace(target, quant=dataclasses.replace(target.quant, int8_activations=True))
    target = target if descriptor_dtype else target.quantised_target()
    print(f"{target.name}: activations in {target.compute_dtype}")
    qg = QuantGemm(dev, target, H, 1e-6)
    rng = np.random.default_rng(0)
    has_int8 = qg.int8
    for name, (segs, K, ep) in shapes.items():
        raw = [(t, random_k_blocks(rng, t, r * K // TYPES[t][1], 0.02), r, 0) for t, r in segs]
        for i8 in int8s:  # a group's activations (and its tile layout) are fixed when it is built
            qg.int8 = has_int8 if i8 is None else bool(i8) and has_int8
            copies = [qg.matrix(raw, K, pair=ep == "swiglu", int8=True)]
            while len(copies) * copies[0].weight_bytes < 200e6:
                copies.append(qg.matrix(raw, K, pair=ep == "swiglu", int8=True))
            for M in ms:
                for parts, ring, wg, one, pq in itertools.product([None] + [p for p in sweep], rings, wgmmas,
                                                                  one_rows, preqs):
                    _time(dev, qg, name, K, ep, copies, M, parts, ring, wg, i8, one, norm, pq)
            for c in copies:
                c.free()


def _time(dev, qg, name, K, ep, copies, M, parts, ring, wg, i8, one=None, norm=False, pq=None):
    """Print the time of one launch over ``copies`` (each launch reads the next) at M rows."""
    W = copies[0]
    if i8 and not W.int8:
        return  # no int8 kernel for this group: timed with int8=0
    planned = QuantGemm.parts(qg, W)
    if parts == planned or (parts is not None and parts > qg.warps(W) // (2 if W.pair else 1)):
        return  # timed as the planned one, or more parts than the block's warps (a pair's: 2 tiles a block) hold
    parts = planned if parts is None else parts
    if ring is not None:
        qg.use_ring = bool(ring)
    if wg is not None:
        qg.use_wgmma = bool(wg)
    if one is not None:
        qg.use_one_row = bool(one)
    if pq is not None:
        qg.use_prequantised = bool(pq)
    qg.parts = lambda _W, parts=parts: parts
    a = dev.upload(np.full((M, K), 0x3F80, np.uint16))
    N = W.rows
    out = dev.alloc(M * max(N, H) * 4)
    x = dev.alloc(M * N * 4)
    xn = dev.alloc(M * N * 2)
    w = dev.upload(np.zeros(N, np.float32))
    ss = dev.alloc(4 * M * 1024)
    # the readers' row scales: a residual's parts over H columns (16 a part), or the one total it leaves per row
    ss_parts = 1 if QuantGemm.row_totals(M) else H // 16
    norm_ss = dev.upload(np.full((ss_parts, M), 1.0, np.float32)) if norm else None
    read_ss = (norm_ss.ptr, ss_parts, M) if norm else (0, 0, M)
    # magnitudes per 16 values: of A (as a producer's epilogue leaves them), and of the output
    am, amo = dev.alloc(M * K // 8), dev.alloc(M * max(N, H) // 8)
    if qg.amax_fn is not None:
        qg.amax(a.ptr, K, M, K, am.ptr)
    index = itertools.count()

    def launch(stream):  # each launch reads the next copy
        W = copies[next(index) % len(copies)]
        amax_out = amo.ptr if qg.amax_fn is not None else 0
        if ep == "rows_f32":
            qg.rows_f32(a.ptr, K, W, None, M, N, K, *read_ss, out.ptr, N, stream=stream, a_amax=am.ptr)
        elif ep == "swiglu":
            qg.swiglu(a.ptr, K, W, None, M, 2 * N, K, *read_ss, out.ptr, N, stream=stream, a_amax=am.ptr,
                      amax_out=amax_out)
        else:
            qg.residual(a.ptr, K, W, None, M, N, K, x.ptr, N, w.ptr, xn.ptr, N, ss.ptr, M, stream=stream,
                        a_amax=am.ptr, amax_out=amax_out)
    # a graph of 10 launches a copy: the launches' host cost stays out of the timing
    ms_each = time_graph_us(dev, launch, repeats=3, batch=10 * len(copies)) / 1e3
    print(f"{name:34s} M={M:3d}  {ms_each * 1e3:8.1f} us  {W.weight_bytes / ms_each / 1e6:7.0f} GB/s  "
          f"parts={parts}{' (planned)' if parts == planned else ''}  kernel={qg.kernel(W, M, a.ptr, K)[0]}"
          f"{'' if ring is None else f' ring={ring}'}{'' if wg is None else f' wgmma={wg}'}"
          f"{'' if i8 is None else f' int8={i8}'}{'' if one is None else f' one_row={one}'}"
          f"{'' if pq is None else f' prequantised={pq}'}"
          f"{' norm' if norm else ''}", flush=True)
    del qg.parts  # the planned parts again
    for b in (a, out, x, xn, w, ss, am, amo) + ((norm_ss,) if norm else ()):
        b.free()


def _ints(text: str) -> tuple[int, ...]:
    """A comma-separated list of integers: "1,2,4"."""
    return tuple(int(v) for v in text.split(","))


def build_parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(prog="python -m lucegen.devtools.quant_gemm_bench",
                                  description="Time the quantised GEMM on the 27B's matrix shapes.")
    cli.add_argument("rows", nargs="*", type=int, default=[1, 8, 16, 23, 32], help="rows (M) per launch")
    cli.add_argument("--parts", type=_ints, default=(), help="K splits to time beside the planned one")
    cli.add_argument("--tiles", type=_ints, help="Q4_K matrices of these many row tiles instead of the 27B's")
    cli.add_argument("--ring", type=_ints, default=(None,), help="the one-row weight ring off / on: 0,1")
    cli.add_argument("--one-row", type=_ints, default=(None,), help="the one-token int8 kernels off / on: 0,1")
    cli.add_argument("--prequantised", type=_ints, default=(None,),
                     help="the prequantised int8 kernels off / on: 0,1")
    cli.add_argument("--wgmma", type=_ints, default=(None,), help="the warpgroup-MMA kernels off / on: 0,1")
    cli.add_argument("--int8", type=_ints, default=(None,), help="int8 activations off / on: 0,1 (with --int8-kernels "
                     "where the descriptor leaves them out)")
    cli.add_argument("--int8-kernels", action="store_true", help="render the int8-activation kernels whatever the "
                     "descriptor's [quant] int8_activations")
    cli.add_argument("--descriptor-dtype", action="store_true",
                     help="the descriptor's compute_dtype, not the quantised target's [quant] one")
    cli.add_argument("--norm", action="store_true", help="the readers take RMSNorm row scales, as in the layer loop")
    cli.add_argument("--shape", help="only the shapes whose name holds this text (e.g. lm_head)")
    return cli


def selected_shapes(args, cli: argparse.ArgumentParser) -> dict:
    """The shapes to time: the 27B's, or Q4_K matrices of --tiles row tiles; those whose name holds --shape."""
    shapes = SHAPES
    if args.tiles:
        shapes = {f"Q4_K {16 * t} x {K} ({t} tiles)": ([("Q4_K", 16 * t)], K, ep)
                  for K, ep in ((H, "rows_f32"), (I, "residual")) for t in args.tiles}
    if args.shape:
        shapes = {name: shape for name, shape in shapes.items() if args.shape in name}
        if not shapes:
            cli.error(f"--shape {args.shape}: no shape's name holds it")
    return shapes


def main(argv: list[str] | None = None) -> int:
    cli = build_parser()
    args = cli.parse_args(argv)
    bench(selected_shapes(args, cli), args.rows, args.parts, args.ring, args.wgmma, args.descriptor_dtype, args.int8,
          args.int8_kernels, args.one_row, args.norm, args.prequantised)
    return 0


if __name__ == "__main__":
    sys.exit(main())

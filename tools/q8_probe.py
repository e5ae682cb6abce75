"""Probe for the quantised target: how fast are its products with int8 activations (GGML's Q8_K form: one scale per
token and 256 values) against the engine's own kernels, which take fp16 activations? The kernels are hand-written in
tools/q8_probe.cu, outside the templates: this measures a design before it is built (notes/quant-gemm-perf.md,
"int8 activations"). It prints µs per launch and GB/s of weights, L2-cold (launches cycle through copies), and
each kernel's largest error against numpy (float64 products of the dequantised weights with the dequantised
activations), so a fast wrong kernel shows.

    python3 tools/q8_probe.py [M ...]          # Q4_K shapes of the 27B at M rows (default 1 9 23)
    python3 tools/q8_probe.py --q6k            # Q6_K shapes, one row

For the engine's own figures on the same shapes: python3 tools/quant_gemm_bench.py 1 9 23.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np

from lucegen.bench.gemm import time_graph_us
from lucegen.compile import nvrtc
from lucegen.compile.base import CompiledModule
from lucegen.model.gguf_io import random_k_blocks
from lucegen.model.quant import dequantize
from lucegen.runtime.device import Device, address

Q4K_SHAPES = {"dn_out": (5120, 6144), "down Q4_K": (5120, 17408), "gate/up pair": (34816, 5120),
              "in-proj-like": (16384, 5120)}
Q6K_SHAPES = {"down Q6_K": (5120, 17408), "lm_head Q6_K": (248320, 5120)}
COPIES_BYTES = 200e6  # the launches cycle through this many bytes of copies: weights come from DRAM


def q8k(x: np.ndarray) -> np.ndarray:
    """The activations as the probe's kernels see them: x quantised per 256 values and dequantised again."""
    M, K = x.shape
    xb = x.reshape(M, K // 256, 256).astype(np.float32)
    amax = np.abs(xb).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.maximum(amax, np.float32(1e-30)), 0).astype(np.float32)
    return (np.rint(xb * inv) * (amax / np.float32(127))).reshape(M, K).astype(np.float64)


def half_inputs(x: np.ndarray, Mpad: int):
    """For the kernels that quantise as they load (``_h``): the fp16 rows (zero past M), 127 / amax per token and
    256 values as fp16 rounded down (so |x inv| <= 127), the f32 scale 1 / inv of each, and the activations as
    those kernels see them (rint(x inv) / inv, exact in float64)."""
    M, K = x.shape
    x16 = np.zeros((Mpad, K), np.float16)
    x16[:M] = x
    amax = np.abs(x16.astype(np.float64)).reshape(Mpad, K // 256, 256).max(-1)
    inv = np.where(amax > 0, 127 / np.maximum(amax, 1e-30), 0).astype(np.float16)
    over = inv.astype(np.float64) * amax > 127
    inv[over] = np.nextafter(inv[over], np.float16(0))
    d = np.where(inv > 0, np.float32(1) / np.maximum(inv.astype(np.float32), np.float32(1e-30)), 0).astype(np.float32)
    q = np.rint(x16.astype(np.float64).reshape(Mpad, K // 256, 256) * inv.astype(np.float64)[..., None])
    assert np.abs(q).max() <= 127
    seen = (q * d.astype(np.float64)[..., None]).reshape(Mpad, K)[:M]
    return x16, np.ascontiguousarray(inv.T), np.ascontiguousarray(d.T), seen


def tile_q4k(raw: np.ndarray, N: int, nb: int) -> np.ndarray:
    """Q4_K rows in the probe's tiles: per (16 rows, block) the 16 headers, then [j][lane][16 bytes] where lane
    (g, t) finds quant bytes 32 j + 8 t .. + 7 of row g, then of row g + 8 (tools/q8_probe.cu)."""
    raw = raw.reshape(N // 16, 16, nb, 144)
    out = np.empty((N // 16, nb, 2304), np.uint8)
    out[:, :, :256] = raw[:, :, :, :16].transpose(0, 2, 1, 3).reshape(N // 16, nb, 256)
    qs = raw[:, :, :, 16:].transpose(0, 2, 1, 3)
    g, t = np.arange(32) // 4, np.arange(32) % 4
    tiles = np.empty((N // 16, nb, 4, 32, 16), np.uint8)
    for j in range(4):
        for k in range(8):
            tiles[:, :, j, :, k] = qs[:, :, g, 32 * j + 8 * t + k]
            tiles[:, :, j, :, 8 + k] = qs[:, :, g + 8, 32 * j + 8 * t + k]
    out[:, :, 256:] = tiles.reshape(N // 16, nb, 2048)
    return out


class Probe:
    def __init__(self):
        self.dev = Device.open()
        source = (Path(__file__).with_name("q8_probe.cu")).read_text()
        arch = self.dev.target.arch + "a"
        cubin, log, infos = nvrtc.compile(arch, "q8_probe.cu", source, nvrtc.options_for(arch))
        for info in infos:
            print(f"{info.name}: {info.registers} registers, {info.spills} bytes spilled")
        self.mod = self.dev.load(CompiledModule("q8_probe", self.dev.target.name, arch, cubin, infos, log,
                                                nvrtc.compiler_id(), (), False))
        self.stream = self.dev.stream()

    def time_us(self, launch, reps: int) -> float:
        """µs per launch of ``launch(i, stream)``, i = 0, 1, ... (the copy to read), over reps launches captured in
        one graph (lucegen.bench.gemm.time_graph_us: the launches' host cost left out)."""
        index = itertools.count()
        return time_graph_us(self.dev, lambda stream: launch(next(index), stream), repeats=3, batch=reps)

    def quantised(self, x: np.ndarray, Mpad: int):
        """Upload x and quantise it on the device: (q, d, sums per 32, sums per 16) buffers, and the quantiser's µs."""
        M, K = x.shape
        xb = self.dev.upload(x)
        bufs = (self.dev.alloc(Mpad * K), self.dev.alloc(4 * Mpad * (K // 256)), self.dev.alloc(4 * Mpad * (K // 32)),
                self.dev.alloc(4 * Mpad * (K // 16)))
        fn = self.mod.function("q8k_quantize")
        args = [address(xb.ptr), np.int32(K), np.int32(M), np.int32(Mpad), *(address(b.ptr) for b in bufs)]
        us = self.time_us(lambda i, stream: fn.launch((K // 256, Mpad // 8), 256, args, stream=stream), 50)
        xb.free()
        return bufs, us

    def report(self, label, launch, reps, out, M, N, ref, nbytes):
        launch(0)
        self.stream.synchronize()
        y = self.dev.download(out, np.float32, (M, N))[:, : ref.shape[1]].astype(np.float64)
        err = np.abs(y - ref).max() / np.abs(ref).max()
        us = self.time_us(launch, reps)
        print(f"   {label:22s} {us:8.1f} us  {nbytes / us / 1e3:6.0f} GB/s   max error {err:.1e}", flush=True)


def q4k(probe: Probe, rows: list[int]) -> None:
    rng = np.random.default_rng(0)
    dev, st = probe.dev, probe.stream
    for name, (N, K) in Q4K_SHAPES.items():
        nb = K // 256
        raw = random_k_blocks(rng, "Q4_K", N * nb, 0.02)
        Wd = dequantize(raw.reshape(-1), "Q4_K", N * K).reshape(N, K).astype(np.float64)
        copies = max(1, int(np.ceil(COPIES_BYTES / raw.nbytes)))
        raws = [dev.upload(raw.reshape(-1)) for _ in range(copies)]
        tiled = tile_q4k(raw, N, nb)
        tileds = [dev.upload(tiled.reshape(-1)) for _ in range(copies)]
        for M in rows:
            Mpad = 8 * -(-M // 8)
            x = rng.standard_normal((M, K)).astype(np.float32)
            (q, d, s32, _), us_q = probe.quantised(x, Mpad)
            ref = q8k(x) @ Wd.T
            out = dev.alloc(4 * M * N)
            print(f"{name} N={N} K={K} M={M}: quantiser {us_q:.1f} us", flush=True)
            nt = -(-M // 8)
            kernels = [(f"q4k_imma_nt{nt}_w8", 8, (2, 4)), (f"q4k_imma_nt{nt}_w4", 4, (2, 4))] if nt > 1 else \
                [("q4k_imma_nt1_w8", 8, (2, 4))]
            if nt == 3:
                kernels += [("q4k_imma_nt3_w8_pf", 8, (2,)), ("q4k_imma_nt3_w4_pf", 4, (2, 4))]
            for kname, warps, parts_list in kernels:
                fn = probe.mod.function(kname)
                for parts in parts_list:
                    grid = -(-(N // 16) // (warps // parts))
                    launch = (lambda i, stream=st, fn=fn, grid=grid, warps=warps, parts=parts: fn.launch(
                        grid, 32 * warps, [address(tileds[i % copies].ptr), np.int32(nb), np.int32(N // 16),
                                           np.int32(parts), address(q.ptr), np.int32(K), address(d.ptr),
                                           address(s32.ptr),
                                           np.int32(Mpad), np.int32(M), address(out.ptr), np.int32(N)], stream=stream))
                    probe.report(f"{kname} parts={parts}", launch, 10 * copies, out, M, N, ref, raw.nbytes)
            x16, inv16, d32, seen = half_inputs(x, Mpad)
            hb = [dev.upload(a) for a in (x16, inv16, d32)]
            ref_h = seen @ Wd.T
            for kname, warps, parts_list in [("q4k_imma_nt1_w8_h", 8, (2, 4)), ("q4k_imma_nt2_w4_h", 4, (4,)),
                                             ("q4k_imma_nt3_w4_h", 4, (2, 4))][nt - 1: nt]:
                fn = probe.mod.function(kname)
                for parts in parts_list:
                    grid = -(-(N // 16) // (warps // parts))
                    launch = (lambda i, stream=st, fn=fn, grid=grid, warps=warps, parts=parts: fn.launch(
                        grid, 32 * warps, [address(tileds[i % copies].ptr), np.int32(nb), np.int32(N // 16),
                                           np.int32(parts), address(hb[0].ptr), np.int32(K), address(hb[2].ptr),
                                           address(hb[1].ptr), np.int32(Mpad), np.int32(M), address(out.ptr),
                                           np.int32(N)], stream=stream))
                    probe.report(f"{kname} parts={parts}", launch, 10 * copies, out, M, N, ref_h, raw.nbytes)
            for b in hb:
                b.free()
            if M == 1:
                for R in (1, 2):
                    fn = probe.mod.function(f"q4k_dp4a_r{R}")
                    launch = (lambda i, stream=st, fn=fn, R=R: fn.launch(
                        -(-N // (8 * R)), 256, [address(raws[i % copies].ptr), np.int32(N), np.int32(nb),
                                                address(q.ptr), address(d.ptr), address(s32.ptr), np.int32(Mpad),
                                                address(out.ptr)], stream=stream))
                    probe.report(f"q4k_dp4a_r{R}", launch, 10 * copies, out, M, N, ref, raw.nbytes)
            out.free()
        for b in raws + tileds:
            b.free()


def q6k(probe: Probe) -> None:
    rng = np.random.default_rng(0)
    dev, st = probe.dev, probe.stream
    for name, (N, K) in Q6K_SHAPES.items():
        nb = K // 256
        raw = random_k_blocks(rng, "Q6_K", N * nb, 0.02).reshape(N * nb, 210)
        checked = 256  # rows compared against numpy
        Wd = dequantize(raw[: checked * nb].reshape(-1), "Q6_K", checked * K).reshape(checked, K).astype(np.float64)
        fields = [np.ascontiguousarray(raw[:, a:b]) for a, b in ((0, 128), (128, 192), (192, 208), (208, 210))]
        copies = max(1, int(np.ceil(2 * COPIES_BYTES / raw.nbytes)))
        bufs = [[dev.upload(f.reshape(-1)) for f in fields] for _ in range(copies)]
        x = rng.standard_normal((1, K)).astype(np.float32)
        (q, d, _, s16), _ = probe.quantised(x, 8)
        ref = q8k(x) @ Wd.T
        out = dev.alloc(4 * N)
        print(f"{name} N={N} K={K} M=1", flush=True)
        for R in (1, 2):
            fn = probe.mod.function(f"q6k_dp4a_r{R}")
            launch = (lambda i, stream=st, fn=fn, R=R: fn.launch(
                -(-N // (8 * R)), 256, [*(address(b.ptr) for b in bufs[i % copies]), np.int32(N), np.int32(nb),
                                        address(q.ptr), address(d.ptr), address(s16.ptr), np.int32(8),
                                        address(out.ptr)],
                stream=stream))
            probe.report(f"q6k_dp4a_r{R}", launch, max(10, 4 * copies), out, 1, N, ref, raw.nbytes)
        out.free()
        for group in bufs:
            for b in group:
                b.free()


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="Time Q4_K / Q6_K products with int8 activations (a design probe).")
    cli.add_argument("rows", nargs="*", type=int, default=[1, 9, 23], help="rows (M) per launch, at most 24")
    cli.add_argument("--q6k", action="store_true", help="the Q6_K shapes at one row instead")
    args = cli.parse_args()
    probe = Probe()
    if args.q6k:
        q6k(probe)
    else:
        q4k(probe, args.rows)

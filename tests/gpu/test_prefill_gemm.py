"""Prefill GEMMs (templates/prefill/gemm.cu.j2) against numpy: acc = A @ W.T from the same compute-dtype-rounded
inputs, in float64, with the contract's epilogues (PREFILL.md): rows_f32 (row scale r[m] from RMS partial sums),
swiglu (interleaved gate/up columns), residual (x += acc, xn = x * (1 + w), per-column-tile sums of squares).

Sizes come from hypothesis: M in 1 .. 600 (M <= 4 takes the GEMV kernel), N not a multiple of tile_n, K a multiple
of 8 and often not of tile_k (the zero-filled K edge), with and without ss.

Tolerances. The products of two bf16/fp16 values are exact in f32, so the only error is f32 summation over K
(<= K * 2^-24 relative to sum |a w|, far below what we allow): f32 outputs (rows_f32, x, ss) must be within
2e-4 * max |ref| + 1e-6. Compute-dtype outputs (swiglu, xn) add one final rounding, half an ulp = 2^-9 relative for
bf16 (2^-12 fp16): |err| <= 2^-8 * |ref| + 2e-4 * max |ref|. A wrong fragment mapping, a missing K tile or a wrong
row scale moves entries by O(max |ref|), far outside these bounds.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lucegen.model.config import ModelConfig
from lucegen.model.dtypes import bf16_bits_to_f32, f32_to_bf16_bits

from gpu_models import gpu_device  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

F32 = np.float32


@functools.cache
def _setup():
    from lucegen.families.prefill import prefill_params
    from lucegen.runtime.prefill.gemm import GemmKernels

    dev = gpu_device()
    pf = prefill_params(ModelConfig.preset("qwen3.5-0.8b"), dev.target)
    # LUCEGEN_GEMM_TILES='{"warps": 4, "tile_k": 32}': check a candidate [matmul] tiling before it goes in a descriptor
    tiles = json.loads(os.environ.get("LUCEGEN_GEMM_TILES", "{}"))
    if tiles:  # the candidate is every epilogue's tiling
        pf.update(tiles, gemm_tilings={})
    pf["ss_parts"] = -(-pf["H"] // pf["tile_n"])
    return dev, pf, GemmKernels(dev, dev.target, pf)


def _to_ctype(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(device bits as uint16, their f32 values)."""
    if dtype == "bf16":
        bits = f32_to_bf16_bits(x.astype(F32))
        return bits, bf16_bits_to_f32(bits)
    h = x.astype(np.float16)
    return h.view(np.uint16), h.astype(F32)


def _from_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_bits_to_f32(bits) if dtype == "bf16" else bits.view(np.float16).astype(F32)


def _inputs(M, N, K, seed, dtype):
    rng = np.random.default_rng(seed)
    a_bits, a = _to_ctype(rng.standard_normal((M, K)), dtype)
    w_bits, w = _to_ctype(rng.standard_normal((N, K)) / np.sqrt(K), dtype)
    return a_bits, a, w_bits, w, rng


def _row_scale(pf, ss_parts_arr):
    """ss_parts_arr [ss_parts, M] -> r[m] = rsqrt(sum_j ss / H + eps) (the contract's RMSNorm row scale)."""
    return 1.0 / np.sqrt(ss_parts_arr.astype(np.float64).sum(0) / pf["H"] + float(pf["EPS"]))


def _close(got, ref, rounded: bool, what: str):
    scale = float(np.abs(ref).max()) or 1.0
    tol = (2.0 ** -8 * np.abs(ref) if rounded else 0.0) + 2e-4 * scale + 1e-6
    err = np.abs(got.astype(np.float64) - ref)
    bad = err > tol
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} entries off, max err {float(err.max()):.3e} "
                           f"(max |ref| {scale:.3e}) first at {np.argwhere(bad)[0].tolist()}")


def _with_ss(dev, pf, M, use_ss, rng):
    """A device ss buffer [ss_parts, ss_stride] of positive partial sums (or 0) and the row scale it implies."""
    if not use_ss:
        return 0, None, np.ones(M)
    stride = M + 3  # ss_stride larger than M: the kernel must use the stride, not M
    parts = rng.uniform(0.1, 2.0, (pf["ss_parts"], stride)).astype(F32) * (pf["H"] / pf["ss_parts"])
    buf = dev.upload(parts)
    return buf, stride, _row_scale(pf, parts[:, :M])


SIZES = dict(M=st.integers(1, 600), N=st.integers(1, 700), K=st.integers(1, 80).map(lambda k: 8 * k),
             use_ss=st.booleans(), seed=st.integers(0, 2**31 - 1))
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(**SIZES)
@example(M=1, N=1000, K=1024, use_ss=True, seed=1)
@example(M=4, N=129, K=72, use_ss=False, seed=2)
@example(M=5, N=257, K=200, use_ss=True, seed=3)
@example(M=520, N=300, K=1032, use_ss=True, seed=4)
def test_gemm_rows_f32(M, N, K, use_ss, seed):
    dev, pf, gemm = _setup()
    a_bits, a, w_bits, w, rng = _inputs(M, N, K, seed, pf["dtype"])
    ss, stride, r = _with_ss(dev, pf, M, use_ss, rng)
    ldo = -(-N // 8) * 8 + 8
    A, W, out = dev.upload(a_bits), dev.upload(w_bits), dev.alloc(M * ldo * 4)
    gemm.rows_f32(A.ptr, K, W.ptr, K, M, N, K, int(ss), pf["ss_parts"], stride or 0, out.ptr, ldo)
    got = dev.download(out, F32, (M, ldo))[:, :N]
    ref = (a.astype(np.float64) @ w.astype(np.float64).T) * r[:, None]
    _close(got, ref, False, f"rows_f32 M={M} N={N} K={K} ss={use_ss}")


@SETTINGS
@given(**SIZES)
@example(M=1, N=2, K=8, use_ss=True, seed=5)
@example(M=131, N=3586, K=1024, use_ss=True, seed=6)
def test_gemm_swiglu(M, N, K, use_ss, seed):
    N += N % 2  # gate/up pairs
    dev, pf, gemm = _setup()
    a_bits, a, w_bits, w, rng = _inputs(M, N, K, seed, pf["dtype"])
    ss, stride, r = _with_ss(dev, pf, M, use_ss, rng)
    ldo = -(-(N // 2) // 8) * 8
    A, W, out = dev.upload(a_bits), dev.upload(w_bits), dev.alloc(M * ldo * 2)
    gemm.swiglu(A.ptr, K, W.ptr, K, M, N, K, int(ss), pf["ss_parts"], stride or 0, out.ptr, ldo)
    got = _from_bits(dev.download(out, np.uint16, (M, ldo))[:, : N // 2], pf["dtype"])
    acc = (a.astype(np.float64) @ w.astype(np.float64).T) * r[:, None]
    gate, up = acc[:, 0::2], acc[:, 1::2]
    ref = gate / (1.0 + np.exp(-gate)) * up
    _close(got, ref, True, f"swiglu M={M} N={N} K={K} ss={use_ss}")


@SETTINGS
@given(**{k: v for k, v in SIZES.items() if k != "use_ss"})
@example(M=1, N=1024, K=2048, seed=7)
@example(M=520, N=1024, K=3584, seed=8)
@example(M=33, N=200, K=16, seed=9)
def test_gemm_residual(M, N, K, seed):
    _check_residual(M, N, K, seed, split_workspace=False)


@pytest.mark.parametrize("M,K", [(1, 2048), (37, 3584), (520, 3584), (130, 1024)])
def test_gemm_residual_split_k(M, K):
    """With a workspace the launcher may split K (plan_residual) and finish with gemm_residual_reduce: same results."""
    from lucegen.runtime.prefill.gemm import plan_residual

    _, pf, gemm = _setup()
    assert plan_residual(M, 1024, K, pf, gemm.target, gemm.instances["residual"].heights, gemm.instances["residual"].crews)[1] > 1 or M == 130
    _check_residual(M, 1024, K, M + K, split_workspace=True)


@pytest.mark.parametrize("M,N,K", [(16, 6144, 5120), (9, 2048, 5120), (23, 1000, 1024), (5, 384, 2048)])
def test_gemm_rows_f32_split_k(M, N, K):
    """With a workspace rows_f32 may split K like the residual (the draft's few-row projections over few column
    tiles) and finish with gemm_rows_f32_reduce: the same results within the bound, the row scale applied once.
    The first shapes are the 27B draft's qkv and its context K/V projection; the planner must split them."""
    from lucegen.runtime.prefill.gemm import plan_residual

    dev, pf, gemm = _setup()
    g = gemm.instances["residual"]
    if (M, N) in ((16, 6144), (9, 2048)):
        assert plan_residual(M, N, K, g.pf, gemm.target, g.heights, g.crews)[1] > 1
    a_bits, a, w_bits, w, rng = _inputs(M, N, K, M + N, pf["dtype"])
    ss, stride, r = _with_ss(dev, pf, M, True, rng)
    ldo = N + 8
    ws_bytes = gemm.residual_workspace_bytes(M, N)
    A, W, out, ws = dev.upload(a_bits), dev.upload(w_bits), dev.alloc(M * ldo * 4), dev.alloc(ws_bytes)
    dev.memset(out, 0xFF)
    gemm.rows_f32(A.ptr, K, W.ptr, K, M, N, K, int(ss), pf["ss_parts"], stride, out.ptr, ldo, workspace=ws.ptr,
                  workspace_bytes=ws_bytes)
    got = dev.download(out, F32, (M, ldo))[:, :N]
    ref = (a.astype(np.float64) @ w.astype(np.float64).T) * r[:, None]
    _close(got, ref, False, f"rows_f32 split K M={M} N={N} K={K}")


def _check_residual(M, N, K, seed, split_workspace):
    dev, pf, gemm = _setup()
    a_bits, a, w_bits, w, rng = _inputs(M, N, K, seed, pf["dtype"])
    x0 = rng.standard_normal((M, N)).astype(F32)
    norm_w = rng.uniform(-0.5, 0.5, N).astype(F32)
    tn = pf["tile_n"]
    parts = -(-N // tn)
    ld = -(-N // 8) * 8
    stride = M + 5
    x_host = np.zeros((M, ld), F32)
    x_host[:, :N] = x0
    A, W, x = dev.upload(a_bits), dev.upload(w_bits), dev.upload(x_host)
    nw, xn, ss = dev.upload(norm_w), dev.alloc(M * ld * 2), dev.alloc(parts * stride * 4)
    ws_bytes = gemm.residual_workspace_bytes(M, N) if split_workspace else 0
    ws = dev.alloc(ws_bytes) if ws_bytes else None
    gemm.residual(A.ptr, K, W.ptr, K, M, N, K, x.ptr, ld, nw.ptr, xn.ptr, ld, ss.ptr, stride,
                  workspace=ws.ptr if ws else 0, workspace_bytes=ws_bytes)
    x_ref = x0.astype(np.float64) + a.astype(np.float64) @ w.astype(np.float64).T
    got_x = dev.download(x, F32, (M, ld))[:, :N]
    _close(got_x, x_ref, False, f"residual x M={M} N={N} K={K}")
    got_xn = _from_bits(dev.download(xn, np.uint16, (M, ld))[:, :N], pf["dtype"])
    _close(got_xn, x_ref * (1.0 + norm_w.astype(np.float64)), True, f"residual xn M={M} N={N} K={K}")
    got_ss = dev.download(ss, F32, (parts, stride))[:, :M]
    ref_ss = np.stack([(x_ref[:, j * tn:(j + 1) * tn] ** 2).sum(1) for j in range(parts)])
    _close(got_ss, ref_ss, False, f"residual ss M={M} N={N} K={K}")


def test_every_block_height_and_the_gemv_agree():
    """Each compiled block height (gemm_<epilogue>_m<rows>) and the few-row GEMV give the same rows_f32 result."""
    dev, pf, gemm = _setup()
    M, N, K = 70, 390, 328
    a_bits, a, w_bits, w, rng = _inputs(M, N, K, 11, pf["dtype"])
    ss, stride, r = _with_ss(dev, pf, M, True, rng)
    A, W, out = dev.upload(a_bits), dev.upload(w_bits), dev.alloc(M * 392 * 4)
    ref = (a.astype(np.float64) @ w.astype(np.float64).T) * r[:, None]
    try:
        for bm in gemm.instances["rows_f32"].heights:
            gemm.block_rows = bm
            dev.memset(out, 0xFF)
            gemm.rows_f32(A.ptr, K, W.ptr, K, M, N, K, int(ss), pf["ss_parts"], stride, out.ptr, 392)
            _close(dev.download(out, F32, (M, 392))[:, :N], ref, False, f"rows_f32 block height {bm}")
    finally:
        gemm.block_rows = None
    for m in (1, 2, 3, 4):  # GEMV rows: row m of A
        dev.memset(out, 0xFF)
        gemm.rows_f32(A.ptr, K, W.ptr, K, m, N, K, int(ss), pf["ss_parts"], stride, out.ptr, 392)
        _close(dev.download(out, F32, (m, 392))[:, :N], ref[:m], False, f"gemv rows_f32 M={m}")

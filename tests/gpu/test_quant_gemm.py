"""The quantised small-batch GEMM (templates/kernels/quant_gemm.cu.j2) on the GPU against numpy.

- rows_f32 over matrix groups of mixed block types (real quantiser scales and random bytes): f32 accumulation of
  exact products, |gpu - ref64| <= 2e-5 * sum_k |A W| per element; with a row scale from RMSNorm partial sums.
- batch invariance: every row of an M-row launch equals, bit for bit, the same row launched alone; the one-row
  weight ring (m1r) equals the register path; so do the staged and the warpgroup-MMA (wgmma) kernels.
- swiglu and residual epilogues, the folded argmax, and the exact zero of padded rows.
- int8 activations ([quant] int8_activations: groups of K-quants alone): numpy's rounding (quant.py
  q8_dequantized) bit for bit through one-hot weights, products against numpy over the rounded activations, batch
  invariance.
Activations in the target's compute dtype: bf16, or fp16 (whose K-quant fragments carry the sub-block scales).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucegen.errors import LucegenError
from lucegen.families.quant_gemm import GEMM_TYPES
from lucegen.model import quant
from lucegen.kernels_ref import from_device_dtype, to_device_dtype
from lucegen.runtime.quant_gemm import QuantGemm, token_groups

from gpu_models import ggml_blocks, gpu_device  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
EPS = 1e-6


@pytest.fixture(scope="module", params=["quantised", "descriptor"])
def qg(request):
    """The GEMM as the quantised target renders it ([quant] compute_dtype: fp16 on sm_90, K-quant fragments carrying
    the sub-block scales), and in the descriptor's own compute_dtype where that differs (bf16: the other chips' path)."""
    device = gpu_device()
    target = device.target.quantised_target()
    if request.param == "descriptor":
        if target is device.target:
            pytest.skip(f"{device.target.name}'s quantised target computes in its compute_dtype")
        target = device.target
    return QuantGemm(device, target, norm_dim=256, eps=EPS)


def raw_blocks(rng, qtype: str, rows: int, k: int, source: str) -> np.ndarray:
    return ggml_blocks(rng, qtype, rows, k, source, value_scale=(0.01, 2), scale_std=0.01).reshape(-1)


def act_bits(qg, x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bits of the target's compute dtype (bf16 or fp16), rounded to nearest even."""
    return to_device_dtype(x, qg.target.compute_dtype).view(np.uint16)


def act_f32(qg, bits: np.ndarray) -> np.ndarray:
    """uint16 bits of the target's compute dtype -> float32 (exact)."""
    dtype = qg.target.compute_dtype
    return from_device_dtype(bits.view(np.float16) if dtype == "fp16" else bits, dtype)


def activations(qg, rng, M: int, K: int) -> np.ndarray:
    """Compute-dtype bits [M, K] of roughly unit values."""
    return act_bits(qg, rng.standard_normal((M, K)).astype(np.float32))


def seen(qg, W, a_bits: np.ndarray) -> np.ndarray:
    """The activations as launches over ``W`` multiply them: the compute dtype's values, int8-rounded per 256 values
    where the group takes int8 activations."""
    a = act_f32(qg, a_bits)
    return quant.q8_dequantized(a) if W.int8 else a


@contextlib.contextmanager
def float_activations(qg):
    """Every group on the float-activation kernels (the twins compared below), whatever [quant] int8_activations."""
    int8, qg.int8 = qg.int8, False
    try:
        yield
    finally:
        qg.int8 = int8


def group(rng, types, rows, K, source):
    segs = [(t, raw_blocks(rng, t, r, K, source), r, 0) for t, r in zip(types, rows)]
    dense = np.concatenate([quant.dequantize(s[1], s[0], s[2] * K).reshape(s[2], K) for s in segs]).astype(np.float64)
    return segs, dense


def run_rows(qg, W, a_bits, ss=None, ss_parts=0, argmax=False):
    d = qg.device
    M, K = a_bits.shape
    N = W.rows
    with d.upload(a_bits) as da, d.alloc(M * N * 4) as dout, d.alloc(16) as dkey, d.alloc(M * K // 8) as dam:
        dss = d.upload(ss) if ss is not None else None
        d.memset(dkey)
        if qg.int8:  # the input's magnitudes per 16 values, as a producer leaves them (read by int8 groups alone)
            qg.amax(da.ptr, K, M, K, dam.ptr)
        qg.rows_f32(da.ptr, K, W, None, M, N, K, dss.ptr if dss else 0, ss_parts, M, dout.ptr, N,
                    argmax_key=dkey.ptr if argmax else 0, a_amax=dam.ptr)
        d.synchronize()
        out = d.download(dout, np.float32, (M, N))
        key = int(d.download(dkey, np.uint64, (1,))[0])
        if dss:
            dss.free()
    return out, key


def check_close(got, A, dense, scale=None):
    ref = A.astype(np.float64) @ dense.T
    bound = 2e-5 * (np.abs(A.astype(np.float64)) @ np.abs(dense.T)) + 1e-30
    if scale is not None:
        ref, bound = ref * scale[:, None], bound * scale[:, None]
    err = np.abs(got - ref)
    assert (err <= bound).all(), f"max err {err.max():.3g}, at bound ratio {(err / bound).max():.3g}"


@SETTINGS
@given(types=st.lists(st.sampled_from(GEMM_TYPES), min_size=1, max_size=4),
       rows=st.lists(st.integers(1, 70), min_size=4, max_size=4), kblocks=st.integers(1, 6),
       M=st.sampled_from([1, 2, 7, 8, 9, 23, 32, 33, 70]), source=st.sampled_from(["quantized", "random"]),
       seed=st.integers(0, 2**32 - 1))
def test_rows_f32_matches_numpy(qg, types, rows, kblocks, M, source, seed):
    rng = np.random.default_rng(seed)
    K = 256 * kblocks
    segs, dense = group(rng, types, rows[: len(types)], K, source)
    W = qg.matrix(segs, K)
    try:
        a = activations(qg, rng, M, K)
        got, _ = run_rows(qg, W, a)
        check_close(got, seen(qg, W, a), dense)
        # batch invariance: each row alone gives the same bits
        for m in sorted({0, M // 2, M - 1}):
            alone, _ = run_rows(qg, W, a[m : m + 1])
            np.testing.assert_array_equal(alone[0].view(np.uint32), got[m].view(np.uint32))
    finally:
        W.free()


@pytest.mark.parametrize("M", [9, 16, 23])
def test_staged_rounds_match_the_plain_kernel(qg, M):
    """A group wide enough for two K parts (four row tiles a block) takes the staged kernel at 9 to 24 rows: its rows
    match numpy and, bit for bit, the same rows launched alone (the one-row kernel reads activations directly). K of
    five blocks leaves the last round with one of its two parts."""
    plain = f"nt{-(-M // 8)}"
    if f"{plain}s" not in qg.kernels:
        pytest.skip(f"{qg.device.target.name} has no staged {plain}")
    qg.use_wgmma = False
    try:
        with float_activations(qg):
            check_against_rows_alone(qg, M, f"{plain}s", ["Q4_K", "Q6_K", "Q5_K"])
    finally:
        qg.use_wgmma = True


def check_against_rows_alone(qg, M, kernel, types):
    """A group of 4 cu + 2 row tiles (two parts give every SM one block's worth of warps) in three segments of block
    ``types`` (densest first: the row tiles' order too) whose boundaries fall on multiples of 4 tiles, the last tile
    partial and the last 4 half empty, takes
    ``kernel`` at M rows: its rows match numpy and, bit for bit, the same rows launched alone (the one-row kernel). K
    of five blocks leaves the last round with one of its two parts."""
    rng = np.random.default_rng(M)
    K = 256 * 5
    cu = qg.device.target.compute_units
    segs, dense = group(rng, types, [32 * cu, 16 * cu, 16 * (cu + 2) - 5], K, "quantized")
    W = qg.matrix(segs, K)
    try:
        a = activations(qg, rng, M, K)
        with qg.device.upload(a) as da:
            assert (qg.parts(W), qg.kernel(W, M, da.ptr, K)[0]) == (2, kernel)
        got, _ = run_rows(qg, W, a)
        check_close(got, act_f32(qg, a), dense)
        for m in range(M):
            alone, _ = run_rows(qg, W, a[m : m + 1])
            np.testing.assert_array_equal(alone[0].view(np.uint32), got[m].view(np.uint32))
    finally:
        W.free()


@pytest.mark.parametrize("M", [9, 16, 23])
def test_wgmma_matches_the_plain_kernel(qg, M):
    """Where the chip has wgmma, a launch of at most two K parts whose warpgroups' row tiles share a block type, and
    whose shared memory leaves two blocks a compute unit, takes the warpgroup-MMA kernel: its rows equal the rows alone
    bit for bit (check_against_rows_alone; three types at 16 tokens, Q4_K alone at 24, whose rounds leave no room for
    larger weight slots), and so do a gate/up pair's SwiGLU rows. A group whose 4-tile groups mix block types keeps
    the other kernels, and so does one whose shared memory leaves one block."""
    name = f"nt{-(-M // 8)}w"
    if name not in qg.kernels:
        pytest.skip(f"{qg.device.target.name} has no wgmma kernels")
    with float_activations(qg):
        check_wgmma(qg, M, name)


def check_wgmma(qg, M, name):
    check_against_rows_alone(qg, M, name, ["Q6_K", "Q5_K", "Q4_K"] if M <= 16 else ["Q4_K"] * 3)
    d, cu = qg.device, qg.device.target.compute_units
    rng = np.random.default_rng(100 + M)
    K = 512
    I = 16 * 8 * cu  # 8 cu row tiles a matrix: a pair takes two parts
    gate, dg = group(rng, ["Q4_K"], [I], K, "quantized")
    up, du = group(rng, ["Q4_K"], [I], K, "quantized")
    Wp = qg.matrix(gate + up, K, pair=True)
    a = activations(qg, rng, M, K)

    def swiglu(rows):
        with d.upload(rows) as da, d.alloc(rows.shape[0] * I * 2) as dout, d.alloc(rows.shape[0] * K // 8) as dam:
            if qg.int8:
                qg.amax(da.ptr, K, rows.shape[0], K, dam.ptr)
            qg.swiglu(da.ptr, K, Wp, None, rows.shape[0], 2 * I, K, 0, 0, rows.shape[0], dout.ptr, I, a_amax=dam.ptr)
            d.synchronize()
            return d.download(dout, np.uint16, (rows.shape[0], I))
    try:
        with d.upload(a) as da:
            assert (qg.parts(Wp), qg.kernel(Wp, M, da.ptr, K)[0]) == (2, name)
        got = swiglu(a)
        A = act_f32(qg, a).astype(np.float64)
        g, u = A @ dg.T, A @ du.T
        want = g / (1 + np.exp(-g)) * u
        assert np.abs(act_f32(qg, got) - want).max() <= 1e-2 * np.abs(want).max() + 1e-6
        for m in sorted({0, M // 2, M - 1}):
            np.testing.assert_array_equal(swiglu(a[m : m + 1])[0], got[m])
    finally:
        Wp.free()
    for types, rows in ((["Q5_K", "Q4_K"], [16 * 4 * cu + 16, 64]), (["Q6_K"], [16 * 4 * cu])):
        Wm = qg.matrix(group(rng, types, rows, K, "quantized")[0], K)
        try:
            with d.upload(a) as da:
                kernel = qg.kernel(Wm, M, da.ptr, K)[0]
            assert kernel.endswith("w") == (types == ["Q6_K"] and M <= 16), (types, kernel)
        finally:
            Wm.free()


def test_ring_matches_the_register_path(qg):
    """A one-row launch over Q6_K alone streams its weights through the warps' rings (m1r): its row matches numpy
    and, bit for bit, the register path (m1) and row 0 of a 9-row launch. A few more row tiles than compute units
    take 8 parts, so K of 7 blocks gives a warp one tile-block or none (fewer than the ring's slots), and the last
    tile is partial."""
    if "m1r" not in qg.kernels:
        pytest.skip(f"{qg.device.target.name} has no weight ring")
    rng = np.random.default_rng(7)
    K = 256 * 7
    tiles = qg.device.target.compute_units + 3
    segs, dense = group(rng, ["Q6_K"], [16 * tiles - 5], K, "quantized")
    W = qg.matrix(segs, K)
    try:
        a = activations(qg, rng, 9, K)
        with qg.device.upload(a) as da:
            assert (qg.parts(W), qg.kernel(W, 1, da.ptr, K)[0]) == (8, "m1r")
        ring, _ = run_rows(qg, W, a[:1])
        check_close(ring, act_f32(qg, a[:1]), dense)
        qg.use_ring = False
        try:
            registers, _ = run_rows(qg, W, a[:1])
        finally:
            qg.use_ring = True
        rows9, _ = run_rows(qg, W, a)
        np.testing.assert_array_equal(ring.view(np.uint32), registers.view(np.uint32))
        np.testing.assert_array_equal(ring[0].view(np.uint32), rows9[0].view(np.uint32))
    finally:
        W.free()


def test_row_scale_and_argmax(qg):
    rng = np.random.default_rng(7)
    K, N = 256, 300
    segs, dense = group(rng, ["Q6_K"], [N], K, "quantized")
    W = qg.matrix(segs, K)
    try:
        a = activations(qg, rng, 1, K)
        parts = 3
        ss = rng.uniform(0.5, 2.0, size=(parts, 1)).astype(np.float32)
        got, key = run_rows(qg, W, a, ss=ss, ss_parts=parts, argmax=True)
        r = np.float32(1) / np.sqrt(np.float32(ss.sum() / 256 + EPS))
        check_close(got, act_f32(qg, a), dense, scale=np.array([r], np.float64))
        assert (~key) & 0xFFFFFFFF == int(np.argmax(got[0]))
    finally:
        W.free()


def test_swiglu_and_residual(qg):
    d = qg.device
    rng = np.random.default_rng(11)
    K, I, M = 512, 40, 9
    gate, dg = group(rng, ["Q4_K"], [I], K, "quantized")
    up, du = group(rng, ["Q4_K"], [I], K, "quantized")
    Wp = qg.matrix(gate + up, K, pair=True)
    a = activations(qg, rng, M, K)
    A = seen(qg, Wp, a).astype(np.float64)
    with d.upload(a) as da, d.alloc(M * I * 2) as dout, d.alloc(M * K // 8) as dam:
        if qg.int8:
            qg.amax(da.ptr, K, M, K, dam.ptr)
        qg.swiglu(da.ptr, K, Wp, None, M, 2 * I, K, 0, 0, M, dout.ptr, I, a_amax=dam.ptr)
        d.synchronize()
        got = act_f32(qg, d.download(dout, np.uint16, (M, I)))
    g, u = A @ dg.T, A @ du.T
    want = g / (1 + np.exp(-g)) * u
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max() + 1e-6
    Wp.free()

    N = 200
    down, dd = group(rng, ["Q6_K"], [N], K, "quantized")
    W = qg.matrix(down, K)
    x0 = rng.standard_normal((M, N)).astype(np.float32)
    norm_w = rng.standard_normal(N).astype(np.float32) * 0.1
    parts, scratch = qg.ss_parts(W), qg.ss_scratch_parts(W)
    assert (parts, scratch, qg.row_totals(M)) == (13, 14, True)
    with d.upload(a) as da, d.upload(x0) as dx, d.upload(norm_w) as dw, d.alloc(M * N * 2) as dxn, \
            d.alloc(scratch * M * 4) as dss:
        for launch in range(2):  # the launch's counters are left at zero: a second one sums alike
            x_in = d.download(dx, np.float32, (M, N))
            qg.residual(da.ptr, K, W, None, M, N, K, dx.ptr, N, dw.ptr, dxn.ptr, N, dss.ptr, M)
            d.synchronize()
            x1 = d.download(dx, np.float32, (M, N))
            xn = act_f32(qg, d.download(dxn, np.uint16, (M, N)))
            ss = d.download(dss, np.float32, (scratch, M))
            check_close(x1 - x_in, act_f32(qg, a), dd)
            np.testing.assert_array_equal(xn, act_f32(qg, act_bits(qg, x1 * (np.float32(1) + norm_w))))
            # parts 0 .. 12: row tile j's 16 columns; part 13: the row's total (the launch's last block added them)
            squares = x1.astype(np.float64) ** 2
            tile_sums = [squares[:, 16 * j : 16 * j + 16].sum(axis=1) for j in range(parts)]
            np.testing.assert_allclose(ss[:parts], np.stack(tile_sums), rtol=1e-5)
            np.testing.assert_allclose(ss[parts], squares.sum(axis=1), rtol=1e-5)
    W.free()


def test_row_totals_equal_a_one_row_readers_sum(qg):
    """A residual of M > 1 rows leaves its rows' totals after the parts, which readers of those M rows take alone;
    a reader of one row adds the parts itself (QuantGemm.row_totals). Both give the same row scale, bit for bit:
    the reader's rows equal the same rows read alone from the parts. 320 row tiles: the 27B's hidden size, more
    parts than a warp's loads in flight in one round."""
    d = qg.device
    rng = np.random.default_rng(5)
    K, N, M = 256, 5120, 9
    down, _ = group(rng, ["Q4_K"], [N], K, "quantized")
    reader, _ = group(rng, ["Q4_K"], [64], N, "quantized")
    Wd, Wr = qg.matrix(down, K), qg.matrix(reader, N)
    parts, scratch = qg.ss_parts(Wd), qg.ss_scratch_parts(Wd)
    assert (parts, scratch) == (320, 321)
    a = activations(qg, rng, M, K)
    x0 = rng.standard_normal((M, N)).astype(np.float32)
    norm_w = np.zeros(N, np.float32)
    try:
        with d.upload(a) as da, d.upload(x0) as dx, d.upload(norm_w) as dw, d.alloc(M * N * 2) as dxn, \
                d.alloc(scratch * M * 4) as dss, d.alloc(M * K // 8) as da_am, d.alloc(M * N // 8) as dam, \
                d.alloc(M * 64 * 4) as dout, d.alloc(M * 64 * 4) as dout1:
            d.memset(dss)
            am = {"a_amax": dam.ptr} if qg.int8 else {}
            if qg.int8:
                qg.amax(da.ptr, K, M, K, da_am.ptr)
            qg.residual(da.ptr, K, Wd, None, M, N, K, dx.ptr, N, dw.ptr, dxn.ptr, N, dss.ptr, M,
                        **({"a_amax": da_am.ptr, "amax_out": dam.ptr} if qg.int8 else {}))
            ss, ss_parts = qg.ss_for_readers(dss.ptr, parts, M, M)
            assert (ss, ss_parts) == (dss.ptr + 4 * parts * M, 1)
            qg.rows_f32(dxn.ptr, N, Wr, None, M, 64, N, ss, ss_parts, M, dout.ptr, 64, **am)
            for m in range(M):  # row m alone: its parts, added by the reader
                assert qg.ss_for_readers(dss.ptr + 4 * m, parts, M, 1) == (dss.ptr + 4 * m, parts)
                qg.rows_f32(dxn.ptr + 2 * m * N, N, Wr, None, 1, 64, N, dss.ptr + 4 * m, parts, M,
                            dout1.ptr + 4 * m * 64, 64, **({"a_amax": dam.ptr + 2 * m * (N // 16)} if qg.int8 else {}))
            d.synchronize()
            together = d.download(dout, np.float32, (M, 64))
            alone = d.download(dout1, np.float32, (M, 64))
            totals = d.download(dss, np.float32, (scratch, M))[parts]
            x1 = d.download(dx, np.float32, (M, N)).astype(np.float64)
    finally:
        Wd.free()
        Wr.free()
    np.testing.assert_array_equal(together.view(np.uint32), alone.view(np.uint32))
    assert np.abs(together).max() > 0
    np.testing.assert_allclose(totals, (x1 ** 2).sum(axis=1), rtol=1e-5)


@pytest.mark.parametrize("M", [9, 23])
def test_totals_by_reader_equal_the_residuals_own(M):
    """QuantGemm.residual(totals_by_reader=True) leaves its rows' RMSNorm totals to the next launch: the quantiser of
    a prequantised reader makes them beside its bytes, any other reader in a launch of their own first. Either way the
    totals and the reader's rows equal those of a residual that made them itself, bit for bit."""
    qg = int8_qg(gpu_device())
    d, rng = qg.device, np.random.default_rng(60 + M)
    K, N = 256, 5120
    Wd = qg.matrix(group(rng, ["Q4_K"], [N], K, "quantized")[0], K, int8=True)
    reader = group(rng, ["Q4_K"], [64], N, "quantized")[0]
    Wq, Wf = qg.matrix(reader, N, int8=True), qg.matrix(reader, N)  # int8 (prequantised at M) and float readers
    parts, scratch = qg.ss_parts(Wd), qg.ss_scratch_parts(Wd)
    a = activations(qg, rng, M, K)
    x0 = rng.standard_normal((M, N)).astype(np.float32)
    norm_w = rng.standard_normal(N).astype(np.float32) * 0.1

    def run(W, by_reader):
        with d.upload(a) as da, d.upload(x0) as dx, d.upload(norm_w) as dw, d.alloc(M * N * 2) as dxn, \
                d.alloc(scratch * M * 4) as dss, d.alloc(M * K // 8) as da_am, d.alloc(M * N // 8) as dam, \
                d.alloc(M * 64 * 4) as dout:
            d.memset(dss)
            qg.amax(da.ptr, K, M, K, da_am.ptr)
            due = qg.residual(da.ptr, K, Wd, None, M, N, K, dx.ptr, N, dw.ptr, dxn.ptr, N, dss.ptr, M,
                              a_amax=da_am.ptr, amax_out=dam.ptr, totals_by_reader=by_reader)
            assert (due is not None) == by_reader
            qg.rows_f32(dxn.ptr, N, W, None, M, 64, N, *qg.ss_for_readers(dss.ptr, parts, M, M), M, dout.ptr, 64,
                        a_amax=dam.ptr, totals=due)
            d.synchronize()
            return d.download(dss, np.float32, (scratch, M)), d.download(dout, np.float32, (M, 64))

    try:
        with d.upload(a) as da:
            assert qg.quantiser_totals(M) and qg.kernels[qg.kernel(Wq, M, da.ptr, N)[0]].prequantised
            assert not qg.kernels[qg.kernel(Wf, M, da.ptr, N)[0]].prequantised
        for W in (Wq, Wf):
            ss_own, out_own = run(W, False)
            ss_by_reader, out_by_reader = run(W, True)
            np.testing.assert_array_equal(ss_by_reader.view(np.uint32), ss_own.view(np.uint32))
            np.testing.assert_array_equal(out_by_reader.view(np.uint32), out_own.view(np.uint32))
            assert np.abs(out_own).max() > 0 and ss_own[parts].min() > 0
    finally:
        for W in (Wd, Wq, Wf):
            W.free()


def int8_qg(device) -> QuantGemm:
    """The GEMM of the device's quantised target with [quant] int8_activations on (whatever its descriptor chose),
    where the chip can have it."""
    t = device.target
    if t.quant is None or t.quant.compute_dtype != "fp16" or (t.compute_capability or (0, 0)) < (8, 0):
        pytest.skip(f"{t.name} cannot take int8 activations (mma m16n8k32 s8 on fp16 activations)")
    target = dataclasses.replace(t, quant=dataclasses.replace(t.quant, int8_activations=True)).quantised_target()
    qg = QuantGemm(device, target, norm_dim=256, eps=EPS)
    assert qg.int8
    return qg


def one_hot_q4k(K: int) -> np.ndarray:
    """Q4_K rows n = 0 .. K - 1 with W[n, k] = (k == n): d = 1, dmin = 0, every sub-block's scale 1 and min 0, value
    1 at k = n. A launch over them returns the activations as the kernel quantised them, through one float product."""
    blocks = np.zeros((K, K // 256, 144), np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(1).tobytes(), np.uint8)
    blocks[:, :, 4:16] = quant.pack_k_scales(np.ones((1, 8), np.uint8), np.zeros((1, 8), np.uint8))[0]
    n = np.arange(K)
    b, s, l = n // 256, n % 256 // 32, n % 32
    blocks[n, b, 16 + 32 * (s // 2) + l] = np.where(s % 2, 0x10, 0x01)
    return blocks.reshape(-1)


def test_int8_rounding_matches_numpy_bit_for_bit():
    """One-hot Q4_K rows (one_hot_q4k) read the int8 activations back: every value equals quant.q8_dequantized's, bit
    for bit, for rows of ordinary values, zeros, fp16 subnormals (inv saturates at 65504), the largest fp16 values,
    and ties (x inv an odd half: rounded to even), at 1 and 19 rows."""
    qg = int8_qg(gpu_device())
    rng = np.random.default_rng(3)
    K = 512
    W = qg.matrix([("Q4_K", one_hot_q4k(K), K, 0)], K, int8=True)
    try:
        assert W.int8
        a = rng.standard_normal((19, K)).astype(np.float32)
        a[1] = 0
        a[2] *= 1e-7
        a[3] = np.clip(a[3] * 3e4, -65504, 65504)
        a[4, :256] = 0
        a[5] = (2 * rng.integers(-127, 127, K) + 1) / 4  # amax 63.5: inv = 2, x inv = n + 1/2 (ties) elsewhere
        a[5, 0] = a[5, 256] = 63.5
        bits = act_bits(qg, a)
        want = quant.q8_dequantized(act_f32(qg, bits))
        assert np.abs(quant.q8_activations(act_f32(qg, bits))[0][5]).max() == 127
        for rows in (bits[:1], bits):
            got, _ = run_rows(qg, W, rows)
            np.testing.assert_array_equal(got.view(np.uint32), want[: len(rows)].view(np.uint32))
    finally:
        W.free()


@pytest.mark.parametrize("M", [1, 9, 23, 32, 33])
def test_int8_groups_match_numpy_and_rows_alone(M):
    """Groups of K-quants alone (Q4_K, Q5_K, Q6_K) take nt<N>q at every row count, within check_close of numpy's
    product of the int8-rounded activations, each row bit for bit the row alone (33 rows: two row groups of nt3). A
    group with a Q8_0 segment keeps float activations."""
    qg = int8_qg(gpu_device())
    rng = np.random.default_rng(M)
    K = 256 * 6
    cu = qg.device.target.compute_units
    segs, dense = group(rng, ["Q5_K", "Q4_K", "Q6_K", "Q4_K"], [8 * cu + 5, 8 * cu, 16 * cu - 3, 40], K, "quantized")
    W = qg.matrix(segs, K, int8=True)
    mixed = qg.matrix(group(rng, ["Q4_K", "Q8_0"], [32, 32], K, "quantized")[0], K, int8=True)
    try:
        a = activations(qg, rng, M, K)
        with qg.device.upload(a) as da:
            assert qg.kernel(W, M, da.ptr, K)[0] == (f"nt{token_groups(M)}q6p" if M > 8 else "m1q6")  # holds Q6_K
            assert not mixed.int8 and not qg.kernel(mixed, M, da.ptr, K)[0].endswith("q")
        got, _ = run_rows(qg, W, a)
        check_close(got, seen(qg, W, a), dense)
        for m in sorted({0, M // 2, M - 1}):
            alone, _ = run_rows(qg, W, a[m : m + 1])
            np.testing.assert_array_equal(alone[0].view(np.uint32), got[m].view(np.uint32))
    finally:
        W.free()
        mixed.free()


@pytest.mark.parametrize("M", [1, 23])
def test_int8_q6k_extremes(M):
    """Q6_K on int8 activations at the ends of its ranges: values q - 32 of -32 and 31, scales -128 and 127, every
    activation at its 256 values' magnitude (qa = +-127), so each block's integer sum is as large as it gets. The
    rows equal numpy's product of the int8-rounded activations within check_close."""
    qg = int8_qg(gpu_device())
    rng = np.random.default_rng(11)
    K, N = 256 * 4, 48
    blocks = np.zeros((N, K // 256, 210), np.uint8)
    q = np.where(rng.random((N, K // 256, 256)) < 0.5, 0, 63).astype(np.uint8)  # values -32, 31
    q[: N // 2] = 0  # half the rows at -32 throughout: sums of one sign
    # GGML's Q6_K layout (quant.py), written from the values
    for h in range(2):
        v = q[..., 128 * h : 128 * (h + 1)]
        blocks[..., 64 * h : 64 * h + 32] = (v[..., 0:32] & 15) | ((v[..., 64:96] & 15) << 4)
        blocks[..., 64 * h + 32 : 64 * h + 64] = (v[..., 32:64] & 15) | ((v[..., 96:128] & 15) << 4)
        blocks[..., 128 + 32 * h : 160 + 32 * h] = ((v[..., 0:32] >> 4) | ((v[..., 32:64] >> 4) << 2)
                                                    | ((v[..., 64:96] >> 4) << 4) | ((v[..., 96:128] >> 4) << 6))
    scales = np.where(rng.random((N, K // 256, 16)) < 0.5, -128, 127).astype(np.int8)
    scales[: N // 2] = -128
    blocks[..., 192:208] = scales.view(np.uint8)
    blocks[..., 208:210] = np.frombuffer(np.float16(1e-4).tobytes(), np.uint8)
    raw = blocks.reshape(-1)
    dense = quant.dequantize(raw, "Q6_K", N * K).reshape(N, K).astype(np.float64)
    np.testing.assert_array_equal(dense[: N // 2], np.float64(np.float32(np.float16(1e-4)) * np.float32(-128 * -32)))
    W = qg.matrix([("Q6_K", raw, N, 0)], K, int8=True)
    try:
        assert W.int8
        signs = np.where(rng.random((M, K)) < 0.5, -1.0, 1.0)
        signs[0] = 1.0  # row 0: every product of the first rows positive
        a = act_bits(qg, (3.0 * signs).astype(np.float32))
        got, _ = run_rows(qg, W, a)
        check_close(got, seen(qg, W, a), dense)
    finally:
        W.free()


def test_int8_one_group_residencies_give_the_same_bits():
    """A launch of one int8 token group over 4 cu row tiles (Q5_K and Q4_K, the last tile partial) takes nt1q at 4
    resident blocks a compute unit (nt1q_r4: one wave, not two of 3; one row: m1q_r4): its rows, one at a time and 5
    at once, equal nt1q's bit for bit, and a 9-row launch's (nt2q)."""
    qg = int8_qg(gpu_device())
    if "nt1q_r4" not in qg.kernels:
        pytest.skip(f"{qg.device.target.name} has no nt1q_r4")
    rng = np.random.default_rng(17)
    K, cu = 256 * 6, qg.device.target.compute_units
    segs, dense = group(rng, ["Q5_K", "Q4_K"], [16 * 2 * cu, 16 * 2 * cu - 7], K, "quantized")
    W = qg.matrix(segs, K, int8=True)
    try:
        a = activations(qg, rng, 9, K)
        with qg.device.upload(a) as da:
            assert [qg.kernel(W, M, da.ptr, K)[0] for M in (1, 5)] == ["m1q_r4", "nt1q_r4"]
        rows = np.stack([run_rows(qg, W, a[m : m + 1])[0][0] for m in range(5)])
        five, _ = run_rows(qg, W, a[:5])
        nine, _ = run_rows(qg, W, a)
        check_close(nine, seen(qg, W, a), dense)
        qg._one_group_residency = lambda *args: "nt1q"
        want, _ = run_rows(qg, W, a[:5])
        for got in (rows, five, nine[:5]):
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    finally:
        W.free()


@pytest.mark.parametrize("M", [9, 23, 70])
@pytest.mark.parametrize("types", [["Q4_K"], ["Q5_K", "Q4_K"], ["Q6_K"], ["Q4_K", "Q6_K"]])
def test_prequantised_kernels_equal_nt_q(types, M):
    """From 9 rows an int8 group takes nt<N>qp (nt<N>q6p with Q6_K): quant_gemm_q8_rows quantises the activations
    once and the warps stream them through their rings. Its rows equal nt<N>q's bit for bit, with partial token groups
    (70 rows: three row groups of nt3, the last of 22 rows) and a partial last row tile, and numpy's product within
    check_close."""
    qg = int8_qg(gpu_device())
    rng = np.random.default_rng(M + len(types) + 7 * ("Q6_K" in types))
    K = 256 * 12
    segs, dense = group(rng, types, [16 * 20 + 9] * len(types), K, "quantized")
    W = qg.matrix(segs, K, int8=True)
    name = f"nt{token_groups(M)}q{'6' if 'Q6_K' in types else ''}"
    try:
        a = activations(qg, rng, M, K)
        got = {}
        for prequantised in (True, False):
            qg.use_prequantised = prequantised
            with qg.device.upload(a) as da:
                assert qg.kernel(W, M, da.ptr, K)[0] == name + ("p" if prequantised else "")
            got[prequantised], _ = run_rows(qg, W, a)
        check_close(got[True], seen(qg, W, a), dense)
        np.testing.assert_array_equal(got[True].view(np.uint32), got[False].view(np.uint32))
    finally:
        qg.use_prequantised = True
        W.free()


@pytest.mark.parametrize("types", [["Q4_K"], ["Q5_K", "Q4_K"], ["Q6_K"], ["Q4_K", "Q6_K"]])
def test_one_row_int8_kernels_equal_nt1q(types):
    """At one row an int8 group takes m1q (m1q6 with Q6_K), whose MMA columns hold sub-blocks rather than tokens: its
    rows equal nt1q's (nt1q6's) bit for bit, at 20 blocks of K (the 27B's hidden size) with a partial last row tile,
    at either residency, and numpy's product within check_close."""
    qg = int8_qg(gpu_device())
    rng = np.random.default_rng(len(types) + 7 * ("Q6_K" in types))
    K = 256 * 20
    segs, dense = group(rng, types, [16 * 30 + 9] * len(types), K, "quantized")
    W = qg.matrix(segs, K, int8=True)
    own = "6" if "Q6_K" in types else ""
    try:
        a = activations(qg, rng, 1, K)
        got = {}
        for one_row in (True, False):
            qg.use_one_row = one_row
            with qg.device.upload(a) as da:
                assert qg.kernel(W, 1, da.ptr, K)[0] == f"{'m1' if one_row else 'nt1'}q{own}"
            got[one_row], _ = run_rows(qg, W, a)
        check_close(got[True], seen(qg, W, a), dense)
        np.testing.assert_array_equal(got[True].view(np.uint32), got[False].view(np.uint32))
        qg.use_one_row = True
        qg._one_group_residency = lambda *args: f"m1q{own}_r4"  # the other residency: the same code
        r4, _ = run_rows(qg, W, a)
        np.testing.assert_array_equal(r4.view(np.uint32), got[False].view(np.uint32))
    finally:
        W.free()


@pytest.mark.parametrize("M", [1, 9, 23])
def test_int8_residual_takes_x_and_norm_weights_copied_early(M):
    """An int8 residual copies its x rows and norm weights into shared memory while the weights stream (the template's
    early_in) and a one-row reader its ss parts: x gains numpy's product of the int8-rounded activations, xn is x (1 +
    norm_w) rounded, the columns past N stay as they were, and each row equals the row launched alone, bit for bit.
    (A one-row reader's early ss parts: test_row_totals_equal_a_one_row_readers_sum.)"""
    qg = int8_qg(gpu_device())
    d, rng = qg.device, np.random.default_rng(40 + M)
    K, N, LD = 512, 200, 208  # the last row tile holds 8 of its 16 columns
    segs, dense = group(rng, ["Q4_K"], [N], K, "quantized")
    W = qg.matrix(segs, K, int8=True)
    a = activations(qg, rng, M, K)
    x0 = rng.standard_normal((M, LD)).astype(np.float32)
    norm_w = rng.standard_normal(LD).astype(np.float32) * 0.1

    def residual(rows):
        m = len(rows)
        with d.upload(a[rows]) as da, d.alloc(m * K // 8) as dam, d.upload(np.ascontiguousarray(x0[rows])) as dx, \
                d.upload(norm_w) as dw, d.alloc(m * LD * 2) as dxn, d.alloc(m * LD // 8) as dxn_am, \
                d.alloc(qg.ss_scratch_parts(W) * m * 4) as dss:
            qg.amax(da.ptr, K, m, K, dam.ptr)
            qg.residual(da.ptr, K, W, None, m, N, K, dx.ptr, LD, dw.ptr, dxn.ptr, LD, dss.ptr, m, a_amax=dam.ptr,
                        amax_out=dxn_am.ptr)
            d.synchronize()
            return d.download(dx, np.float32, (m, LD)), d.download(dxn, np.uint16, (m, LD))

    try:
        with d.upload(a) as da:
            assert qg.kernel(W, M, da.ptr, K)[0].startswith(f"nt{-(-M // 8)}q" if M > 1 else "m1q")
        x1, xn = residual(list(range(M)))
        check_close(x1[:, :N] - x0[:, :N], seen(qg, W, a), dense)
        np.testing.assert_array_equal(x1[:, N:], x0[:, N:])
        np.testing.assert_array_equal(xn[:, :N], act_bits(qg, x1 * (np.float32(1) + norm_w))[:, :N])
        for m in sorted({0, M // 2, M - 1}):
            x_alone, xn_alone = residual([m])
            np.testing.assert_array_equal(x_alone[0].view(np.uint32), x1[m].view(np.uint32))
            np.testing.assert_array_equal(xn_alone[0, :N], xn[m, :N])
    finally:
        W.free()


def test_int8_magnitudes_from_producers_give_the_same_bits():
    """QgAmax: quant_gemm_amax's magnitudes per 16 values, and those the residual and swiglu epilogues write beside
    their outputs, equal numpy's; an int8 launch without them is refused."""
    qg = int8_qg(gpu_device())
    d, rng = qg.device, np.random.default_rng(5)
    M, K, I, N = 11, 512, 80, 200

    def magnitudes(bits):
        return act_bits(qg, np.abs(act_f32(qg, bits)).reshape(bits.shape[0], -1, 16).max(axis=-1))

    a = activations(qg, rng, M, K)
    segs, dense = group(rng, ["Q4_K", "Q5_K"], [40, 30], K, "quantized")
    W = qg.matrix(segs, K, int8=True)
    gate, up = group(rng, ["Q4_K"], [I], K, "quantized")[0], group(rng, ["Q4_K"], [I], K, "quantized")[0]
    Wp = qg.matrix(gate + up, K, pair=True, int8=True)
    down = qg.matrix(group(rng, ["Q4_K"], [N], 256, "quantized")[0], 256, int8=True)
    try:
        with d.upload(a) as da, d.alloc(M * K // 8) as dam, d.alloc(M * W.rows * 4) as dout:
            with pytest.raises(LucegenError, match="a_amax"):
                qg.rows_f32(da.ptr, K, W, None, M, W.rows, K, 0, 0, M, dout.ptr, W.rows)
            qg.amax(da.ptr, K, M, K, dam.ptr)
            d.synchronize()
            np.testing.assert_array_equal(d.download(dam, np.uint16, (M, K // 16)), magnitudes(a))
            with d.alloc(M * 256 * 2) as dact, d.alloc(M * 256 // 8) as dact_am:  # I = 80 of 256 columns a row
                d.memset(dact)
                d.memset(dact_am)
                qg.swiglu(da.ptr, K, Wp, None, M, 2 * I, K, 0, 0, M, dact.ptr, 256, a_amax=dam.ptr,
                          amax_out=dact_am.ptr)
                d.synchronize()
                act = d.download(dact, np.uint16, (M, 256))
                np.testing.assert_array_equal(d.download(dact_am, np.uint16, (M, 16))[:, : I // 16],
                                              magnitudes(act)[:, : I // 16])
                x0 = rng.standard_normal((M, 208)).astype(np.float32)  # N = 200 of 208 columns: a partial group
                norm_w = rng.standard_normal(208).astype(np.float32) * 0.1
                with d.upload(x0) as dx, d.upload(norm_w) as dw, d.alloc(M * 208 * 2) as dxn, \
                        d.alloc(M * 208 // 8) as dxn_am, d.alloc(qg.ss_scratch_parts(down) * M * 4) as dss:
                    d.memset(dxn)
                    qg.residual(dact.ptr, 256, down, None, M, N, 256, dx.ptr, 208, dw.ptr, dxn.ptr, 208, dss.ptr, M,
                                a_amax=dact_am.ptr, amax_out=dxn_am.ptr)
                    d.synchronize()
                    xn = d.download(dxn, np.uint16, (M, 208))
                    np.testing.assert_array_equal(d.download(dxn_am, np.uint16, (M, 13)), magnitudes(xn))
    finally:
        for m in (W, Wp, down):
            m.free()

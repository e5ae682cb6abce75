"""Prefill Gated DeltaNet kernels (templates/prefill/deltanet.cu.j2) against reference.gated_delta_net's math without
the projections: random proj rows [qkv | z | a | b] go in, with a random nonzero conv state and recurrent state; the
gated output rows, the new conv state and the new recurrent state come out and are compared with the reference pieces
(causal_conv1d_silu, l2norm, gated_delta_rule, gated_rms_norm).

Tolerances. Conv state: a copy of inputs, bit-exact. Recurrent state: every kernel works in f32; the chunked form
reassociates sums of O(dk * chunk) products of bounded terms (l2-normalised q, k; beta <= 1; decays <= 1), and expf /
rsqrtf are within 2 ulp, so we allow 1e-3 * max |ref| (observed ~1e-6 relative). Output rows: the same f32 error, then
one rounding to the compute dtype (2^-9 relative for bf16): max |err| <= 1e-2 * max |ref|. The decays are drawn as in
real checkpoints (A = exp(A_log) in [0.5, 4], softplus(a + dt_bias) ~ 0.005 .. 0.3), so the state carries across many
chunks and an error in the inter-chunk recurrence or in a pad row shows far above these bounds.

``python3 tests/gpu/test_prefill_deltanet.py [scan_tile ...] [chunk=N ...] [T=N ...]`` times the kernels (CUDA graphs
+ events) for 0.8B, by default at T = 520, 4096, 32768.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lucegen.model.config import ModelConfig
from lucegen.model.dtypes import bf16_bits_to_f32
from lucegen.model.reference import (causal_conv1d_silu, gated_delta_rule, gated_rms_norm, l2norm, sigmoid,
                                     softplus)

from gpu_models import gpu_device  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

F32 = np.float32


@functools.cache
def kernels(preset: str, chunk: int | None = None, scan_tile: int | None = None):
    from lucegen.families.prefill import prefill_params
    from lucegen.runtime.prefill.deltanet import DeltaNetKernels

    dev = gpu_device()
    config = ModelConfig.preset(preset)
    pf = prefill_params(config, dev.target)
    if chunk:
        pf = dict(pf, chunk=chunk)
    return DeltaNetKernels(dev, dev.target, pf, scan_tile=scan_tile), pf, config


def from_dtype_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_bits_to_f32(bits) if dtype == "bf16" else bits.view(np.float16).astype(F32)


def random_layer(pf, rng, T):
    nv, dv, dk, ck, cd = pf["NV"], pf["DV"], pf["DK"], pf["CK"], pf["CD"]
    return dict(
        proj=rng.standard_normal((T, pf["NIN_DN"])).astype(F32),
        conv_w=(rng.standard_normal((cd, ck)) * 0.5).astype(F32),
        a_log=np.log(rng.uniform(0.5, 4.0, nv)).astype(F32),
        dt_bias=np.log(np.expm1(rng.uniform(0.005, 0.1, nv))).astype(F32),
        gnorm_w=rng.normal(1.0, 0.2, dv).astype(F32),
        conv_state=rng.standard_normal((cd, ck - 1)).astype(F32),
        recurrent=(rng.standard_normal((nv, dv, dk)) * 0.5).astype(F32),  # [h][j][i] = S[h][i][j]
    )


def reference(pf, layer):
    """(out [T, VD] f32, new conv state [CD, CK-1], new recurrent [NV, DV, DK]) per reference.gated_delta_net."""
    proj = layer["proj"]
    T = proj.shape[0]
    nk, nv, dk, dv, kd, cd, vd = (pf[x] for x in ("NK", "NV", "DK", "DV", "KD", "CD", "VD"))
    proj_a = proj[:, cd + vd: cd + vd + nv] * F32(0.5)  # (the a columns are scaled in run_kernels too)
    mixed, conv = causal_conv1d_silu(proj[:, :cd], layer["conv_state"], layer["conv_w"])
    z = proj[:, cd: cd + vd].reshape(T, nv, dv)
    b = proj[:, cd + vd + nv:]
    q = np.repeat(mixed[:, :kd].reshape(T, nk, dk), nv // nk, axis=1)
    k = np.repeat(mixed[:, kd: 2 * kd].reshape(T, nk, dk), nv // nk, axis=1)
    v = mixed[:, 2 * kd:].reshape(T, nv, dv)
    g = (-np.exp(layer["a_log"]) * softplus(proj_a + layer["dt_bias"])).astype(F32)
    q = l2norm(q) * F32(1 / np.sqrt(dk))
    k = l2norm(k)
    state = np.ascontiguousarray(layer["recurrent"].transpose(0, 2, 1))  # HF layout [h][i][j]
    o = gated_delta_rule(q, k, v, g, sigmoid(b), state)
    out = gated_rms_norm(o, z, layer["gnorm_w"], float(pf["EPS"]))
    return out.reshape(T, vd), conv, state.transpose(0, 2, 1)


def run_kernels(dn, pf, layer):
    dev = gpu_device()
    proj = layer["proj"].copy()
    cd, vd, nv = pf["CD"], pf["VD"], pf["NV"]
    proj[:, cd + vd: cd + vd + nv] *= F32(0.5)  # a: realistic softplus(a + dt_bias) ~ 0.005 .. 0.3
    T = proj.shape[0]
    names = ("conv_w", "a_log", "dt_bias", "gnorm_w", "conv_state", "recurrent")
    bufs = {n: dev.upload(layer[n]) for n in names}
    bufs["proj"] = dev.upload(proj)
    out = dev.alloc(T * vd * 2)
    ws = dev.alloc(dn.workspace_bytes(T))
    try:
        dev.memset(out, 0xFF)  # NaN bits: every element must be written
        dev.memset(ws, 0xFF)  # NaN workspace: pad rows must be written before they are read
        dn.run(proj=bufs["proj"].ptr, T=T, conv_w=bufs["conv_w"].ptr, a_log=bufs["a_log"].ptr,
               dt_bias=bufs["dt_bias"].ptr, gnorm_w=bufs["gnorm_w"].ptr, conv_state=bufs["conv_state"].ptr,
               recurrent=bufs["recurrent"].ptr, out=out.ptr, workspace=ws.ptr)
        dev.synchronize()
        got = from_dtype_bits(dev.download(out, np.uint16, (T, vd)), pf["dtype"])
        conv = dev.download(bufs["conv_state"], F32, layer["conv_state"].shape)
        rec = dev.download(bufs["recurrent"], F32, layer["recurrent"].shape)
    finally:
        for b in (*bufs.values(), out, ws):
            b.free()
    return got, conv, rec


def check_deltanet(preset: str, T: int, seed: int, chunk: int | None = None, scan_tile: int | None = None) -> None:
    dn, pf, _ = kernels(preset, chunk, scan_tile)
    layer = random_layer(pf, np.random.default_rng(seed), T)
    got, conv, rec = run_kernels(dn, pf, layer)
    out_ref, conv_ref, rec_ref = reference(pf, layer)
    where = f"({preset}, T={T}, chunk={pf['chunk']}, seed={seed})"
    assert np.array_equal(conv, conv_ref), f"conv state differs {where}"
    assert np.all(np.isfinite(rec)), f"non-finite recurrent state {where}"
    err, scale = np.max(np.abs(rec - rec_ref)), np.max(np.abs(rec_ref))
    assert err <= 1e-3 * scale, f"recurrent state: max |err| {err:.3g} vs max |ref| {scale:.3g} {where}"
    assert np.all(np.isfinite(got)), f"non-finite output rows {where}"
    err, scale = np.max(np.abs(got - out_ref)), np.max(np.abs(out_ref))
    assert err <= 1e-2 * scale, f"output rows: max |err| {err:.3g} vs max |ref| {scale:.3g} {where}"


SETTINGS = settings(max_examples=int(os.environ.get("LUCEGEN_HYPOTHESIS_EXAMPLES", "8")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("preset", ["tiny", "tiny-gqa"])
@SETTINGS
@given(T=st.integers(1, 600), seed=st.integers(0, 2**31 - 1))
@example(T=1, seed=1)
@example(T=2, seed=2)  # T < CK - 1: the conv window shifts partially
@example(T=64, seed=3)
@example(T=65, seed=4)
def test_deltanet_tiny(preset, T, seed):
    check_deltanet(preset, T, seed)


@SETTINGS
@given(T=st.integers(1, 600), seed=st.integers(0, 2**31 - 1))
@example(T=1, seed=5)
@example(T=520, seed=6)
def test_deltanet_08b(T, seed):
    check_deltanet("qwen3.5-0.8b", T, seed)


@pytest.mark.parametrize("chunk,scan_tile,T", [(16, None, 37), (32, None, 101), (32, 8, 70), (64, 32, 130)])
def test_deltanet_other_chunks_and_tiles(chunk, scan_tile, T):
    """The chunk sizes other descriptors pick (sm_75: 32) and other scan tiles, on this chip."""
    check_deltanet("tiny-gqa", T, seed=T, chunk=chunk, scan_tile=scan_tile)


def bench(lengths=(520, 4096, 32768), scan_tiles=(None,), reps=20, chunks=(None,)) -> None:
    """Per-layer GPU time of DeltaNetKernels.run for 0.8B: CUDA graphs (no host launch overhead) timed with CUDA
    events, mean of ``reps``; per kernel, a graph of that kernel alone."""
    dev = gpu_device()
    for chunk, scan_tile in ((c, t) for c in chunks for t in scan_tiles):
        dn, pf, _ = kernels("qwen3.5-0.8b", chunk, scan_tile)
        rng = np.random.default_rng(0)
        for T in lengths:
            layer = random_layer(pf, rng, 1)
            proj = dev.upload((rng.standard_normal((T, pf["NIN_DN"])) * 0.5).astype(F32))
            bufs = {n: dev.upload(layer[n]) for n in ("conv_w", "a_log", "dt_bias", "gnorm_w", "conv_state",
                                                        "recurrent")}
            out, ws = dev.alloc(T * pf["VD"] * 2), dev.alloc(dn.workspace_bytes(T))
            stream = dev.stream()
            args = dict(proj=proj.ptr, T=T, conv_w=bufs["conv_w"].ptr, a_log=bufs["a_log"].ptr,
                        dt_bias=bufs["dt_bias"].ptr, gnorm_w=bufs["gnorm_w"].ptr, conv_state=bufs["conv_state"].ptr,
                        recurrent=bufs["recurrent"].ptr, out=out.ptr, workspace=ws.ptr, stream=stream)
            fns = {"conv_prepare": dn.conv_fn, "chunk_prepare": dn.prepare_fn, "chunk_scan": dn.scan_fn,
                   "chunk_output": dn.output_fn, "gated_norm": dn.norm_fn}

            def graph_us(only=None):
                saved = {}
                if only:
                    for name, fn in fns.items():
                        if name != only:
                            saved[name] = fn.launch
                            fn.launch = lambda *a, **k: None
                try:
                    stream.begin_capture()
                    dn.run(**args)
                    graph = stream.end_capture()
                finally:
                    for name, orig in saved.items():
                        del fns[name].launch
                graph.launch(stream)
                ev = [dev.event() for _ in range(2)]
                ev[0].record(stream)
                for _ in range(reps):
                    graph.launch(stream)
                ev[1].record(stream)
                ev[1].synchronize()
                graph.destroy()
                return ev[0].elapsed_ms(ev[1]) * 1e3 / reps

            total = graph_us()
            parts = {name: round(graph_us(name), 1) for name in fns}
            print(f"deltanet 0.8B T={T} chunk={pf['chunk']} scan_tile={dn.scan_tile} scan_smem={dn.scan_smem}: "
                  f"{total:.1f} us/layer "
                  f"({total / T * 1e3:.2f} ns/token); per kernel (us): {parts}", flush=True)
            for b in (proj, *bufs.values(), out, ws):
                b.free()
            stream.destroy()


if __name__ == "__main__":
    tiles = tuple(int(x) for x in sys.argv[1:] if x.isdigit()) or (None,)
    chunks = tuple(int(x[6:]) for x in sys.argv[1:] if x.startswith("chunk=")) or (None,)
    lengths = tuple(int(x[2:]) for x in sys.argv[1:] if x.startswith("T=")) or (520, 4096, 32768)
    bench(lengths=lengths, scan_tiles=tiles, chunks=chunks)

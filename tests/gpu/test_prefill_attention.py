"""Prefill attention kernels (templates/prefill/attention.cu.j2) against reference.gated_attention's math without the
projections: random proj rows [q_proj (query | gate per head) | k | v] go in; the KV cache entries of positions
pos0 .. pos0+T-1 and the gated attention rows come out. The cache is pre-filled with random values (a chunked prompt
continuing from earlier segments) and entries outside the written window must stay bit-identical.

Tolerances. Cache entries: the kernel computes k = rope(rms_norm_1p(k)) in f32 and rounds once to the cache dtype, so
each entry is within half an ulp of the f32 reference (2^-8 relative for bf16, 2^-11 for fp16) up to f32 reordering;
we allow 1.05 x that plus 1e-6. Attention rows: the reference uses the cache values the kernel wrote (decode reads the
same) and q rounded to the compute dtype as the MMA takes it; what remains is P rounded to the compute dtype before
P V (2^-9 relative per weight), f32 accumulation order and the output rounding (2^-9): max |err| <= 1e-2 * max |ref|.
The q/k norm weights are drawn so that scores spread over several units: the softmax is peaked, so a wrong causal mask
(one future key) or a wrong GQA head changes rows by far more than the tolerance.

A quantised cache (lucegen/model/kv_cache.py) is pre-filled with random rows in its format and read back through
kv_cache.decode_layers: a written entry may sit one code from numpy's quantisation of the reference's k / v (the two
quantise nearly equal inputs), and the attention reference takes the cache as written. For a rotated format (tq3_0)
the reference works in the cache's rotated blocks as the kernels do (q rotated, then rounded as the MMA takes it; the
output rotated back).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lucegen.model import kv_cache
from lucegen.model.config import ModelConfig
from lucegen.model.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from lucegen.model.reference import apply_rope, rms_norm_1p, rope_inv_freq, sigmoid

from gpu_models import gpu_device  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

F32 = np.float32


@functools.cache
def kernels(preset: str, instruction: str | None = None, kv: str | None = None):
    """AttentionKernels for ``preset`` on this GPU; ``instruction="simt"`` renders the FMA body (the AMD path) for
    the same chip, so that it too is checked on a device; ``kv`` a KV cache format other than the descriptor's."""
    from lucegen.families.prefill import prefill_params
    from lucegen.runtime.prefill.attention import AttentionKernels

    dev = gpu_device()
    config = ModelConfig.preset(preset)
    pf = prefill_params(config, dev.target)
    if instruction:
        pf = dict(pf, instruction=instruction)
    if kv:
        pf = dict(pf, **kv_cache.kv_format(kv).template_params())
    return AttentionKernels(dev, dev.target, pf), pf, config


def to_dtype_bits(x: np.ndarray, dtype: str) -> np.ndarray:
    return f32_to_bf16_bits(x) if dtype == "bf16" else x.astype(np.float16).view(np.uint16)


def from_dtype_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_bits_to_f32(bits) if dtype == "bf16" else bits.view(np.float16).astype(F32)


def rotate_blocks(x: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Rows [..., hd] rotated block by block as tq3_0 holds them (or back)."""
    return kv_cache.tq3_rotate(x.reshape(*x.shape[:-1], -1, kv_cache.BLOCK), inverse).reshape(x.shape)


def reference(config, proj, pos0, q_norm, k_norm, cache_k, cache_v, dtype, rotated: bool = False):
    """(k, v of the new positions in f32, gated attention rows [T, NH*HD]) per reference.gated_attention; with
    ``rotated`` the cache rows are the rotated blocks and q is rotated before it is rounded (tq3_0's kernels)."""
    c, T = config, proj.shape[0]
    hd, nh, nkv = c.head_dim, c.num_attention_heads, c.num_kv_heads
    qg = proj[:, : nh * 2 * hd].reshape(T, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, -1)
    k = proj[:, nh * 2 * hd : nh * 2 * hd + nkv * hd].reshape(T, nkv, hd)
    v = proj[:, nh * 2 * hd + nkv * hd :].reshape(T, nkv, hd)
    positions = np.arange(pos0, pos0 + T)
    inv_freq = rope_inv_freq(c)
    q = apply_rope(rms_norm_1p(q, q_norm, c.rms_norm_eps), positions, inv_freq)
    k = apply_rope(rms_norm_1p(k, k_norm, c.rms_norm_eps), positions, inv_freq)
    if rotated:
        q = rotate_blocks(q.astype(F32))
    q = from_dtype_bits(to_dtype_bits(q, dtype), dtype).astype(np.float64)  # the MMA's operand
    keys = cache_k[:, : pos0 + T].astype(np.float64)  # [nkv, L, hd] as written (and read) by the kernels
    values = cache_v[:, : pos0 + T].astype(np.float64)
    group = nh // nkv
    out = np.empty((T, nh, hd))
    causal = np.arange(pos0 + T)[None, :] > positions[:, None]
    for h in range(nh):
        s = (q[:, h] @ keys[h // group].T) * hd ** -0.5
        s = np.where(causal, -np.inf, s)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ values[h // group]
    if rotated:
        out = rotate_blocks(out.astype(F32), inverse=True)
    return k.transpose(1, 0, 2), v.transpose(1, 0, 2), out.reshape(T, -1) * sigmoid(gate)


def check_attention(preset: str, T: int, pos0: int, seed: int, instruction: str | None = None,
                    kv: str | None = None) -> None:
    att, pf, c = kernels(preset, instruction, kv)
    fmt = kv_cache.kv_format(pf["kv"])
    dev = gpu_device()
    dtype = pf["dtype"]
    rng = np.random.default_rng(seed)
    hd, nh, nkv = c.head_dim, c.num_attention_heads, c.num_kv_heads
    max_context = pos0 + T + int(rng.integers(0, 40))
    proj = rng.standard_normal((T, pf["NIN_AT"])).astype(F32)
    q_norm = rng.normal(0.5, 0.3, hd).astype(F32)  # (1 + w) ~ 1.5: scores spread over several units
    k_norm = rng.normal(0.5, 0.3, hd).astype(F32)
    inv_freq = rope_inv_freq(c)
    rows0 = rng.standard_normal((2, nkv, max_context, hd)).astype(F32)
    if fmt.quantised:
        codes0, scales0 = kv_cache.quantise(fmt, rows0)
        cache0 = np.concatenate([codes0.reshape(-1), scales0.view(np.uint8).reshape(-1)])
    else:
        cache0 = to_dtype_bits(rows0, dtype)
    bufs = [dev.upload(a) for a in (proj, q_norm, k_norm, inv_freq, cache0)]
    out = dev.alloc(T * nh * hd * 2)
    ws = dev.alloc(att.workspace_bytes(T))
    try:
        dev.memset(out, 0xFF)  # NaN bits: every row must be written
        att.run(proj=bufs[0].ptr, T=T, pos0=pos0, q_norm=bufs[1].ptr, k_norm=bufs[2].ptr, inv_freq=bufs[3].ptr,
                kv=bufs[4].ptr, max_context=max_context, out=out.ptr, workspace=ws.ptr)
        dev.synchronize()
        cache = dev.download(bufs[4], cache0.dtype, cache0.shape)
        got = from_dtype_bits(dev.download(out, np.uint16, (T, nh * hd)), dtype)
    finally:
        for b in (*bufs, out, ws):
            b.free()
    window = np.zeros(max_context, bool)
    window[pos0 : pos0 + T] = True
    if fmt.quantised:  # every row's codes and scales outside the window, as they were
        n_code = rows0[..., 0].size * fmt.code_bytes(hd)
        for part, width in ((slice(0, n_code), fmt.code_bytes(hd)), (slice(n_code, None), fmt.scale_bytes(hd))):
            a, b = cache[part].reshape(2, nkv, max_context, width), cache0[part].reshape(2, nkv, max_context, width)
            assert np.array_equal(a[:, :, ~window], b[:, :, ~window]), "cache entries outside the window changed"
        cache_f = kv_cache.decode_layers(fmt, cache, 1, nkv, hd, max_context)[0]
        cache_r = cache_f if not fmt.rotated else \
            kv_cache.dequantise(fmt, cache[:n_code].reshape(2, nkv, max_context, -1),
                                cache[n_code:].view(np.float16).reshape(2, nkv, max_context, -1), rotated=True)
    else:
        assert np.array_equal(cache[:, :, ~window], cache0[:, :, ~window]), "cache entries outside the window changed"
        cache_f = cache_r = from_dtype_bits(cache, dtype)
    k_ref, v_ref, out_ref = reference(c, proj, pos0, q_norm, k_norm, cache_r[0], cache_r[1], dtype, fmt.rotated)
    rel = 2.0 ** -8 if dtype == "bf16" else 2.0 ** -11
    for name, got_kv, ref_kv in (("k", cache_f[0][:, window], k_ref), ("v", cache_f[1][:, window], v_ref)):
        err = np.abs(got_kv - ref_kv)
        bound = 1.05 * rel * np.abs(ref_kv) + 1e-6
        if fmt.quantised:  # what numpy's codes hold: every value within one code, nearly every block to rounding
            scales = kv_cache.quantise(fmt, ref_kv)[1].astype(F32)
            err = np.abs(got_kv - kv_cache.stored(fmt, ref_kv)).reshape(*scales.shape, kv_cache.BLOCK)
            off = np.any(err > 4e-3 * np.abs(scales)[..., None] + 1e-6, axis=-1)
            assert off.mean() <= 0.01, f"cache {name}: {off.mean():.1%} of the blocks off by more than rounding"
            bound = np.repeat(fmt.code_step(scales), kv_cache.BLOCK, axis=-1).reshape(err.shape) + 1e-6
        assert np.all(err <= bound), f"cache {name}: max excess {np.max(err - bound)} (T={T}, pos0={pos0})"
    assert np.all(np.isfinite(got)), f"non-finite output rows (T={T}, pos0={pos0})"
    err = np.max(np.abs(got - out_ref))
    scale = np.max(np.abs(out_ref))
    assert err <= 1e-2 * scale, f"attention rows: max |err| {err:.3g} vs max |ref| {scale:.3g} (T={T}, pos0={pos0})"


SETTINGS = settings(max_examples=int(os.environ.get("LUCEGEN_HYPOTHESIS_EXAMPLES", "8")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("preset", ["tiny", "tiny-gqa"])
@SETTINGS
@given(T=st.integers(1, 600), pos0=st.integers(0, 300), seed=st.integers(0, 2**31 - 1))
@example(T=1, pos0=0, seed=1)
@example(T=1, pos0=77, seed=2)
@example(T=600, pos0=0, seed=3)
def test_attention_tiny(preset, T, pos0, seed):
    check_attention(preset, T, pos0, seed)


@SETTINGS
@given(T=st.integers(1, 600), pos0=st.integers(0, 300), seed=st.integers(0, 2**31 - 1))
@example(T=1, pos0=0, seed=4)
@example(T=521, pos0=130, seed=5)
def test_attention_08b(T, pos0, seed):
    check_attention("qwen3.5-0.8b", T, pos0, seed)


@pytest.mark.parametrize("preset,T,pos0", [("tiny-gqa", 77, 0), ("tiny", 130, 45), ("qwen3.5-0.8b", 93, 200)])
def test_attention_simt_body(preset, T, pos0):
    """The FMA body (what AMD targets run) rendered for this chip, same checks."""
    check_attention(preset, T, pos0, seed=T, instruction="simt")


@pytest.mark.parametrize("kv", ["q8_0", "q4_0", "tq3_0"])
@pytest.mark.parametrize("instruction", [None, "simt"])
@pytest.mark.parametrize("preset,T,pos0", [("tiny-gqa", 77, 0), ("tiny", 130, 45), ("qwen3.5-27b", 40, 90)])
def test_attention_quantised_cache(preset, T, pos0, kv, instruction):
    """The quantised KV cache formats, in the tensor-core body and the FMA body: the entries written (one code of
    slack), the entries outside the window untouched, the attention over the cache as written."""
    check_attention(preset, T, pos0, seed=T + pos0, instruction=instruction, kv=kv)

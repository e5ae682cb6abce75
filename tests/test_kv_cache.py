"""The KV cache formats (lucegen/model/kv_cache.py): sizes, the quantisation rules against ggml's block semantics,
the error each format allows, the byte layout decode_layers reads, and that the cache kernels render and compile in
every format for every chip (the GPU tests in tests/gpu/test_quant_target.py run them)."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen import codegen
from lucegen.compile import compile_source
from lucegen.errors import LucegenError
from lucegen.families import tree_verify as tree_verify_family
from lucegen.model import kv_cache, quant
from lucegen.model.config import ModelConfig
from lucegen.target import list_targets, load_target

Q8, Q4, TQ3 = kv_cache.kv_format("q8_0"), kv_cache.kv_format("q4_0"), kv_cache.kv_format("tq3_0")


def rows(seed: int, shape=(3, 4, 128), scale: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
    x[0, 0, :32] = 0.0  # an all-zero block
    x[0, 1, 32:64] = np.float32(-1.5)  # a constant block: every value at the largest magnitude
    return x


def test_sizes():
    assert (kv_cache.kv_format("bf16").row_bytes(256), Q8.row_bytes(256), Q4.row_bytes(256)) == (512, 272, 144)
    # Qwen3.5-27B: 16 attention layers x 4 kv heads x 256: bf16 64 KiB a token, q8_0 34 KiB, q4_0 18 KiB
    assert 16 * Q4.layer_bytes(4, 256, 1) == 18 * 1024 and 16 * Q8.layer_bytes(4, 256, 1) == 34 * 1024
    assert TQ3.row_bytes(256) == 112 and 16 * TQ3.layer_bytes(4, 256, 1) == 14 * 1024  # 3.5 bits a value
    with pytest.raises(LucegenError, match="q5_0"):
        kv_cache.kv_format("q5_0")
    with pytest.raises(LucegenError, match="multiple of 32"):
        Q4.check_head_dim(48, "model x")


def to_ggml_blocks(fmt, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The same blocks in ggml's Q8_0 / Q4_0 layout (fp16 d, then the codes; Q4_0: value j low nibble of byte j,
    value j + 16 the high nibble)."""
    d = scales.reshape(-1, 1).view(np.uint8).reshape(-1, 2)
    if fmt is Q8:
        return np.concatenate([d, codes.reshape(-1, 32)], axis=1).reshape(-1)
    q = np.stack([codes & 15, codes >> 4], axis=-1).reshape(-1, 32)  # sequential order
    return np.concatenate([d, q[:, :16] | (q[:, 16:] << 4)], axis=1).astype(np.uint8).reshape(-1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), scale=st.sampled_from([1e-3, 1.0, 37.0]), fmt=st.sampled_from([Q8, Q4]))
def test_blocks_mean_what_ggml_means(seed, scale, fmt):
    x = rows(seed, scale=scale)
    codes, scales = kv_cache.quantise(fmt, x)
    assert codes.shape == (*x.shape[:-1], fmt.code_bytes(128)) and scales.shape == (*x.shape[:-1], 4)
    y = kv_cache.dequantise(fmt, codes, scales)
    ggml = quant.dequantize(to_ggml_blocks(fmt, codes, scales), "Q8_0" if fmt is Q8 else "Q4_0", x.size)
    np.testing.assert_array_equal(y.reshape(-1), ggml)
    # the error: half a step, except where the fp16 scale rounded (q8_0: |code| <= 127) or the top code clipped
    # (q4_0: the value of largest magnitude is exact at code 0; the other end saturates at code 15)
    step = np.repeat(np.abs(scales.astype(np.float32)), 32, axis=-1)
    slack = np.abs(x) * 2e-3 + 1e-30
    assert np.all(np.abs(y - x) <= np.where(np.abs(x) < 7.5 * step, 0.5 * step, step) + slack)
    assert np.all(y[0, 0, :32] == 0.0)
    if fmt is Q4:  # the block's largest magnitude is code 0 exactly (q8_0's 127 d rounds through the fp16 scale)
        assert np.all(y[0, 1, 32:64] == np.float32(-1.5))
    # quantising what the cache holds gives it back
    np.testing.assert_array_equal(kv_cache.stored(fmt, y), y)


def test_rounding_is_half_away_from_zero():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [127.0, 0.5, -0.5, 2.5]  # d = 1: codes 127, 1, -1, 3 (numpy.round would give 0, -0, 2)
    codes, scales = kv_cache.quantise(Q8, x)
    assert float(scales[0, 0]) == 1.0 and list(codes[0, :4].view(np.int8)) == [127, 1, -1, 3]
    x[0, :4] = [-8.0, 0.5, -0.5, 8.0]  # d = 1: codes trunc(x / d + 8.5) = 0, 9, 8, 15 (clipped: 16.5)
    codes, scales = kv_cache.quantise(Q4, x)
    assert float(scales[0, 0]) == 1.0 and [codes[0, 0] & 15, codes[0, 0] >> 4, codes[0, 1] & 15,
                                           codes[0, 1] >> 4] == [0, 9, 8, 15]


def test_tq3_levels_are_the_lloyd_max_quantiser_of_a_normal():
    """Each level is the mean of N(0, 1) over its cell, each threshold the midpoint of its neighbours (Max's
    conditions), and the mean squared error is Max's 0.03455."""
    import math

    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    cdf = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    levels, cuts = kv_cache.TQ3_LEVELS, (0.0,) + kv_cache.TQ3_THRESHOLDS + (math.inf,)
    for k, level in enumerate(levels):
        a, b = cuts[k], cuts[k + 1]
        assert abs((phi(a) - phi(b)) / (cdf(b) - cdf(a)) - level) < 2e-6, k
    for k, t in enumerate(kv_cache.TQ3_THRESHOLDS):
        assert abs(t - (levels[k] + levels[k + 1]) / 2) < 1e-6, k
    u = np.random.default_rng(1).standard_normal(400_000)
    q = np.asarray(levels)[np.searchsorted(kv_cache.TQ3_THRESHOLDS, np.abs(u), side="right")] * np.sign(u)
    assert abs(np.mean((u - q) ** 2) - 0.03455) < 1e-3


def hadamard32() -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < 32:
        h = np.block([[h, h], [h, -h]])
    return h


def test_tq3_rotation_is_the_signed_hadamard_matrix():
    signs = np.array([-1.0 if (kv_cache.TQ3_SIGNS >> i) & 1 else 1.0 for i in range(32)])
    rot = hadamard32() @ np.diag(signs) / np.sqrt(32)  # orthonormal: rot @ rot.T = I
    np.testing.assert_allclose(rot @ rot.T, np.eye(32), atol=1e-12)
    x = np.random.default_rng(2).standard_normal((5, 32)).astype(np.float32)
    y = kv_cache.tq3_rotate(x)
    np.testing.assert_allclose(y, x @ rot.T, rtol=0, atol=2e-6)
    np.testing.assert_allclose(kv_cache.tq3_rotate(y, inverse=True), x, rtol=0, atol=2e-6)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), scale=st.sampled_from([1e-3, 1.0, 37.0]), outliers=st.booleans())
def test_tq3_blocks_are_the_nearest_levels_of_the_rotated_block(seed, scale, outliers):
    """Against a plain statement of TurboQuant's rule in float64: rotate the block, the nearest level of each
    coordinate over |y| / sqrt(32), the scale that keeps the norm; codes in three bit planes."""
    x = rows(seed, scale=scale)
    if outliers:  # a few channels far larger than the rest: what the rotation spreads over the block
        x[..., ::29] *= np.float32(25.0)
    codes, scales = kv_cache.quantise(TQ3, x)
    assert codes.shape == (*x.shape[:-1], 48) and scales.shape == (*x.shape[:-1], 4)
    signs = np.array([-1.0 if (kv_cache.TQ3_SIGNS >> i) & 1 else 1.0 for i in range(32)])
    rot = hadamard32() @ np.diag(signs) / np.sqrt(32)
    levels = np.concatenate([np.asarray(kv_cache.TQ3_LEVELS), -np.asarray(kv_cache.TQ3_LEVELS)])  # codes 0 .. 7
    blocks, packed = x.reshape(-1, 32).astype(np.float64), codes.reshape(-1, 12)
    for b, (block, planes, d) in enumerate(zip(blocks, packed, scales.reshape(-1).astype(np.float64))):
        words = [int.from_bytes(bytes(planes[4 * p : 4 * p + 4]), "little") for p in range(3)]
        got = [sum(((words[p] >> i) & 1) << p for p in range(3)) for i in range(32)]
        y = rot @ block
        norm = np.linalg.norm(y)
        if norm == 0:
            assert d == 0.0, b
            continue
        u = y * np.sqrt(32) / norm
        for i in range(32):
            near = int(np.argmin(np.abs(levels - u[i])))
            tie = np.min(np.abs(np.abs(u[i]) - np.asarray((0.0,) + kv_cache.TQ3_THRESHOLDS))) < 1e-5
            assert got[i] == near or tie, (b, i, u[i], got[i], near)
        chosen = levels[got]
        assert abs(d - norm / np.linalg.norm(chosen)) <= 1e-3 * d, (b, d)
        # the stored block keeps the norm (up to the fp16 scale) and sits within MSE reach of the block
        back = kv_cache.dequantise(TQ3, codes.reshape(-1, 12)[b : b + 1], scales.reshape(-1)[b : b + 1, None])[0]
        np.testing.assert_allclose(np.linalg.norm(back), norm, rtol=1e-3)
    if not outliers and scale == 1.0:
        y = kv_cache.stored(TQ3, x)
        assert np.sum((y - x) ** 2) / np.sum(x ** 2) < 0.045  # Max's 0.0345 per coordinate, a few blocks


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "q8_0", "q4_0", "tq3_0"])
def test_decode_layers_reads_the_documented_layout(fmt):
    f = kv_cache.kv_format(fmt)
    n_layers, nkv, hd, ctx = 2, 3, 64, 5
    x = rows(7, (n_layers, 2, nkv, ctx, hd))
    if f.quantised:
        codes, scales = kv_cache.quantise(f, x)
        raw = np.concatenate([codes.reshape(n_layers, -1), scales.view(np.uint8).reshape(n_layers, -1)], axis=1)
    elif fmt == "bf16":
        from lucegen.model.dtypes import f32_to_bf16_bits

        raw = f32_to_bf16_bits(x).view(np.uint8)
    else:
        raw = x.astype(np.float16).view(np.uint8)
    assert raw.size == n_layers * f.layer_bytes(nkv, hd, ctx)
    np.testing.assert_array_equal(kv_cache.decode_layers(f, raw, n_layers, nkv, hd, ctx), kv_cache.stored(f, x))


# (module, template, its params beyond the shapes: the tree kernels' tiling for the model of pf on the target)
CACHE_KERNELS = (("prefill_attention", "prefill/attention.cu.j2", lambda pf, target: {}),
                 ("tree_verify", "dflash/tree_verify.cu.j2", tree_verify_family.template_params))


@pytest.mark.parametrize("name", list_targets())
def test_cache_kernels_compile_in_every_format(name, tmp_path, monkeypatch, require_compiler):
    from lucegen.families.prefill import prefill_params

    t = load_target(name)
    require_compiler(t)
    monkeypatch.setenv("LUCEGEN_CACHE_DIR", str(tmp_path))
    pf = prefill_params(ModelConfig.preset("qwen3.5-27b"), t, "tiled")
    for fmt in ("q8_0", "q4_0", "tq3_0"):
        pf.update(kv_cache.kv_format(fmt).template_params())
        for module, template, params in CACHE_KERNELS:
            source = codegen.render(t, template, pf=pf, **params(pf, t))
            assert "kv_store_group" in source and "kv_scales" in source
            compiled = compile_source(t, module, source, template=template)
            names = {k.name for k in compiled.kernels}
            assert {"prefill_attention_prepare", "tree_attention", "tree_commit_kv"} & names
            if module == "tree_verify" and tree_verify_family.attention_tiling(pf, t)["ta_mma"]:
                assert "tree_attention_mma" in names  # its tiles dequantised in shared memory

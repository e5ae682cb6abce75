"""The KV cache formats (lucegen/model/kv_cache.py): sizes, the quantisation rules against ggml's block semantics,
the error each format allows, the byte layout decode_layers reads, and that the cache kernels render and compile in
every format for every chip (the GPU tests in tests/gpu/test_quant_target.py run them)."""

from __future__ import annotations

import os
import shutil

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

Q8, Q4 = kv_cache.kv_format("q8_0"), kv_cache.kv_format("q4_0")


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


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "q8_0", "q4_0"])
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


# (module, template, its params beyond the shapes: the tree kernels' tiling)
CACHE_KERNELS = (("prefill_attention", "prefill/attention.cu.j2", {}),
                 ("tree_verify", "dflash/tree_verify.cu.j2", tree_verify_family.template_params()))


@pytest.mark.parametrize("name", list_targets())
def test_cache_kernels_compile_in_every_format(name, tmp_path, monkeypatch):
    from lucegen.runtime.prefill.params import prefill_params

    t = load_target(name)
    if t.is_amd and shutil.which(os.environ.get("LUCEGEN_CLANG") or "clang-19") is None:
        pytest.fail("clang-19 is required to compile AMD targets (apt-get install clang-19)")
    monkeypatch.setenv("LUCEGEN_CACHE_DIR", str(tmp_path))
    pf = prefill_params(ModelConfig.preset("qwen3.5-27b"), t, "tiled")
    for fmt in ("q8_0", "q4_0"):
        pf.update(kv=fmt, kv_ctype=kv_cache.kv_format(fmt).ctype)
        for module, template, params in CACHE_KERNELS:
            source = codegen.render(t, template, pf=pf, **params)
            assert "kv_store_group" in source and "kv_scales" in source
            compiled = compile_source(t, module, source, template=template)
            assert {"prefill_attention_prepare", "tree_attention", "tree_commit_kv"} & {k.name for k in compiled.kernels}

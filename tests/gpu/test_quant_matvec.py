"""The generated GGML block kernels (templates/kernels/quant_matvec.cu.j2) on the GPU against numpy.

- dequantize_<type>: bit-exact with lucegen.model.quant.dequantize, on blocks written by quant.quantize (real
  scales) and on random bytes (every bit pattern of the quants and 6-bit scales; f16 scales kept finite, since a NaN
  scale's payload is not portable between numpy and the GPU).
- matvec_<type>: f32 accumulation of K products of exact values: |gpu - ref64| <= 1e-5 * sum_k |W[n,k] x[k]|.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucegen.families.quant_matvec import BLOCK_THREADS, QUANT_TYPES
from lucegen.model import quant

from gpu_models import family_module, ggml_blocks  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def gpu():
    return family_module("quant_matvec")


def blocks(rng, qtype: str, rows: int, k: int, source: str) -> np.ndarray:
    """rows x k values of qtype as raw bytes [rows, k / block * bytes]."""
    return ggml_blocks(rng, qtype, rows, k, source, value_scale=(0.01, 10), scale_std=4)


@SETTINGS
@given(qtype=st.sampled_from(QUANT_TYPES), n_blocks=st.integers(1, 600), seed=st.integers(0, 2**32 - 1),
       source=st.sampled_from(["quantized", "random"]))
def test_dequantize_bit_exact(gpu, qtype, n_blocks, seed, source):
    device, module = gpu
    block = quant.TYPES[qtype][1]
    data = blocks(np.random.default_rng(seed), qtype, 1, n_blocks * block, source)
    n = n_blocks * block
    ref = quant.dequantize(data, qtype, n)
    with device.upload(data) as dd, device.alloc(n * 4) as dout:
        module.function(f"dequantize_{qtype.lower()}").launch(-(-n // BLOCK_THREADS), BLOCK_THREADS,
                                                               data=dd, out=dout, n=n)
        got = device.download(dout, np.float32, (n,))
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@SETTINGS
@given(qtype=st.sampled_from(QUANT_TYPES), rows=st.integers(1, 300), k_blocks=st.integers(1, 24),
       seed=st.integers(0, 2**32 - 1), source=st.sampled_from(["quantized", "random"]))
def test_matvec(gpu, qtype, rows, k_blocks, seed, source):
    device, module = gpu
    rng = np.random.default_rng(seed)
    k = k_blocks * quant.TYPES[qtype][1]
    data = blocks(rng, qtype, rows, k, source)
    w = quant.dequantize(data, qtype, rows * k).reshape(rows, k).astype(np.float64)
    x = rng.standard_normal(k).astype(np.float32)
    warps = BLOCK_THREADS // device.target.warp_size
    with device.upload(data) as dw, device.upload(x) as dx, device.alloc(rows * 4) as dy:
        module.function(f"matvec_{qtype.lower()}").launch(-(-rows // warps), BLOCK_THREADS,
                                                           W=dw, x=dx, y=dy, N=rows, K=k)
        y = device.download(dy, np.float32, (rows,))
    ref = w @ x.astype(np.float64)
    tol = 1e-5 * (np.abs(w) @ np.abs(x.astype(np.float64))) + 1e-30
    assert np.all(np.abs(y - ref) <= tol), float(np.max(np.abs(y - ref) - tol))

"""The generated small kernels (RMSNorm, matvec, argmax), run from the cubin on the GPU, against numpy.

Tolerances (stated, not tuned to pass):
- rmsnorm: the kernel rounds its f32 result once to bf16/fp16, so |gpu - ref| <= 1 ulp of the dtype at |ref|
  (bf16: 2^-7 relative, fp16: 2^-10 relative) plus 1e-5 for the f32 sum-of-squares.
- matvec: f32 accumulation of K products: |gpu - ref64| <= 1e-5 * sum_k |W[n,k] x[k]| + 1e-30.
- argmax: exact, ties to the lowest index and NaN first, like numpy.argmax.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucegen import kernels_ref

from gpu_models import family_module  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

BLOCK = 256  # lucegen.families.small_kernels.BLOCK_THREADS
ULP = {"bf16": 2.0**-7, "fp16": 2.0**-10}
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def gpu():
    return family_module("small_kernels")


def test_device_matches_its_descriptor(gpu):
    from lucegen.runtime.device import detect

    device, module = gpu
    arch, sms, _name = detect()
    assert (device.target.arch, device.target.compute_units) == (arch, sms)
    names = {k.name for k in module.compiled.kernels}
    assert {"argmax_f32", "rmsnorm_bf16", "matvec_bf16", "rmsnorm_fp16", "matvec_fp16"} <= names
    fn = module.function("matvec_bf16")
    assert fn.max_active_blocks_per_cu(BLOCK) >= 1
    assert fn.attribute("NUM_REGS") == module.compiled.kernel("matvec_bf16").registers


@SETTINGS
@given(dtype=st.sampled_from(["bf16", "fp16"]), rows=st.integers(1, 4), n=st.integers(1, 5000),
       seed=st.integers(0, 2**32 - 1), eps=st.sampled_from([1e-6, 1e-5]))
def test_rmsnorm(gpu, dtype, rows, n, seed, eps):
    device, module = gpu
    rng = np.random.default_rng(seed)
    x = kernels_ref.round_to(rng.standard_normal((rows, n)).astype(np.float32) * 3, dtype)
    w = kernels_ref.round_to(rng.standard_normal(n).astype(np.float32) * 0.5, dtype)
    with device.upload(kernels_ref.to_device_dtype(x, dtype)) as dx, \
            device.upload(kernels_ref.to_device_dtype(w, dtype)) as dw, device.alloc(rows * n * 2) as dy:
        module.function(f"rmsnorm_{dtype}").launch(rows, BLOCK, x=dx, w=dw, y=dy, n=n, eps=eps)
        y = kernels_ref.from_device_dtype(device.download(dy, np.uint16 if dtype == "bf16" else np.float16,
                                                          (rows, n)), dtype)
    ref = kernels_ref.rmsnorm(x, w, eps)
    tol = ULP[dtype] * np.abs(ref) + 1e-5
    assert np.all(np.abs(y - ref) <= tol), float(np.max(np.abs(y - ref) - tol))


@SETTINGS
@given(dtype=st.sampled_from(["bf16", "fp16"]), n=st.integers(1, 700), k=st.one_of(
    st.integers(1, 64).map(lambda v: v * 8), st.integers(1, 3000)), seed=st.integers(0, 2**32 - 1))
def test_matvec(gpu, dtype, n, k, seed):
    device, module = gpu
    rng = np.random.default_rng(seed)
    w = kernels_ref.round_to(rng.standard_normal((n, k)).astype(np.float32), dtype)
    x = kernels_ref.round_to(rng.standard_normal(k).astype(np.float32), dtype)
    warps = BLOCK // 32
    with device.upload(kernels_ref.to_device_dtype(w, dtype)) as dw, \
            device.upload(kernels_ref.to_device_dtype(x, dtype)) as dx, device.alloc(n * 4) as dy:
        module.function(f"matvec_{dtype}").launch((n + warps - 1) // warps, BLOCK, W=dw, x=dx, y=dy, N=n, K=k)
        y = device.download(dy, np.float32, (n,))
    ref = kernels_ref.matvec(w, x)
    tol = 1e-5 * (np.abs(w.astype(np.float64)) @ np.abs(x.astype(np.float64))) + 1e-30
    assert np.all(np.abs(y - ref) <= tol), float(np.max(np.abs(y - ref) - tol))


@SETTINGS
@given(n=st.integers(1, 300_000), seed=st.integers(0, 2**32 - 1),
       kind=st.sampled_from(["normal", "ties", "nan", "neg_inf"]))
def test_argmax(gpu, n, seed, kind):
    device, module = gpu
    rng = np.random.default_rng(seed)
    if kind == "ties":  # few distinct values: the maximum appears many times
        x = rng.integers(-3, 4, size=n).astype(np.float32)
    else:
        x = rng.standard_normal(n).astype(np.float32)
    if kind == "nan":
        x[rng.integers(0, n, size=1 + n // 1000)] = np.nan
    if kind == "neg_inf":
        x[:] = -np.inf
    with device.upload(x) as dx, device.alloc(4) as dout:
        module.function("argmax_f32").launch(1, BLOCK, x=dx, n=n, out=dout)
        got = int(device.download(dout, np.int32, (1,))[0])
    assert got == kernels_ref.argmax(x)


def test_graph_capture_and_events(gpu):
    """A captured graph replays the argmax launch; events time it."""
    device, module = gpu
    x = np.arange(1000, dtype=np.float32)
    x[123] = 5000.0
    stream = device.stream()
    with device.upload(x) as dx, device.alloc(4) as dout:
        device.memset(dout, 0xFF)
        stream.begin_capture()
        module.function("argmax_f32").launch(1, BLOCK, stream=stream, x=dx, n=1000, out=dout)
        graph = stream.end_capture()
        start, end = device.event(), device.event()
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        assert start.elapsed_ms(end) >= 0.0
        stream.synchronize()
        assert int(device.download(dout, np.int32, (1,))[0]) == 123
        graph.destroy()
    stream.destroy()

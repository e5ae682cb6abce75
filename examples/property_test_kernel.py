"""Property-test a kernel against its numpy reference with hypothesis: the two halves of how lucegen tests one.

1. The algorithm, in numpy (CPU). The prefill DeltaNet kernel runs the chunked form of the gated delta rule,
   stated in numpy by lucegen/model/chunked.py. For any length, chunk size, head count and starting state, it must
   equal the token-by-token recurrence of the model's reference (lucegen/model/reference.py).
2. The generated kernel (GPU). The `rmsnorm_<dtype>` kernel of the `small_kernels` family, compiled for the GPU's
   descriptor, on hypothesis-chosen shapes, must match lucegen.kernels_ref.rmsnorm within one ulp of its output
   type. Without an NVIDIA GPU, the same launches go to the host-only device: the kernel is compiled and each launch
   is checked against its cubin (argument count, kinds and sizes, addresses inside live allocations), but nothing
   is computed.

    python examples/property_test_kernel.py [--examples 50]
"""

from __future__ import annotations

import argparse

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen import codegen, kernels_ref
from lucegen.errors import DeviceError
from lucegen.model.chunked import chunked_gated_delta_rule
from lucegen.model.reference import gated_delta_rule, l2norm, sigmoid

F32 = np.float32
ULP = {"bf16": 2.0**-7, "fp16": 2.0**-10}


def delta_rule_inputs(rng, T, heads, dk=16, dv=24):
    q = l2norm(rng.standard_normal((T, heads, dk)).astype(F32)) * F32(dk**-0.5)
    k = l2norm(rng.standard_normal((T, heads, dk)).astype(F32))
    v = rng.standard_normal((T, heads, dv)).astype(F32)
    g = (-np.exp(rng.normal(-1, 1, (T, heads))) * rng.uniform(0, 2, (T, heads))).astype(F32)  # log decays <= 0
    beta = sigmoid(rng.standard_normal((T, heads)).astype(F32))
    state = rng.standard_normal((heads, dk, dv)).astype(F32)
    return q, k, v, g, beta, state


@given(T=st.integers(1, 200), chunk=st.sampled_from([16, 32, 64]), heads=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1))
def chunked_equals_recurrent(T, chunk, heads, seed):
    q, k, v, g, beta, state = delta_rule_inputs(np.random.default_rng(seed), T, heads)
    state_ref, state_chunked = state.copy(), state.copy()
    out_ref = gated_delta_rule(q, k, v, g, beta, state_ref)  # token by token: the model's definition
    out = chunked_gated_delta_rule(q, k, v, g, beta, state_chunked, chunk)  # what the kernel runs
    # both float32; the chunked form reassociates sums of O(1) terms
    assert np.abs(out - out_ref).max() <= 2e-4 * max(1.0, float(np.abs(out_ref).max())), (T, chunk, heads)
    assert np.abs(state_chunked - state_ref).max() <= 2e-4 * max(1.0, float(np.abs(state_ref).max()))


def open_device():
    """The GPU, or the host-only device of sm_86 when there is none; and whether kernels compute."""
    from lucegen.runtime.device import Device
    from lucegen.runtime.host_device import HostDevice
    from lucegen.target import load_target

    try:
        return Device.open(), True
    except DeviceError as exc:
        print(f"no GPU ({exc}); the kernel's launches go to the host-only device of sm_86")
        return HostDevice(load_target("sm_86")), False


def rmsnorm_property(device, computes: bool):
    module = device.load(codegen.build(device.target, "small_kernels"))
    block = 256  # lucegen.families.small_kernels.BLOCK_THREADS

    @given(dtype=st.sampled_from(["bf16", "fp16"]), rows=st.integers(1, 4), n=st.integers(1, 5000),
           seed=st.integers(0, 2**32 - 1))
    def rmsnorm_matches_numpy(dtype, rows, n, seed):
        rng = np.random.default_rng(seed)
        x = kernels_ref.round_to(rng.standard_normal((rows, n)).astype(F32) * 3, dtype)
        w = kernels_ref.round_to(rng.standard_normal(n).astype(F32) * 0.5, dtype)
        with device.upload(kernels_ref.to_device_dtype(x, dtype)) as dx, \
                device.upload(kernels_ref.to_device_dtype(w, dtype)) as dw, device.alloc(rows * n * 2) as dy:
            module.function(f"rmsnorm_{dtype}").launch(rows, block, x=dx, w=dw, y=dy, n=n, eps=1e-6)
            stored = np.uint16 if dtype == "bf16" else np.float16
            y = kernels_ref.from_device_dtype(device.download(dy, stored, (rows, n)), dtype)
        if computes:
            ref = kernels_ref.rmsnorm(x, w, 1e-6)
            assert np.all(np.abs(y - ref) <= ULP[dtype] * np.abs(ref) + 1e-5), (dtype, rows, n)

    return rmsnorm_matches_numpy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=50, help="hypothesis examples per property")
    args = parser.parse_args()
    run = settings(max_examples=args.examples, deadline=None)

    run(chunked_equals_recurrent)()
    print(f"chunked gated delta rule == recurrent reference: {args.examples} examples passed")

    device, computes = open_device()
    run(rmsnorm_property(device, computes))()
    what = "matches numpy within one ulp" if computes else "every launch checked against its cubin (not computed)"
    print(f"rmsnorm kernel on {device.target.name}: {what}, {args.examples} examples")
    device.close()


if __name__ == "__main__":
    main()

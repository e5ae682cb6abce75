"""The prefill DeltaNet module (templates/prefill/deltanet.cu.j2) renders and compiles for every descriptor (NVRTC for
NVIDIA, clang-19 HIP for AMD) for the default model and the tiny presets, with a shared-memory plan that fits the chip;
the launcher's host-side rules (workspace size, unsupported shapes) hold."""

from __future__ import annotations

import re

import pytest

from lucegen import codegen
from lucegen.errors import LucegenError
from lucegen.families.prefill import prefill_params
from lucegen.model.config import ModelConfig
from lucegen.runtime.prefill.deltanet import MODULE, check_shape, padded_tokens, workspace_floats
from lucegen.target import list_targets, load_target

KERNELS = {"deltanet_conv_prepare", "deltanet_chunk_prepare", "deltanet_chunk_scan", "deltanet_chunk_output",
           "deltanet_gated_norm"}


@pytest.mark.parametrize("preset", ["qwen3.5-0.8b", "tiny-gqa"])
@pytest.mark.parametrize("target_name", list_targets())
def test_deltanet_compiles(target_name, preset, require_compiler):
    target = load_target(target_name)
    require_compiler(target)
    pf = prefill_params(ModelConfig.preset(preset), target)
    module = codegen.build(target, MODULE, params={"pf": pf})
    source = module.source
    kernels = {k.name: k for k in module.kernels}
    assert set(kernels) == KERNELS
    scan_smem = int(re.search(r"#define DN_SCAN_SMEM (\d+)", source).group(1))
    bufs = int(re.search(r"#define DN_SCAN_BUFS (\d+)", source).group(1))
    assert scan_smem + kernels["deltanet_chunk_scan"].shared_bytes <= target.smem_per_block_optin
    for name, k in kernels.items():
        assert k.shared_bytes <= 48 * 1024, (name, k.shared_bytes)
    assert ("cp.async.cg.shared.global" in source) == target.features.cp_async  # plain loads without it
    assert bufs in (0, 1, 2) and (bufs < 2 or target.features.cp_async)  # double buffering needs cp.async
    if target_name == "sm_90" and preset == "qwen3.5-0.8b":  # the timed configuration
        assert bufs == 2
        assert all(k.spills == 0 for k in kernels.values()), kernels


def test_workspace_size():
    """workspace_floats follows the kernel's deltanet_ws layout: per padded token q, k, v, g, beta, gc, W, U, P, o,
    plus one state per chunk."""
    pf = prefill_params(ModelConfig.preset("qwen3.5-0.8b"), load_target("sm_90"))
    nk, nv, dk, dv, c = pf["NK"], pf["NV"], pf["DK"], pf["DV"], pf["chunk"]
    for T in (1, 63, 64, 65, 520):
        tp = padded_tokens(pf, T)
        assert tp % c == 0 and T <= tp < T + c
        per_token = 2 * nk * dk + nv * dv + 3 * nv + nv * dk + nv * dv + nv * c + nv * dv
        assert workspace_floats(pf, T) == tp * per_token + tp // c * nv * dk * dv


def test_unsupported_shapes_are_refused():
    pf = prefill_params(ModelConfig.preset("tiny-gqa"), load_target("sm_90"))
    check_shape(pf, 16)
    with pytest.raises(LucegenError, match="not a multiple of linear_num_key_heads"):
        check_shape(dict(pf, NV=3), 16)
    with pytest.raises(LucegenError, match="deltanet_chunk 48"):
        check_shape(dict(pf, chunk=48), 16)
    with pytest.raises(LucegenError, match="scan tile 24"):
        check_shape(pf, 24)

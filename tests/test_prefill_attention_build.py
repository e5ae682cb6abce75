"""The prefill attention module renders and compiles for every descriptor (NVRTC for NVIDIA, clang-19 HIP for AMD),
for the default model and the tiny presets, with the launch plan the launcher derives from ``pf``."""

from __future__ import annotations


import pytest

from lucegen import codegen
from lucegen.families.prefill import prefill_params
from lucegen.model.config import ModelConfig
from lucegen.runtime.prefill.attention import MODULE, launch_geometry
from lucegen.target import list_targets, load_target


@pytest.mark.parametrize("preset", ["qwen3.5-0.8b", "tiny-gqa"])
@pytest.mark.parametrize("target_name", list_targets())
def test_attention_compiles(target_name, preset, require_compiler):
    target = load_target(target_name)
    require_compiler(target)
    pf = prefill_params(ModelConfig.preset(preset), target)
    module = codegen.build(target, MODULE, params={"pf": pf})
    source = module.source
    kernels = {k.name: k for k in module.kernels}
    assert set(kernels) == {"prefill_attention_prepare", "prefill_attention"}
    if target_name == "sm_90" and preset == "qwen3.5-0.8b":  # the timed configuration: HD 256 fits in registers
        assert all(k.spills == 0 for k in kernels.values()), kernels
    grid, threads, smem = launch_geometry(pf, 1000, target.warp_size)
    assert threads <= target.max_threads_per_block
    assert smem <= target.smem_per_block_optin
    if pf["instruction"] == "simt":
        assert "mma.sync" not in source and smem == 0
    else:
        assert f"mma.sync.aligned.{pf['instruction'].removeprefix('mma_')}" in source
        assert ("cp.async" in source) == target.features.cp_async
        rows_q = pf["block_q"]
        assert smem == (rows_q + 2 * pf["attn_stages"] * pf["attn_block_kv"]) * (pf["HD"] + 8) * 2
        assert grid == (-(-1000 * pf["NH"] // pf["NKV"] // rows_q), pf["NKV"])


def test_attention_tiling_fits_every_target():
    """The K/V tile shrinks (never below 16 rows) until the plan fits the chip; H100 keeps two 64-key stages."""
    config = ModelConfig.preset("qwen3.5-0.8b")
    for name in list_targets():
        t = load_target(name)
        pf = prefill_params(config, t)
        assert pf["attn_block_kv"] % 16 == 0 and pf["attn_smem"] <= t.smem_per_block_optin
    pf = prefill_params(config, load_target("sm_90"))
    assert (pf["attn_block_kv"], pf["attn_stages"]) == (64, 2)

"""Prefill GEMM module on the CPU: the template renders and compiles for all nine targets with the three contract
kernels at every block height, and the launcher's host side (argument checks, kernel choice, launch geometry)
through a recording stand-in for the device."""

from __future__ import annotations

import pytest

from lucegen import codegen
from lucegen.compile import compile_source
from lucegen.errors import LucegenError
from lucegen.families.prefill import prefill_params
from lucegen.model.config import ModelConfig
from lucegen.runtime.device import TensorMap
from lucegen.runtime.prefill.gemm import (GemmKernels, block_heights, pick_block_rows, smem_bytes, uses_tma,
                                          warp_grid)
from lucegen.target import list_targets, load_target


def _pf(target):
    return prefill_params(ModelConfig.preset("qwen3.5-0.8b"), target)


@pytest.mark.slow
@pytest.mark.parametrize("name", list_targets())
def test_gemm_module_compiles_for_every_target(name, require_compiler):
    target = load_target(name)
    require_compiler(target)
    pf = _pf(target)
    source = codegen.render(target, "prefill/gemm.cu.j2", pf=pf)
    module = compile_source(target, "prefill_gemm", source, template="prefill/gemm.cu.j2",
                            arch="sm_90a" if pf["gemm_instruction"].startswith("wgmma") else None)
    kernels = {k.name: k for k in module.kernels}
    expected = {f"gemm_{ep}_m{bm}" for ep in ("rows_f32", "swiglu", "residual", "partial") for bm in block_heights(pf, target)}
    assert expected | {"gemv_rows_f32", "gemm_residual_reduce", "gemm_rows_f32_reduce"} == set(kernels)
    assert all(k.spills == 0 for k in kernels.values()), [(k.name, k.spills) for k in kernels.values()]
    if pf["gemm_instruction"].startswith("wgmma"):
        assert "cp.async.cg.shared.global" in source and f"wgmma.mma_async.sync.aligned.m64n{pf['tile_n']}k16" in source
        assert "mma.sync.aligned.m16n8" not in source  # no warp-level MMA left in the mainloop
        # chips with TMA feed it from a producer warp (tensor-map tile loads into an mbarrier ring)
        assert ("cp.async.bulk.tensor.2d" in source) == uses_tma(pf, target)
    elif pf["gemm_instruction"] == "mma_m16n8k16":
        assert "cp.async.cg.shared.global" in source and "ldmatrix" in source and "m16n8k16" in source
    elif pf["gemm_instruction"] == "mma_m16n8k8":
        assert "m16n8k8.row.col" in source and "cp.async.cg" not in source
    else:
        assert "mma.sync.aligned" not in source and "ldmatrix.sync" not in source
    for bm in block_heights(pf, target):
        assert smem_bytes(pf, target, bm) <= target.smem_per_block_optin


class _Fn:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def set_max_dynamic_smem(self, n):
        pass

    def max_active_blocks_per_cu(self, threads, smem):
        return 1

    def max_active_clusters(self, cluster, threads, smem):
        return 132 // cluster

    def launch(self, grid, block, *, smem=0, stream=None, **arguments):
        self.log.append((self.name, grid, block, smem, arguments))


class _Module:
    def __init__(self, log):
        self.log = log

    def function(self, name):
        return _Fn(name, self.log)


class _Device:
    def __init__(self):
        self.log = []

    def load(self, compiled):
        return _Module(self.log)

    def tensor_map_2d(self, ptr, rows, cols, row_stride_bytes, box_rows, box_cols, dtype="bf16"):
        self.log.append(("tensor_map", (ptr, rows, cols, row_stride_bytes, box_rows, box_cols, dtype)))
        return TensorMap(bytes(TensorMap.SIZE))


@pytest.fixture(scope="module")
def gemm90():
    target = load_target("sm_90")
    dev = _Device()
    return dev, GemmKernels(dev, target, _pf(target))


def test_launch_geometry_and_kernel_choice(gemm90):
    dev, g = gemm90
    dev.log.clear()
    g.rows_f32(0x1000, 1024, 0x2000, 1024, 1, 248320, 1024, 0x3000, 8, 1, 0x4000, 248320)
    name, grid, block, smem, args = dev.log[-1]
    assert name == "gemv_rows_f32" and grid == -(-248320 // 8) and block == 256 and smem == 0
    g.swiglu(0x1000, 1024, 0x2000, 1024, 520, 7168, 1024, 0x3000, 8, 520, 0x4000, 3584)
    name, grid, block, smem, args = dev.log[-1]
    bm = int(name.rsplit("_m", 1)[1])
    inst = g.instances["swiglu"]  # sm_90: its own instance ([matmul.swiglu])
    assert inst is not g.instances["residual"] and inst.pf["tile_n"] == g.target.matmul.swiglu.tile_n
    tn, tma, c, crews = inst.pf["tile_n"], inst.tma, inst.cluster, inst.crews
    groups = -(-(-(-520 // bm)) // c) * (7168 // tn)  # clusters of c blocks take c adjacent row tiles of a column
    # persistent TMA blocks: each computes `crews` tiles at a time (pingpong: one per warpgroup)
    assert name.startswith("gemm_swiglu_m") and grid == (min(-(-groups // crews), 132 // c) * c if tma else groups)
    assert block == 256 + (32 if tma else 0)  # 8 consumer warps (+ the TMA producer warp)
    if tma:  # A [520][1024] in boxes of bm x 64, W [7168][1024] in boxes of tile_n x 64, rows 2 * ld bytes apart
        assert isinstance(args["map_w"], TensorMap) and isinstance(args["map_a"], TensorMap)
        assert [e[1] for e in dev.log[-3:-1]] == [(0x1000, 520, 1024, 2048, bm, 64, "bf16"),
                                                   (0x2000, 7168, 1024, 2048, tn // c, 64, "bf16")]
    # stages of (A + W) tiles; the wgmma mainloop adds 1024 bytes to align them for the 128-byte swizzle
    assert smem == inst.pf["stages"] * (bm + tn) * 64 * 2 + (1024 if inst.pf["gemm_instruction"].startswith("wgmma") else 0)
    g.residual(0x1000, 3584, 0x2000, 3584, 520, 1024, 3584, 0x5000, 1024, 0x6000, 0x7000, 1024, 0x8000, 520)
    assert dev.log[-1][0].startswith("gemm_residual_m")
    assert len(dev.log[-1][4]) == 14 + (2 if tma else 0)


@pytest.mark.parametrize("call, message", [
    (lambda g: g.rows_f32(0x1000, 1024, 0x2000, 1024, 8, 64, 1020, 0, 0, 0, 0x4000, 64), "multiple of 8"),
    (lambda g: g.rows_f32(0x1000, 1020, 0x2000, 1024, 8, 64, 1016, 0, 0, 0, 0x4000, 64), "lda=1020"),
    (lambda g: g.rows_f32(0x1000, 1024, 0x2000, 512, 8, 64, 1024, 0, 0, 0, 0x4000, 64), "ldw=512"),
    (lambda g: g.rows_f32(0x1000, 1024, 0x2000, 1024, 0, 64, 1024, 0, 0, 0, 0x4000, 64), "positive"),
    (lambda g: g.rows_f32(0x1008, 1024, 0x2000, 1024, 8, 64, 1024, 0, 0, 0, 0x4000, 64), "A must be a 16-byte"),
    (lambda g: g.rows_f32(0x1000, 1024, 0x2000, 1024, 8, 64, 1024, 0x3000, 8, 4, 0x4000, 64), "ss_stride"),
    (lambda g: g.swiglu(0x1000, 1024, 0x2000, 1024, 8, 63, 1024, 0, 0, 0, 0x4000, 32), "even"),
    (lambda g: g.residual(0x1000, 1024, 0x2000, 1024, 8, 64, 1024, 0x5000, 64, 0, 0x7000, 64, 0x8000, 8),
     "norm_w"),
    (lambda g: g.residual(0x1000, 1024, 0x2000, 1024, 8, 64, 1024, 0x5000, 60, 0x6000, 0x7000, 64, 0x8000, 8),
     "ldx=60"),
])
def test_host_argument_checks(gemm90, call, message):
    dev, g = gemm90
    before = len(dev.log)
    with pytest.raises(LucegenError, match=message):
        call(g)
    assert len(dev.log) == before  # nothing launched


def test_block_height_choice_fills_the_chip():
    per_unit = {128: 1, 64: 2, 32: 2}
    # 520 x 1024: 40 blocks of 128 rows leave most of 132 SMs idle; shorter tiles fill them
    assert pick_block_rows(520, 1024, 128, 132, per_unit) < 128
    # a large problem keeps the tallest tile (fewest W re-reads)
    assert pick_block_rows(4096, 8224, 128, 132, per_unit) in (128, 64)
    assert warp_grid(8) == (2, 4) and warp_grid(4) == (2, 2)


@pytest.mark.parametrize("chip, ok", [("sm_90", True), ("sm_89", False), ("sm_120", False), ("gfx1100", False)])
def test_wgmma_instruction_is_sm90_only(tmp_path, chip, ok):
    from lucegen import TARGETS_DIR
    from lucegen.errors import DescriptorError

    text = (TARGETS_DIR / f"{chip}.toml").read_text()
    lines = [('instruction = "wgmma_m64nNk16"' if line.startswith("instruction =") else line)
             for line in text.splitlines()]
    path = tmp_path / f"{chip}.toml"
    path.write_text("\n".join(lines) + "\n")
    if ok:
        target = load_target(path)
        pf = _pf(target)
        # the GEMM takes wgmma; flash attention keeps the warp-level m16n8k16 MMA
        assert pf["gemm_instruction"] == "wgmma_m64nNk16" and pf["instruction"] == "mma_m16n8k16"
        assert warp_grid(pf["warps"], pf["gemm_instruction"]) == (pf["warps"], 1)
        assert block_heights(pf, target) == (pf["tile_m"],)
        from lucegen.families.prefill import FAMILIES
        assert {f.name: f.arch(target) for f in FAMILIES}["prefill_gemm"] == "sm_90a"
    else:
        with pytest.raises(DescriptorError, match="matmul.instruction"):
            load_target(path)

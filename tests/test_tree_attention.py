"""The verify attention's choices on the host (lucegen/families/tree_verify.py, lucegen/runtime/tree_attention.py):
which chips render the tensor-core body, how a slot's keys split into ranges, and which bodies a pass launches. The
kernels themselves are the device's tests (tests/gpu/test_tree_verify.py)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lucegen.errors import LucegenError
from lucegen.families.prefill import prefill_params
from lucegen.families.tree_verify import (ATTENTION_MAX_RANGES, MMA_MAX_RANGES, attention_ranges, attention_tiling,
                                          kv_raw_chunks, mma_range_keys, partial_ranges)
from lucegen.model import kv_cache
from lucegen.model.config import ModelConfig
from lucegen.runtime.tree_attention import NEVER, TreeAttention
from lucegen.target import load_target


def params_27b(chip: str, kv: str = "fp16") -> tuple[dict, object]:
    t = load_target(chip)
    t = t.quantised_target() if t.quant is not None else t
    return dict(prefill_params(ModelConfig.preset("qwen3.5-27b"), t), **kv_cache.kv_format(kv).template_params()), t


class Module:
    """What TreeAttention asks of a loaded module: its functions by name (no launches here)."""

    class Function:
        def __init__(self, name: str):
            self.name = name

        def set_max_dynamic_smem(self, n: int) -> None:
            self.smem = n

        def max_active_blocks_per_cu(self, block_threads: int, smem: int = 0) -> int:
            return 1  # tree_attention's 16 warps of ~100 registers on the H100

    def function(self, name: str, programmatic: bool = False):
        return self.Function(name)


def test_which_chips_render_the_tensor_core_body():
    pf, t = params_27b("sm_90")
    assert attention_tiling(pf, t) == {"ta_mma": True, "ta_bkv": 64, "ta_mma_keys": 256}
    for kv in ("q8_0", "q4_0", "tq3_0"):  # a quantised cache's tiles are dequantised in shared memory
        assert attention_tiling(*params_27b("sm_90", kv)) == {"ta_mma": True, "ta_bkv": 64, "ta_mma_keys": 256}
    assert not attention_tiling(*params_27b("gfx1100"))["ta_mma"]  # no tensor-core MMA in its descriptor
    no_bound = dataclasses.replace(t, ddtree=dataclasses.replace(t.ddtree, tensor_core_attention_keys=0))
    assert not attention_tiling(pf, no_bound)["ta_mma"]  # the descriptor sets no bound: FMA always
    assert partial_ranges(pf, t) == MMA_MAX_RANGES and partial_ranges(pf, no_bound) == ATTENTION_MAX_RANGES


@given(st.integers(1, 1 << 20))
def test_ranges_cover_the_context_in_whole_tiles(max_context):
    keys = mma_range_keys(max_context)
    assert keys % 64 == 0 and -(-max_context // keys) <= MMA_MAX_RANGES
    assert keys == 256 or -(-max_context // (keys - 256)) > MMA_MAX_RANGES  # the least such multiple
    assert attention_ranges(max_context) <= ATTENTION_MAX_RANGES


def test_a_pass_launches_the_bodies_its_slots_need():
    pf, t = params_27b("sm_90")
    att = TreeAttention(Module(), t, pf, slots=23, max_context=4096)
    assert att.mma_keys == 256 and att.fma_ranges == attention_ranges(255) == 1
    # a pass at position p: slots of p + 1 .. p + S keys
    assert att.bodies(1, 100) == (True, False)
    assert att.bodies(1, 255) == (False, True)  # the slot's 256th key is its own
    assert att.bodies(23, 240) == (True, True)
    assert att.bodies(23, 232) == (True, False) and att.bodies(23, 233) == (True, True)
    assert att.bodies(23, 3000) == (False, True)
    # the bound past the context: the FMA body alone, over the whole context
    short = TreeAttention(Module(), t, pf, slots=23, max_context=200)
    assert short.mma_keys is None and short.bodies(23, 150) == (True, False) and short.fma_ranges == 1
    fma = TreeAttention(Module(), t, pf, slots=23, max_context=4096, tensor_core_keys=NEVER)
    assert fma.mma_keys is None and fma.fma_ranges == attention_ranges(4096)


def test_a_pass_of_more_blocks_than_the_chip_holds_takes_the_packed_kernel():
    """tree_attention and tree_attention_packed compute the same sums (the GPU tests compare their bits); a pass takes
    the packed one once its (slot, head) blocks are more than the chip holds of tree_attention's at once."""
    pf, t = params_27b("sm_90")
    att = TreeAttention(Module(), t, pf, slots=23, max_context=4096)
    most = t.compute_units // pf["NH"]  # slots whose blocks fit one wave of tree_attention (1 a CU)
    fn, threads = att.fma_kernel(most)
    assert fn.name == "tree_attention" and threads == 16 * t.warp_size
    fn, threads = att.fma_kernel(most + 1)
    assert fn.name == "tree_attention_packed" and threads == 4 * t.warp_size


def test_bad_tensor_core_bounds_are_refused():
    pf, t = params_27b("sm_90")
    with pytest.raises(LucegenError, match="positive integer"):
        TreeAttention(Module(), t, pf, slots=23, max_context=4096, tensor_core_keys=0)
    pf_odd = dict(pf, HD=96, **kv_cache.kv_format("q4_0").template_params())  # 6 bytes of scales a row
    with pytest.raises(LucegenError, match="no tensor-core tree_attention"):
        TreeAttention(Module(), t, pf_odd, slots=23, max_context=4096, tensor_core_keys=512)


@pytest.mark.parametrize("kv, head_dim, chunks", [
    ("fp16", 256, None), ("q8_0", 256, (16, 16)), ("q4_0", 256, (16, 16)), ("tq3_0", 256, (16, 16)),
    ("q4_0", 64, (16, 4)), ("tq3_0", 64, (4, 4)), ("q8_0", 128, (16, 4)), ("q4_0", 96, None),
])
def test_raw_tiles_copy_in_pieces_the_layout_aligns(kv, head_dim, chunks):
    """A quantised cache's committed tiles reach shared memory as the cache holds them: codes rows of head_dim bits / 8
    bytes, then the fp16 scales (head_dim / 32 a row) after every code; each copy's source must be aligned to its size
    for any max_context, so a row's bytes (and, for the scales' 16-byte copies, the codes' end) decide the width."""
    pf = dict(params_27b("sm_90")[0], HD=head_dim, **kv_cache.kv_format(kv).template_params())
    assert kv_raw_chunks(pf) == chunks
    if chunks:
        codes, scales = chunks
        code_bytes, scale_bytes = head_dim * pf["kv_bits"] // 8, head_dim // 16
        for max_context in (1, 7, 640, 4099):
            scales_at = 2 * pf["NKV"] * max_context * code_bytes
            for row in (0, 1, 16, max_context - 1):  # a tile starts at head * max_context + a multiple of 16
                assert (row * code_bytes) % codes == 0
                assert (scales_at + row * scale_bytes) % scales == 0

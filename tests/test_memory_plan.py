"""The memory plan (lucegen/runtime/memory_plan.py): the per-token and per-slot arithmetic on the real 27B shapes,
and what fits where. The device test (tests/gpu/test_quant_target.py) checks the arithmetic against the device's
ledger of what a loaded engine allocates."""

from __future__ import annotations

import types

from lucegen.families.megakernel import plan_layout
from lucegen.model.config import ModelConfig
from lucegen.runtime import memory_plan
from lucegen.runtime.memory_plan import GIB, MemoryPlan
from lucegen.target import load_target


def decoder_27b(kv: str = "q4_0", max_context: int = 4096):
    from lucegen.model.kv_cache import kv_format

    c = ModelConfig.preset("qwen3.5-27b")
    return types.SimpleNamespace(config=c, layout=plan_layout(c), kv_format=kv_format(kv), max_context=max_context,
                                 token_buffers=0, target=load_target("sm_90"))


def test_per_token_bytes_of_the_27b():
    from lucegen.model.kv_cache import kv_format

    dec = decoder_27b()
    # 16 attention layers x k, v x 4 kv heads x 256 values, plus two int32 entries
    assert memory_plan.token_bytes(dec, kv_format("bf16")) == 16 * 2 * 4 * 512 + 8
    assert memory_plan.token_bytes(dec, kv_format("q8_0")) == 16 * 2 * 4 * 272 + 8
    assert memory_plan.token_bytes(dec, kv_format("q4_0")) == 16 * 2 * 4 * 144 + 8
    ring = types.SimpleNamespace(ring=4096, ring_follows_context=True, ring_bytes_per_token=lambda: 20480)
    assert memory_plan.token_bytes(dec, kv_format("q4_0"), ring) == 16 * 2 * 4 * 144 + 8 + 20480
    ring.ring_follows_context = False  # a bounded ring (even one as long as this context) does not grow with it
    assert memory_plan.token_bytes(dec, kv_format("q4_0"), ring) == 16 * 2 * 4 * 144 + 8


def test_a_verify_slot_of_the_27b_keeps_updates_not_states():
    from lucegen.families.prefill import prefill_params

    dec = decoder_27b()
    pf = prefill_params(dec.config, load_target("sm_90"), "tiled")
    per_slot = memory_plan.slot_bytes(dec, pf)
    # per DeltaNet layer (48): the workspace with the slot's update, q, k (2 x 2048), v, o, delta (3 x 6144), g, beta
    # (2 x 48), and the conv window (10240 x 3), float32; then the logits row (248320), the attention's partial sums
    # (24 heads x 64 key ranges x 258 floats: tree_attention_mma's ranges at most) and the activation rows
    layers = 48 * 4 * (2 * 2048 + 3 * 6144 + 2 * 48 + 10240 * 3)
    known = layers + 4 * 248320 + 4 * 24 * 64 * 258
    assert known < per_slot < known * 1.1
    # not the 144 MiB of recurrent state a slot would take if every slot's state were kept
    assert per_slot < 48 * 48 * 128 * 128 * 4 / 10


def plan(fixed_gib: float) -> MemoryPlan:
    return MemoryPlan("qwen3.5-27b", "sm_90", "bf16", 4096, 23, overhead=GIB // 2, fixed=int(fixed_gib * GIB),
                      per_slot=151 * 2**20, per_token={"bf16": 65544, "q8_0": 34824, "q4_0": 18440},
                      max_position=262144)


def test_what_fits_where():
    rtx3090, h100 = load_target("sm_86"), load_target("sm_90")
    # the 3090 (24 GB) holds a 17 GiB engine at its budget of 22 (23 slots of 151 MiB), and not at 64 (65 slots)
    assert rtx3090.ddtree.budget == 22
    fits = plan(17.0).max_context(rtx3090, "q4_0")
    assert fits == (24 * GIB - GIB // 2 - 17 * GIB - 23 * 151 * 2**20 - 4 * 23 * 23) // 18440 > 128 * 1024
    assert plan(17.0).bytes_at(0, 65, "q4_0") > rtx3090.memory_bytes
    p = plan(66.0)  # an H100 with 66 GiB taken: about 3.9 GiB left for the context
    fits = {kv: p.max_context(h100, kv) for kv in ("bf16", "q8_0", "q4_0")}
    assert 0 < fits["bf16"] < fits["q8_0"] < fits["q4_0"] <= 262144
    room = h100.memory_bytes - p.bytes_at(0, h100.ddtree.budget + 1, "bf16")
    assert fits["bf16"] == room // 65544
    assert p.bytes_at(fits["bf16"], 65, "bf16") <= h100.memory_bytes < p.bytes_at(fits["bf16"] + 1, 65, "bf16")
    # the model's own limit caps it
    assert plan(1.0).max_context(h100, "q4_0") == 262144
    text = p.format([rtx3090, h100])
    assert "does not fit" in text and "sm_90" in text and "max ctx q4_0" in text

"""The quantised target (lucegen/runtime/quant_target.py: a Q4_K_M GGUF kept in blocks on the device) through the
prefill, verify and speculative loop: the checks of tests/gpu/test_tree_verify.py on the ``tiny-q`` preset (every
matrix a K-quant, DeltaNet value heads twice the key heads: the tiled head order is exercised), plus device-queued
greedy decoding against the step-by-step one, and the refusal of GGUFs the path cannot read."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lucegen.errors import CheckpointError

from gpu_models import gguf_file, gpu_device  # tests/gpu/gpu_models.py
from test_tree_verify import (BUDGET, check_decode_is_greedy, check_lossless, check_slots, engine, needs_tensor_cores,
                              start)

pytestmark = pytest.mark.gpu
pytest.importorskip("gguf", reason="writing the test GGUF needs the gguf package")


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(length=st.integers(1, 300), seed=st.integers(0, 2**16), budget=st.integers(0, BUDGET))
# Found on 2026-11-24 (H100): logits rel 0.171 (cos 0.987) at 133 tokens, a KV k row 0.207 off after the commit at
# 134, outside the former INT8_BOUNDS (0.15, 0.995, 0.15) and inside the Reference's own spread (test_tree_verify.py)
@example(length=133, seed=24020, budget=0)
@example(length=134, seed=24020, budget=0)
@example(length=600, seed=8, budget=BUDGET)  # tree_attention over 3 key ranges
def test_every_slot_matches_its_path(length, seed, budget):
    check_slots("tiny-q", length, seed, budget)


@pytest.mark.parametrize("budget", [40, 70])
def test_passes_of_more_than_32_slots_match_their_paths(budget):
    """Passes wider than one row group (41 slots: every GEMM's rows as two groups of nt3 side by side; 71: three of
    nt3), a tree of that many nodes over 10 depths of top-8, every slot against the Reference along its path."""
    check_slots("tiny-q", 77, budget, budget, shape=(10, 8))


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**16), length=st.integers(1, 200), corrupt=st.frozensets(st.integers(1, 95), max_size=12))
def test_spec_decoding_is_lossless(seed, length, corrupt):
    print(check_lossless("tiny-q", seed, length, 96, corrupt))


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(kv=st.sampled_from(["q8_0", "q4_0", "tq3_0"]), length=st.integers(1, 300), seed=st.integers(0, 2**16),
       budget=st.integers(0, BUDGET))
@example(kv="tq3_0", length=600, seed=9, budget=BUDGET)
def test_quantised_kv_cache_slots_match_their_paths(kv, length, seed, budget):
    """The KV cache in q8_0 / q4_0 / tq3_0 (lucegen/model/kv_cache.py): every slot against the Reference holding the same
    format, and the cache after a commit against the Reference's (one code of slack: tests/gpu/gpu_models.py)."""
    check_slots(f"tiny-q/{kv}", length, seed, budget)


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(kv=st.sampled_from(["q8_0", "q4_0", "tq3_0"]), seed=st.integers(0, 2**16), length=st.integers(1, 200),
       corrupt=st.frozensets(st.integers(1, 95), max_size=12))
def test_spec_decoding_is_lossless_with_a_quantised_kv_cache(kv, seed, length, corrupt):
    print(kv, check_lossless(f"tiny-q/{kv}", seed, length, 96, corrupt))


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(kv=st.sampled_from(["q8_0", "q4_0", "tq3_0"]), length=st.integers(1, 300), seed=st.integers(0, 2**16),
       budget=st.integers(0, BUDGET))
@example(kv="q4_0", length=600, seed=5, budget=BUDGET)  # three key ranges of tree_attention_mma
@example(kv="tq3_0", length=1, seed=3, budget=BUDGET)  # the root's one committed key, the rest the tree's
def test_quantised_kv_cache_slots_match_their_paths_on_tensor_cores(kv, length, seed, budget):
    """The same check with every slot on tree_attention_mma (tensor_core_keys=1), whose committed tiles come through
    shared memory as the cache holds them and are dequantised there."""
    needs_tensor_cores(f"tiny-q/{kv}")
    check_slots(f"tiny-q/{kv}", length, seed, budget, tc=1)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(kv=st.sampled_from(["q8_0", "q4_0", "tq3_0"]), seed=st.integers(0, 2**16), length=st.integers(1, 200),
       cross=st.integers(1, 60), corrupt=st.frozensets(st.integers(1, 95), max_size=12))
def test_spec_decoding_is_lossless_with_a_quantised_kv_cache_across_the_tensor_core_bound(kv, seed, length, cross,
                                                                                         corrupt):
    needs_tensor_cores(f"tiny-q/{kv}")
    print(kv, check_lossless(f"tiny-q/{kv}", seed, length, 96, corrupt, tc=length + cross))


def test_memory_plan_matches_what_the_engine_allocates():
    """The plan's per-token and per-slot bytes against the device's ledger: the same engine built at two contexts
    and two budgets (same prefill segment) allocates exactly what the plan says the difference costs."""
    from lucegen.runtime.memory_plan import MemoryPlan
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    dev = gpu_device()

    def build(max_context, budget):
        base = dev.allocated
        dec = QuantDecoder(gguf_file("tiny-q"), device=dev, max_context=max_context, kv_cache="q4_0")
        parts = (Prefiller(dec, segment=64), TreeVerifier(dec, budget=budget))
        return dec, parts, dev.allocated - base

    dec, (pre, ver), small = build(256, 4)
    plan = MemoryPlan.of_engine(dec, ver)
    for part in (ver, pre, dec):
        part.close()
    dec, parts, big = build(1280, 20)
    for part in (*parts, dec):
        part.close()
    assert big - small == plan.bytes_at(1280, 21, "q4_0") - plan.bytes_at(256, 5, "q4_0")
    print(plan.format())


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(length=st.integers(1, 300), seed=st.integers(0, 2**16), budget=st.integers(0, BUDGET))
def test_every_slot_matches_its_path_in_the_legacy_mix(length, seed, budget):
    """tiny-q in the older Q4_K_M mix (every DeltaNet in-projection a K-quant group, on int8 activations), beside
    tiny-q in llama.cpp's current one (F32 ssm_alpha/ssm_beta converted to Q8_0 at load: float activations)."""
    check_slots("tiny-q-legacy", length, seed, budget)


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**16), length=st.integers(1, 200), corrupt=st.frozensets(st.integers(1, 95), max_size=12))
def test_spec_decoding_is_lossless_in_the_legacy_mix(seed, length, corrupt):
    print(check_lossless("tiny-q-legacy", seed, length, 96, corrupt))


def test_device_decode_is_greedy():
    check_decode_is_greedy("tiny-q", 37, 3, 40)


@pytest.mark.skipif(not os.environ.get("LUCEGEN_27B_GGUF"), reason="set LUCEGEN_27B_GGUF to a Qwen3.5-27B Q4_K_M GGUF")
def test_device_decode_is_greedy_27b():
    """The 27B shape: 3 value heads a key head in ggml's tiled order, so three deltanet_decode_step blocks share each
    key head's q and k window channels."""
    check_decode_is_greedy("27b", 21, 4, 12)


def test_unreadable_gguf_is_refused():
    from lucegen.runtime.quant_target import QuantDecoder

    with pytest.raises(CheckpointError, match="BF16"):
        QuantDecoder(gguf_file("tiny-q", quant="bf16"), device=gpu_device(), max_context=64)


@pytest.mark.skipif(not os.environ.get("LUCEGEN_27B_GGUF"), reason="set LUCEGEN_27B_GGUF to a Qwen3.5-27B Q4_K_M GGUF")
def test_spec_decoding_is_lossless_27b():
    """The 27B shape (`lucegen init-weights --preset qwen3.5-27b --format gguf --quant q4_k_m`): random, oracle and
    corrupted drafts, chain and tree, token for token against one-slot greedy."""
    print(check_lossless("27b", 5, 16, 40, frozenset({2, 9, 10, 23})))


@pytest.mark.skipif(not os.environ.get("LUCEGEN_27B_GGUF"), reason="set LUCEGEN_27B_GGUF to a Qwen3.5-27B Q4_K_M GGUF")
def test_spec_decoding_is_lossless_27b_across_the_tensor_core_bound():
    """The same over a run that crosses the descriptor's [ddtree] tensor_core_attention_keys 16 tokens after its
    prompt: the 27B's attention (6 query heads a kv head, head_dim 256) on both tree_attention bodies, and passes whose
    slots take both."""
    dec, _, ver = engine("27b")
    bound = ver.tree_attention.mma_keys
    if bound is None or not 16 < bound < dec.max_context - 64:
        pytest.skip(f"{dec.target.name}: no tensor-core bound inside this engine's context ({bound})")
    print(check_lossless("27b", 5, bound - 16, 40, frozenset({2, 9, 10, 23})))


@pytest.mark.skipif(not os.environ.get("LUCEGEN_27B_GGUF"), reason="set LUCEGEN_27B_GGUF to a Qwen3.5-27B Q4_K_M GGUF")
@pytest.mark.parametrize("kv", ["q4_0", "tq3_0"])
def test_spec_decoding_is_lossless_27b_quantised_kv(kv):
    """The same with the KV cache in q4_0 / tq3_0 (head_dim 256: eight values a lane in the FMA tree attention, tiles
    dequantised in shared memory on the tensor-core one), over a run that crosses the descriptor's bound where it
    lies inside the engine's context."""
    dec, _, ver = engine(f"27b/{kv}")
    bound = ver.tree_attention.mma_keys
    length = bound - 16 if bound is not None and 16 < bound < dec.max_context - 64 else 16
    print(check_lossless(f"27b/{kv}", 5, length, 40, frozenset({2, 9, 10, 23})))

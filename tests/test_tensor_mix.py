"""Every tensor-type mix of a real quantised GGUF on the quantised target: llama.cpp's current Q4_K_M recipe for qwen35
(attn_qkv counted with attn_v by use_more_bits, F32 ssm_alpha / ssm_beta) and the older one, the conversions to Q8_0
at load (exact for Q4_0 / Q5_0, requantised for Q5_1 and the float types) that the device and the Reference share,
and an engine on HostDevice prefilling and verifying a file with every type in it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.errors import CheckpointError
from lucegen.model import quant
from lucegen.model.block_conversion import EXACT_TO_Q8_0, ROUNDED_TO_Q8_0, to_q8_0
from lucegen.model.config import ModelConfig
from lucegen.model.init_gguf import q4_k_m_legacy_types, q4_k_m_types, use_more_bits, write_gguf_checkpoint


def random_blocks(rng, type_name: str, n_blocks: int) -> np.ndarray:
    """Random valid blocks of a 32-value type: any quants, finite f16 scales (and mins)."""
    size = quant.TYPES[type_name][2]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    blocks[:, 0:2] = rng.normal(0, 0.01, (n_blocks, 1)).astype(np.float16).view(np.uint8)
    if type_name == "Q5_1":
        blocks[:, 2:4] = rng.normal(0, 0.01, (n_blocks, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(-1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(EXACT_TO_Q8_0), n_blocks=st.integers(1, 40))
def test_q4_0_and_q5_0_convert_to_q8_0_exactly(seed, kind, n_blocks):
    raw = random_blocks(np.random.default_rng(seed), kind, n_blocks)
    q8 = to_q8_0(raw, kind, 32 * n_blocks)
    assert q8.size == 34 * n_blocks
    assert np.array_equal(quant.dequantize(q8, "Q8_0", 32 * n_blocks), quant.dequantize(raw, kind, 32 * n_blocks))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(ROUNDED_TO_Q8_0), n_blocks=st.integers(1, 40))
def test_other_types_requantise_within_half_a_step(seed, kind, n_blocks):
    rng = np.random.default_rng(seed)
    n = 32 * n_blocks
    raw = (random_blocks(rng, kind, n_blocks) if kind == "Q5_1"
           else quant.quantize(rng.normal(0, 0.02, n).astype(np.float32), kind))
    x = quant.dequantize(raw, kind, n).reshape(-1, 32)
    y = quant.dequantize(to_q8_0(raw, kind, n), "Q8_0", n).reshape(-1, 32)
    step = np.abs(x).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(x - y) <= 0.5 * step * 1.01 + 1e-12)


def test_q4_k_m_recipe_counts_attn_qkv_with_attn_v():
    """llama.cpp's llama_tensor_get_type_impl (ggml-org/llama.cpp 007dbbf, src/llama-quant.cpp): attn_v and attn_qkv
    share category_is_attn_v, so on the 27B (48 DeltaNet attn_qkv + 16 attn_v, one per layer in llama.cpp's layer
    order) the i-th of those 64 gets Q6_K where use_more_bits(i, 64), else Q4_K; ssm_alpha / ssm_beta stay F32;
    ssm_out and the rest Q4_K; ffn_down by its layer; output Q6_K."""
    config = ModelConfig.preset("qwen3.5-27b")
    types = q4_k_m_types(config)
    n = config.num_layers
    for i in range(n):
        linear = config.layer_types[i] != "full_attention"
        wv = f"layers.{i}.linear_attn.in_proj_qkv.weight" if linear else f"layers.{i}.self_attn.v_proj.weight"
        assert types[wv] == ("Q6_K" if use_more_bits(i, n) else "Q4_K"), (i, types[wv])
        assert types[f"layers.{i}.mlp.down_proj.weight"] == ("Q6_K" if use_more_bits(i, n) else "Q4_K")
        if linear:
            la = f"layers.{i}.linear_attn."
            assert types[la + "in_proj_a.weight"] == types[la + "in_proj_b.weight"] == "F32"
            assert types[la + "out_proj.weight"] == types[la + "in_proj_z.weight"] == "Q4_K"
            assert types[la + "conv1d.weight"] == "F32"
    assert types["lm_head.weight"] == "Q6_K" and types["embed_tokens.weight"] == "Q4_K"
    # the 27B: layers 0..7 and 56..63, then every third from 10: both Q6_K and Q4_K attn_qkv occur
    qkv = {types[f"layers.{i}.linear_attn.in_proj_qkv.weight"] for i in range(n) if i % 4 != 3}
    assert qkv == {"Q4_K", "Q6_K"}
    legacy = q4_k_m_legacy_types(config)
    assert legacy["layers.0.linear_attn.in_proj_qkv.weight"] == "Q5_K"
    assert legacy["layers.0.linear_attn.in_proj_a.weight"] == "Q4_K"
    differs = {n for n in types if types[n] != legacy[n]}
    assert differs and all(("in_proj_qkv" in n or "in_proj_a" in n or "in_proj_b" in n or "v_proj" in n)
                           for n in differs), sorted(differs)[:5]


def test_init_weights_writes_both_recipes(tmp_path):
    import gguf

    from lucegen.cli import main

    for quant_name, a_type, qkv_types in (("q4_k_m", "F32", {"Q4_K", "Q6_K"}), ("q4_k_m_legacy", "Q4_K", {"Q5_K"})):
        out = tmp_path / f"{quant_name}.gguf"
        assert main(["init-weights", "--preset", "tiny-q", "--format", "gguf", "--quant", quant_name, "--out",
                     str(out), "--quiet"]) == 0
        reader = gguf.GGUFReader(out)
        kinds = {t.name: t.tensor_type.name for t in reader.tensors}
        assert {k for n, k in kinds.items() if n.endswith("ssm_alpha.weight")} == {a_type}
        assert {k for n, k in kinds.items() if n.endswith("attn_qkv.weight")} <= qkv_types
        assert reader.fields["general.file_type"].contents() == 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M


# ------------------------------------------------------------------------------------------------ the engine
#: A mix with every type the quantised target reads or converts, spread over one DeltaNet and one attention layer.
EVERY_TYPE = {
    "layers.0.linear_attn.in_proj_qkv.weight": "Q6_K", "layers.0.linear_attn.in_proj_z.weight": "Q5_0",
    "layers.0.linear_attn.in_proj_a.weight": "F32", "layers.0.linear_attn.in_proj_b.weight": "BF16",
    "layers.0.linear_attn.out_proj.weight": "Q5_K", "layers.0.mlp.gate_proj.weight": "Q4_0",
    "layers.0.mlp.up_proj.weight": "Q5_1", "layers.0.mlp.down_proj.weight": "Q4_K",
    "layers.3.self_attn.q_proj.weight": "F16", "layers.3.self_attn.k_proj.weight": "Q8_0",
    "layers.3.self_attn.v_proj.weight": "Q6_K", "layers.3.self_attn.o_proj.weight": "Q4_0",
    "layers.3.mlp.down_proj.weight": "Q5_0",
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    from lucegen.model import init_gguf

    root = tmp_path_factory.mktemp("mix")
    config = ModelConfig.preset("tiny-q")
    write_gguf_checkpoint(config, root / "real.gguf", quant="q4_k_m", seed=1, progress=False)
    plain = init_gguf.tensor_types
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(init_gguf, "tensor_types", lambda c, q: {**plain(c, q), **EVERY_TYPE})
        write_gguf_checkpoint(config, root / "every.gguf", quant="q4_k_m", seed=1, progress=False)
    return root


@pytest.mark.parametrize("file", ["real.gguf", "every.gguf"])
def test_quantised_target_prefills_and_verifies_every_mix(mixed, file, require_compiler):
    """The real Q4_K_M mix and a file holding every type: QuantDecoder on HostDevice converts what its GEMM does not
    read (once, in the checkpoint the Reference reads too), lists it in the memory plan, prefills and verifies with
    every launch checked, and frees everything."""
    from lucegen.model.gguf_io import load_gguf
    from lucegen.runtime import ddtree
    from lucegen.runtime.host_device import HostDevice
    from lucegen.runtime.memory_plan import MemoryPlan
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier
    from lucegen.target import load_target

    target = load_target("sm_90")
    require_compiler(target)
    dev = HostDevice(target)
    dev.reply = lambda buffer, dtype, shape: np.zeros(shape, dtype)
    dec = QuantDecoder(mixed / file, device=dev, max_context=256)
    stored = load_gguf(mixed / file)
    ck = dec.checkpoint
    converted = {c.gguf_name: c for c in ck.conversions}
    for name in (n for _, names, _ in dec._matrix_names() for n in names):
        assert ck.dtype(name) in ("Q8_0", "Q4_K", "Q5_K", "Q6_K")
        g = ck.where[name]
        if stored.dtype(name) in ("Q4_0", "Q5_0"):
            assert converted[g].exact and np.array_equal(ck.f32(name), stored.f32(name)), name
        elif stored.dtype(name) in ("F32", "F16", "BF16", "Q5_1"):
            assert not converted[g].exact
            values = stored.f32(name)
            assert np.abs(ck.f32(name) - values).max() <= np.abs(values).max() / 127 / 2 * 1.01, name
        else:
            assert g not in converted and np.array_equal(ck.f32(name), stored.f32(name))
    assert converted, "each file has matrices to convert"
    if file == "real.gguf":
        assert {c.stored for c in converted.values()} == {"F32"}
        assert {c.gguf_name.split(".")[-2] for c in converted.values()} == {"ssm_alpha", "ssm_beta"}
    else:
        assert {c.stored for c in converted.values()} >= {"F32", "F16", "BF16", "Q4_0", "Q5_0", "Q5_1"}
    pre = Prefiller(dec)
    pre.prefill(np.arange(40, dtype=np.int32) % dec.config.vocab_size)
    ver = TreeVerifier(dec, budget=8)
    ver.verify(ddtree.chain(np.arange(8) % dec.config.vocab_size), 1)
    text = MemoryPlan.of_engine(dec, ver).format([target])
    assert "converted once at load" in text and "F32 -> Q8_0 (requantised)" in text, text
    for part in (ver, pre, dec):
        part.close()
    assert dev.allocated == 0


def test_a_matrix_of_a_type_without_a_conversion_is_refused(mixed):
    """A type outside the reader's and the converted ones (here Q6_K for a reader of Q8_0 alone) is refused by name."""
    from lucegen.model.block_conversion import ConvertedGGUFCheckpoint
    from lucegen.model.gguf_io import load_gguf

    ck = load_gguf(mixed / "every.gguf")
    name = "layers.0.linear_attn.in_proj_qkv.weight"  # Q6_K in EVERY_TYPE
    with pytest.raises(CheckpointError, match=r"'blk\.0\.attn_qkv\.weight' is Q6_K \[.*\]; the test reader reads Q8_0"):
        ConvertedGGUFCheckpoint(ck, [name], ("Q8_0",), "the test reader")

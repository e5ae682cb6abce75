"""GGUF: bit-exact dequantisation, llama.cpp's qwen35 layout both ways, the Q4_K_M recipe, bad files, fuzzing."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucegen.errors import CheckpointError
from lucegen.model import quant
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.config import ModelConfig
from lucegen.model.gguf_io import GGUFFile, from_gguf_layout, gguf_name, to_gguf_layout
from lucegen.model.init_gguf import q4_k_m_legacy_types, random_k_blocks, write_gguf_checkpoint
from lucegen.model.init_weights import write_hf_checkpoint
from lucegen.model.tokenizer import load_tokenizer

gguf = pytest.importorskip("gguf")
QUANTISED = ("Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
# relative RMS error of our quantisers on Gaussian data (min/max scales, no search)
ROUNDTRIP_BOUND = {"Q8_0": 0.01, "Q4_0": 0.12, "Q5_0": 0.06, "Q5_1": 0.05, "Q4_K": 0.1, "Q5_K": 0.05, "Q6_K": 0.03}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(QUANTISED), n_blocks=st.integers(1, 8), seed=st.integers(0, 2**32 - 1))
def test_dequantisation_is_bit_exact_with_gguf_package(kind, n_blocks, seed):
    size = quant.TYPES[kind][2]
    raw = np.random.default_rng(seed).integers(0, 256, (n_blocks, size), dtype=np.uint8)
    ours = quant.dequantize(raw, kind, n_blocks * quant.TYPES[kind][1])
    with np.errstate(all="ignore"):
        theirs = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(-1)
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("kind", QUANTISED)
def test_quantisers_write_valid_blocks_with_bounded_error(kind):
    x = (np.random.default_rng(1).standard_normal(256 * 64) * 0.02).astype(np.float32)
    blocks = quant.quantize(x, kind)
    assert blocks.size == quant.nbytes(kind, x.size)
    back = quant.dequantize(blocks, kind, x.size)
    theirs = gguf.quants.dequantize(blocks.reshape(-1, quant.TYPES[kind][2]), gguf.GGMLQuantizationType[kind])
    np.testing.assert_array_equal(back, theirs.reshape(-1))
    assert np.sqrt(np.mean((back - x) ** 2)) / np.sqrt(np.mean(x ** 2)) < ROUNDTRIP_BOUND[kind]


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K", "Q8_0"])
def test_random_blocks_have_realistic_statistics(kind):
    blocks = random_k_blocks(np.random.default_rng(0), kind, 512, 0.02)
    values = quant.dequantize(blocks, kind, 512 * quant.TYPES[kind][1])
    assert np.isfinite(values).all()
    assert abs(values.mean()) < 0.005 and 0.013 < values.std() < 0.03, (values.mean(), values.std())


@pytest.mark.parametrize("preset", ["tiny", "tiny-gqa"])
def test_gguf_layout_transforms_round_trip(preset):
    config = ModelConfig.preset(preset)
    rng = np.random.default_rng(0)
    for name, shape in config.tensor_shapes().items():
        x = rng.standard_normal(shape).astype(np.float32)
        if name.endswith("A_log"):
            x = np.abs(x)
        y = to_gguf_layout(config, name, x)
        np.testing.assert_allclose(from_gguf_layout(config, name, y), x, rtol=1e-6, atol=1e-6)


def test_value_heads_go_to_tiled_order():
    config = ModelConfig.preset("tiny-gqa")  # 2 key heads, 4 value heads: grouped [g0v0 g0v1 g1v0 g1v1]
    a = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(to_gguf_layout(config, "layers.0.linear_attn.dt_bias", a), [0, 2, 1, 3])


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    out = {}
    for preset in ("tiny", "tiny-gqa"):
        config = ModelConfig.preset(preset)
        write_hf_checkpoint(config, root / preset, seed=4, progress=False)
        for q in ("bf16", "q8_0", "q4_k_m"):
            write_gguf_checkpoint(config, root / f"{preset}-{q}.gguf", quant=q, seed=4, progress=False)
        out[preset] = root
    return out


@pytest.mark.parametrize("preset", ["tiny", "tiny-gqa"])
@pytest.mark.parametrize("q,bound", [("bf16", 1e-6), ("q8_0", 0.01), ("q4_k_m", 0.08)])
def test_gguf_and_safetensors_from_one_seed_hold_the_same_weights(written, preset, q, bound):
    root = written[preset]
    st_ck, gg_ck = load_checkpoint(root / preset), load_checkpoint(root / f"{preset}-{q}.gguf")
    assert gg_ck.config.to_hf_config() == st_ck.config.to_hf_config()
    assert gg_ck.names() == st_ck.names()
    for name in st_ck.names():
        a, b = st_ck.f32(name), gg_ck.f32(name)
        assert a.shape == b.shape
        assert np.abs(a - b).max() <= bound * np.abs(a).max() + 1e-7, (name, gg_ck.dtype(name))


def test_gguf_package_reads_our_file_as_qwen35(written):
    reader = gguf.GGUFReader(written["tiny-gqa"] / "tiny-gqa-q4_k_m.gguf")
    assert reader.fields["general.architecture"].contents() == "qwen35"
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN35]}
    for t in reader.tensors:
        base = t.name.rsplit(".", 1)[0] if t.name.endswith((".weight", ".bias")) else t.name
        assert re.sub(r"^blk\.\d+\.", "blk.{bid}.", base) in allowed, t.name


def test_gguf_tokenizer_matches_the_safetensors_one(written):
    a = load_tokenizer(written["tiny"] / "tiny-bf16.gguf")
    b = load_tokenizer(written["tiny"] / "tiny")
    text = "The kernel launches 128 blocks; café 東京 <|im_end|>"
    assert a.encode(text) == b.encode(text) and a.decode(a.encode(text)) == text
    assert a.eos_id == b.eos_id == 0


def test_q4_k_m_legacy_recipe_follows_the_older_llama_cpp():
    types = q4_k_m_legacy_types(ModelConfig.preset("qwen3.5-0.8b"))
    assert types["embed_tokens.weight"] == "Q6_K"  # tied: token_embd gets the output type
    assert types["layers.0.linear_attn.in_proj_qkv.weight"] == "Q5_K"
    assert types["layers.0.linear_attn.conv1d.weight"] == "F32" and types["norm.weight"] == "F32"
    down = [types[f"layers.{i}.mlp.down_proj.weight"] for i in range(24)]
    assert down[:3] == ["Q6_K"] * 3 and down[3] == "Q4_K" and down[21:] == ["Q6_K"] * 3
    v = [types[f"layers.{i}.self_attn.v_proj.weight"] for i in range(3, 24, 4)]
    # use_more_bits(i, 6): i < 0, i >= 5 or (i - 0) % 3 == 2
    assert v == ["Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K"]
    big = q4_k_m_legacy_types(ModelConfig.preset("qwen3.5-27b"))
    assert big["lm_head.weight"] == "Q6_K" and big["embed_tokens.weight"] == "Q4_K"
    assert set(big.values()) <= {"F32", "Q4_K", "Q5_K", "Q6_K"}


# ------------------------------------------------------------------------------------------------ bad input
def _rewrite_metadata(src, dst, key, value):
    """Copy a GGUF file changing one string metadata value (same length keeps offsets valid)."""
    data = bytearray(src.read_bytes())
    old = GGUFFile(src).metadata[key].encode()
    new = value.encode()
    assert len(new) == len(old)
    i = data.index(key.encode()) + len(key) + 4 + 8
    assert data[i : i + len(old)] == old
    data[i : i + len(old)] = new
    dst.write_bytes(bytes(data))


def test_other_architecture_is_refused(written, tmp_path):
    bad = tmp_path / "llama.gguf"
    _rewrite_metadata(written["tiny"] / "tiny-bf16.gguf", bad, "general.architecture", "llama3")
    with pytest.raises(CheckpointError, match=r"general\.architecture.*'llama3' is not 'qwen35'"):
        load_checkpoint(bad)


def test_truncated_gguf_names_the_tensor(written, tmp_path):
    data = (written["tiny"] / "tiny-bf16.gguf").read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"cut\.gguf: tensor '.*': data at offset .* outside the file"):
        load_checkpoint(bad)
    bad.write_bytes(data[:100])
    with pytest.raises(CheckpointError, match="truncated while reading"):
        load_checkpoint(bad)


def test_gguf_with_missing_metadata(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "x.gguf", "qwen35")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((7, 3), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match=r"x\.gguf: metadata 'qwen35\.[a-z_.]+': missing"):
        load_checkpoint(tmp_path / "x.gguf")


@pytest.fixture(scope="module")
def small_gguf(written):
    return (written["tiny"] / "tiny-q4_k_m.gguf").read_bytes()


def _parse(path, data):
    path.write_bytes(data)
    try:
        ck = load_checkpoint(path)
        for name in ck.names()[:3]:
            ck.f32(name)
    except CheckpointError:
        pass


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_gguf_headers_give_clean_errors(tmp_path, small_gguf, data):
    blob = bytearray(small_gguf)
    limit = min(len(blob), 40000)  # the metadata and tensor directory (the tokenizer makes it ~30 kB)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, limit - 1))
        blob[pos] = data.draw(st.sampled_from([0, 1, 0xFF, 0x7F, 0x80, data.draw(st.integers(0, 255))]))
    _parse(tmp_path / "fuzz.gguf", bytes(blob))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 40000))
def test_fuzz_truncated_gguf_gives_clean_errors(tmp_path, small_gguf, cut):
    _parse(tmp_path / "cut.gguf", small_gguf[:cut])


def test_huge_counts_do_not_hang(tmp_path):
    path = tmp_path / "huge.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**62, 2**62))
    with pytest.raises(CheckpointError, match="more than the file holds"):
        load_checkpoint(path)
    # a string array claiming 2^40 items
    body = struct.pack("<Q", 3) + b"key" + struct.pack("<IIQ", 9, 8, 2**40)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body)
    with pytest.raises(CheckpointError, match="runs past the end"):
        load_checkpoint(path)


def test_gguf_names_cover_every_internal_tensor():
    config = ModelConfig.preset("tiny-gqa")
    names = [gguf_name(n) for n in config.tensor_shapes()]
    assert len(set(names)) == len(names)


def test_quantised_target_refuses_an_embedding_it_cannot_gather(tmp_path, monkeypatch):
    """tiny-q's legacy Q4_K_M file is what the quantised target reads (matrices in the GEMM's types, token_embd in the
    gather's: tests/gpu run the DFlash draft on it); with token_embd in F16 the target, and with it a draft that
    borrows that embedding, is refused naming the tensor, before any device is opened."""
    from lucegen.families.quant_gemm import GEMM_TYPES
    from lucegen.families.quant_matvec import QUANT_TYPES
    from lucegen.model import init_gguf
    from lucegen.runtime.quant_target import open_target

    config = ModelConfig.preset("tiny-q")
    types = q4_k_m_legacy_types(config)
    shapes = config.tensor_shapes()
    assert {types[n] for n, s in shapes.items() if len(s) == 2 and "conv1d" not in n} <= set(GEMM_TYPES)
    assert types["embed_tokens.weight"] in QUANT_TYPES
    plain = init_gguf.tensor_types
    monkeypatch.setattr(init_gguf, "tensor_types", lambda c, q: {**plain(c, q), "embed_tokens.weight": "F16"})
    path = tmp_path / "tiny-q-f16-embed.gguf"
    write_gguf_checkpoint(config, path, quant="q4_k_m_legacy", progress=False)
    with pytest.raises(CheckpointError, match=r"token_embd\.weight is F16; the quantised target .*gathers Q8_0"):
        open_target(path, max_context=64)

"""HF safetensors checkpoints: both official layouts, sharding, and one clear error for each kind of bad input."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucegen.errors import CheckpointError
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.config import ModelConfig
from lucegen.model.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from lucegen.model.init_weights import init_tensor, write_hf_checkpoint
from lucegen.model.safetensors_io import SafetensorsFile, read_header, write_safetensors

CONFIG = ModelConfig.preset("tiny")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    write_hf_checkpoint(CONFIG, path, seed=5, progress=False)
    return path


def copy_of(src, dst):
    shutil.copytree(src, dst)
    return dst


def rewrite(directory, transform, config=None):
    """Rewrite model.safetensors through transform(list of (name, dtype, array)) -> same; optional new config."""
    f = SafetensorsFile(directory / "model.safetensors")
    items = [(n, f.tensors[n].dtype, np.array(f.raw(n))) for n in f.names()]
    items = transform(items)
    data = {n: a for n, _, a in items}
    (directory / "model.safetensors").unlink()
    write_safetensors(directory / "model.safetensors", [(n, d, a.shape) for n, d, a in items], data.__getitem__)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))


def test_loads_every_tensor_with_exact_bf16_bits(tiny_dir):
    ck = load_checkpoint(tiny_dir)
    assert ck.config.to_hf_config()["layer_types"] == list(CONFIG.layer_types)
    assert ck.names() == list(CONFIG.tensor_shapes())
    for name in ck.names():
        bits = init_tensor(CONFIG, name, 5)
        np.testing.assert_array_equal(ck.bf16(name), bits)
        np.testing.assert_array_equal(ck.f32(name), bf16_bits_to_f32(bits))
        assert ck.dtype(name) == "BF16" and ck.shape(name) == CONFIG.tensor_shapes()[name]
    # a file inside the directory also names the checkpoint
    assert load_checkpoint(tiny_dir / "model.safetensors").names() == ck.names()


def test_official_multimodal_layout(tiny_dir, tmp_path):
    d = copy_of(tiny_dir, tmp_path / "mm")
    text = json.loads((d / "config.json").read_text())
    wrapper = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
               "text_config": text, "vision_config": {"depth": 1}, "tie_word_embeddings": True}

    def to_multimodal(items):
        out = [("model.language_model." + n.removeprefix("model."), d_, a) for n, d_, a in items]
        out.append(("model.visual.blocks.0.attn.qkv.weight", "BF16", np.zeros((6, 2), np.uint16)))
        out.append(("mtp.layers.0.mlp.up_proj.weight", "BF16", np.zeros((2, 2), np.uint16)))
        return out

    rewrite(d, to_multimodal, wrapper)
    a, b = load_checkpoint(tiny_dir), load_checkpoint(d)
    assert a.names() == b.names()
    for name in a.names():
        np.testing.assert_array_equal(a.bf16(name), b.bf16(name))


def test_sharded_with_index_and_f32_tensors(tiny_dir, tmp_path):
    d = copy_of(tiny_dir, tmp_path / "sharded")
    src = SafetensorsFile(d / "model.safetensors")
    names = src.names()
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        # shard 2 stores float32: the loader converts
        dtype = "BF16" if i == 0 else "F32"
        produce = (lambda n: np.array(src.raw(n))) if i == 0 else (lambda n: bf16_bits_to_f32(src.raw(n)))
        write_safetensors(d / fname, [(n, dtype, src.tensors[n].shape) for n in part], produce)
        weight_map.update({n: fname for n in part})
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    a, b = load_checkpoint(tiny_dir), load_checkpoint(d)
    for name in a.names():
        np.testing.assert_array_equal(a.f32(name), b.f32(name))
        np.testing.assert_array_equal(a.bf16(name), b.bf16(name))  # F32 holding bf16 values rounds back exactly


def _drop(name):
    return lambda items: [it for it in items if it[0] != name]


def _add(name, shape, dtype="BF16"):
    return lambda items: items + [(name, dtype, np.zeros(shape, np.uint16 if dtype == "BF16" else np.int32))]


def _reshape(name, shape):
    return lambda items: [(n, d, np.zeros(shape, np.uint16) if n == name else a) for n, d, a in items]


def _retype(name):
    return lambda items: [(n, "I32", a.astype(np.int32)) if n == name else (n, d, a) for n, d, a in items]


@pytest.mark.parametrize("transform,match", [
    (_drop("model.layers.2.linear_attn.A_log"), "missing tensor 'layers.2.linear_attn.A_log'"),
    (_add("model.layers.1.self_attn.q_proj.weight", (512, 128)),
     "unexpected tensor 'model.layers.1.self_attn.q_proj.weight'.*layer 1 is linear_attention"),
    (_add("model.layers.9.mlp.up_proj.weight", (2, 2)), "unexpected tensor 'model.layers.9.mlp.up_proj.weight'"),
    (_reshape("model.layers.3.self_attn.k_proj.weight", (64, 128)),
     r"tensor 'model.layers.3.self_attn.k_proj.weight': shape \[64, 128\], config.json implies \[128, 128\]"),
    (_retype("model.norm.weight"), "tensor 'model.norm.weight': dtype I32"),
])
def test_bad_tensors_give_one_clear_error(tiny_dir, tmp_path, transform, match):
    d = copy_of(tiny_dir, tmp_path / "bad")
    rewrite(d, transform)
    with pytest.raises(CheckpointError, match=match) as info:
        load_checkpoint(d)
    assert str(d) in str(info.value)


def test_truncated_file_and_lying_header(tiny_dir, tmp_path):
    d = copy_of(tiny_dir, tmp_path / "trunc")
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor '.*': data_offsets end .* past the end"):
        load_checkpoint(d)
    path.write_bytes(data[:5])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(d)
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    name = "model.embed_tokens.weight"
    header[name]["data_offsets"][1] -= 2  # says the tensor is 2 bytes shorter than its shape needs
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])
    with pytest.raises(CheckpointError, match=f"tensor '{name}': data_offsets span"):
        load_checkpoint(d)


def test_index_naming_a_missing_shard(tiny_dir, tmp_path):
    d = copy_of(tiny_dir, tmp_path / "idx")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"model.norm.weight": "gone.st"}}))
    with pytest.raises(CheckpointError, match="weight_map names shard 'gone.st'"):
        load_checkpoint(d)


def test_missing_directory_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path)


def test_bf16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * np.float32(3e-3)
    x[:4] = [np.inf, -np.inf, 0.0, -0.0]
    ours = f32_to_bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


# ------------------------------------------------------------------------------------------------ fuzzing
@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "small.safetensors"
    tensors = {"a": np.arange(6, dtype=np.uint16).reshape(2, 3), "b": np.ones(4, np.float32)}
    write_safetensors(path, [("a", "BF16", (2, 3)), ("b", "F32", (4,))], tensors.__getitem__)
    return path.read_bytes()


def _parse(tmp_path, data: bytes):
    path = tmp_path / "fuzzed.safetensors"
    path.write_bytes(data)
    try:
        f = SafetensorsFile(path)
        for name in f.names():
            f.raw(name).sum()
    except CheckpointError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_headers_give_clean_errors(tmp_path, small_file, data):
    blob = bytearray(small_file)
    (n,) = struct.unpack("<Q", blob[:8])
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, 8 + n - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    _parse(tmp_path, bytes(blob))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 200))
def test_fuzz_truncated_files_give_clean_errors(tmp_path, small_file, cut):
    _parse(tmp_path, small_file[: max(0, len(small_file) - cut)])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=5),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                           max_leaves=12))
def test_fuzz_arbitrary_json_headers(tmp_path, header):
    text = json.dumps({"t": header}).encode()
    _parse(tmp_path, struct.pack("<Q", len(text)) + text + b"\0" * 16)
    text = json.dumps(header).encode()
    _parse(tmp_path, struct.pack("<Q", len(text)) + text)


def test_read_header_reports_overlap(tmp_path):
    header = {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
              "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}
    text = json.dumps(header).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(6))
    with pytest.raises(CheckpointError, match="overlaps"):
        read_header(path)

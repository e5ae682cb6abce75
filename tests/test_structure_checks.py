"""Relabelled data is refused: a GGUF's tensors tile its data region, a safetensors file's tensors tile theirs and a
checkpoint's 16-bit tensors share one type, and metadata with a physical meaning lies in its range."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest

from lucegen.errors import CheckpointError
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.config import ModelConfig
from lucegen.model.gguf_io import GGUFFile
from lucegen.model.quant import TYPES


def type_field(data: bytes, name: str, n_dims: int) -> int:
    """Byte position of tensor ``name``'s ggml type id in its directory entry."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.index(key) + len(key) + 4 + 8 * n_dims


@pytest.mark.parametrize("tensor, relabel", [("blk.0.attn_qkv.weight", "Q8_0"), ("blk.0.attn_qkv.weight", "F32"),
                                             ("blk.0.attn_norm.weight", "BF16"), ("token_embd.weight", "Q4_0"),
                                             ("output_norm.weight", "F16")])
def test_a_relabelled_gguf_tensor_is_refused(tiny, tmp_path, tensor, relabel):
    source = tiny / "t.gguf"
    g = GGUFFile(source)
    data = bytearray(source.read_bytes())
    i = type_field(data, tensor, len(g.tensors[tensor].shape))
    assert struct.unpack_from("<I", data, i)[0] == TYPES[g.tensors[tensor].type_name][0]
    struct.pack_into("<I", data, i, TYPES[relabel][0])
    bad = tmp_path / "relabelled.gguf"
    bad.write_bytes(data)
    if tensor == "output_norm.weight":  # the last tensor: its shorter data leaves bytes after it
        match = r"bytes after the data of the last tensor 'output_norm.weight' \(F16 \[128\]\)"
    elif relabel == "F32":  # larger: the next tensor's data starts inside it
        match = r"tensor 'blk.0.attn_gate.weight': data at offset \d+, but the tensors before it end at \d+"
    else:
        match = r"tensor '[^']+': data at offset \d+, but the tensors before it end at \d+"
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(bad)


def test_a_relabelled_safetensors_dtype_is_refused(tiny, tmp_path):
    source = tiny / "st"
    raw = (source / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name = "model.layers.0.mlp.up_proj.weight"
    assert header[name]["dtype"] == "BF16"

    def write(h, data=raw[8 + n :]):
        model = tmp_path / "m"
        model.mkdir(exist_ok=True)
        for f in ("config.json", "tokenizer.json"):
            (model / f).write_bytes((source / f).read_bytes())
        text = json.dumps(h).encode()
        (model / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data)
        return model

    same_size = json.loads(json.dumps(header))
    same_size[name]["dtype"] = "F16"  # the byte count cannot tell: the checkpoint's other 16-bit tensors can
    with pytest.raises(CheckpointError, match=rf"tensor '{name}': dtype F16, but tensor '.*' in model.safetensors "
                                              r"is BF16"):
        load_checkpoint(write(same_size))
    smaller = json.loads(json.dumps(header))
    begin, end = smaller[name]["data_offsets"]
    smaller[name]["dtype"], smaller[name]["data_offsets"] = "U8", [begin, begin + (end - begin) // 2]
    smaller[name]["shape"] = [(end - begin) // 2]
    with pytest.raises(CheckpointError, match=r"data starts at \d+, leaving \d+ unused bytes before it"):
        load_checkpoint(write(smaller))
    with pytest.raises(CheckpointError, match=r"2 bytes of data after the last tensor's end"):
        load_checkpoint(write(header, raw[8 + n :] + b"\0\0"))
    load_checkpoint(write(header))  # the header as written loads


@pytest.mark.parametrize("field, value, match", [
    ("rope_theta", 1e-30, r"rope_theta: must be in \(1, 1e\+10\], got 1e-30"),
    ("rope_theta", float("inf"), r"rope_theta: must be in"),
    ("rope_theta", float("nan"), r"rope_theta: must be in"),
    ("rms_norm_eps", 0.5, r"rms_norm_eps: must be in \(0, 0.01\], got 0.5"),
    ("rms_norm_eps", 0.0, r"rms_norm_eps: must be in"),
    ("initializer_range", 3.0, r"initializer_range: must be in \(0, 1\)"),
    ("max_position_embeddings", 1, r"max_position_embeddings: must be an integer of at least 2"),
    ("num_kv_heads", 3, r"num_key_value_heads: 3 does not divide 4 q heads"),
])
def test_config_values_out_of_physics(field, value, match):
    with pytest.raises(CheckpointError, match=match):
        dataclasses.replace(ModelConfig.preset("tiny"), **{field: value})


def test_config_json_and_gguf_metadata_ranges(tiny, tmp_path):
    config = json.loads((tiny / "st" / "config.json").read_text())
    bad = dict(config, eos_token_id=config["vocab_size"])
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(CheckpointError, match=rf"config.json: eos_token_id: {config['vocab_size']} is not a token id "
                                              rf"of the {config['vocab_size']}-token vocabulary"):
        ModelConfig.from_file(tmp_path / "config.json")

    data = bytearray((tiny / "t.gguf").read_bytes())
    key = b"qwen35.rope.freq_base"
    i = data.index(key) + len(key)
    assert struct.unpack_from("<I", data, i)[0] == 6  # float32
    struct.pack_into("<f", data, i + 4, 1e-30)
    (tmp_path / "rope.gguf").write_bytes(data)
    with pytest.raises(CheckpointError, match=r"rope.gguf: metadata: rope_theta: must be in \(1, 1e\+10\]"):
        load_checkpoint(tmp_path / "rope.gguf")


@pytest.mark.parametrize("field, value, match", [("rope_theta", 1e-30, r"rope_theta: must be in \(1, 1e\+10\]"),
                                                 ("rms_norm_eps", 1.0, r"rms_norm_eps: must be in \(0, 0.01\]")])
def test_draft_config_values_out_of_physics(field, value, match):
    from lucegen.model.dflash import DFlashConfig

    with pytest.raises(CheckpointError, match=match):
        dataclasses.replace(DFlashConfig.preset("dflash-tiny"), **{field: value})

"""The DFlash draft model's config, shapes, random weights and loading (lucegen.model.dflash)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.cli import main
from lucegen.errors import CheckpointError
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.config import ModelConfig
from lucegen.model.dflash import PRESETS, DFlashConfig, build_target_layer_ids
from lucegen.model.init_dflash import init_tensor, write_dflash_checkpoint
from lucegen.model.safetensors_io import write_safetensors

# The published z-lab Qwen3 draft layout: block_size at the top level, mask token and taps in dflash_config.
PUBLISHED_27B = {
    "architectures": ["DFlashDraftModel"],
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "model_type": "qwen3",
    "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 5, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000},
    "num_target_layers": 64, "vocab_size": 248320, "tie_word_embeddings": False, "attention_bias": False,
    "max_position_embeddings": 262144, "layer_types": ["full_attention"] * 5, "sliding_window": None,
    "dtype": "bfloat16",
}


def test_27b_preset_is_the_published_draft():
    cfg = DFlashConfig.preset("dflash-qwen3.5-27b")
    assert DFlashConfig.from_hf_config(PUBLISHED_27B) == dataclasses.replace(cfg, name="custom")
    shapes = cfg.tensor_shapes()
    assert shapes["fc.weight"] == (5120, 25600)
    assert shapes["layers.4.self_attn.q_proj.weight"] == (4096, 5120)
    assert shapes["layers.4.self_attn.k_proj.weight"] == (1024, 5120)
    assert shapes["layers.0.self_attn.o_proj.weight"] == (5120, 4096)
    assert shapes["layers.0.self_attn.k_norm.weight"] == (128,)
    assert shapes["layers.2.mlp.down_proj.weight"] == (5120, 17408)
    assert len(shapes) == 2 + 11 * 5 + 1 and "embed_tokens.weight" not in shapes and "lm_head.weight" not in shapes
    assert round(2 * cfg.num_parameters() / 2**30, 2) == 3.22  # the published model.safetensors: 3.22 GiB
    assert cfg.draft_horizon == 15 and not cfg.layer_is_causal(0)
    assert build_target_layer_ids(64, 5) == cfg.target_layer_ids
    cfg.check_target(ModelConfig.preset("qwen3.5-27b"))
    PRESETS["dflash-tiny"].check_target(ModelConfig.preset("tiny"))


def test_config_read_where_z_lab_reads_it():
    cfg = dict(PUBLISHED_27B)
    del cfg["block_size"]
    cfg["dflash_config"] = {**cfg["dflash_config"], "block_size": 10}  # newer drafts: inside dflash_config
    assert DFlashConfig.from_hf_config(cfg).block_size == 10
    del cfg["dflash_config"]["block_size"]
    assert DFlashConfig.from_hf_config(cfg).block_size == 16  # z-lab's default
    del cfg["dflash_config"]["target_layer_ids"]  # derived from num_target_layers (ddtree model/utils.py)
    assert DFlashConfig.from_hf_config(cfg).target_layer_ids == (1, 16, 31, 46, 61)
    cfg["layer_types"] = ["sliding_attention"] * 4 + ["full_attention"]
    cfg["sliding_window"] = 2048
    sliding = DFlashConfig.from_hf_config(cfg)
    assert sliding.layer_window(0) == 2048 and sliding.layer_is_causal(0)
    assert sliding.layer_window(4) is None and not sliding.layer_is_causal(4)
    assert DFlashConfig.from_hf_config({**cfg, "is_causal": False}).layer_is_causal(0) is False


@st.composite
def draft_configs(draw):
    kv = draw(st.integers(1, 4))
    layers = draw(st.integers(1, 4))
    n_target = draw(st.integers(layers, 40))
    taps = draw(st.lists(st.integers(0, n_target - 1), min_size=1, max_size=6, unique=True))
    types = draw(st.lists(st.sampled_from(["full_attention", "sliding_attention"]), min_size=layers,
                          max_size=layers))
    vocab = draw(st.integers(2, 4096))
    return DFlashConfig(
        hidden_size=draw(st.integers(1, 64)) * 8, num_layers=layers, intermediate_size=draw(st.integers(1, 512)),
        vocab_size=vocab, num_attention_heads=kv * draw(st.integers(1, 4)), num_kv_heads=kv,
        head_dim=2 * draw(st.integers(1, 64)), rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5])),
        rope_theta=draw(st.sampled_from([1e4, 1e6, 1e7])), block_size=draw(st.integers(2, 32)),
        mask_token_id=draw(st.integers(0, vocab - 1)), target_layer_ids=tuple(taps),
        num_target_layers=draw(st.sampled_from([None, n_target])), layer_types=tuple(types),
        sliding_window=draw(st.integers(1, 4096)) if "sliding_attention" in types else None,
        is_causal=draw(st.sampled_from([None, True, False])),
        output_multiplier=draw(st.sampled_from([1.0, 0.5])),
        final_logit_softcapping=draw(st.sampled_from([None, 20.0])), name="custom")


@settings(max_examples=100, deadline=None)
@given(draft_configs())
def test_config_round_trips_through_config_json(cfg):
    text = json.dumps(cfg.to_hf_config())
    assert DFlashConfig.from_hf_config(json.loads(text)) == cfg
    shapes = cfg.tensor_shapes()
    assert shapes["fc.weight"] == (cfg.hidden_size, len(cfg.target_layer_ids) * cfg.hidden_size)
    assert cfg.num_parameters() == sum(int(np.prod(s)) for s in shapes.values())


@pytest.mark.parametrize("change, match", [
    ({"architectures": ["DFlash2DraftModel"]}, "architectures: .*DFlash2DraftModel drafts are not supported"),
    ({"model_type": "qwen3_5_text"}, "model_type"),
    ({"dflash_config": {"target_layer_ids": [1, 2]}}, "mask_token_id: missing"),
    ({"dflash_config": {"mask_token_id": 248320, "target_layer_ids": [1]}}, "mask_token_id: 248320 is not a token"),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 1]}}, "target_layer_ids: repeats a layer"),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": [1, 64]}},
     r"target_layer_ids\[1\]: layer 64 does not exist in a 64-layer target"),
    ({"dflash_config": {"mask_token_id": 5, "target_layer_ids": "1,2"}}, "target_layer_ids: expected a list"),
    ({"dflash_config": {"mask_token_id": 5}, "num_target_layers": None}, "target_layer_ids: missing"),
    ({"num_key_value_heads": 5}, "num_key_value_heads: 5 does not divide 32"),
    ({"hidden_size": "5120"}, "hidden_size: expected an integer"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4}}, "rope_type: 'yarn' is not supported"),
    ({"block_size": 1}, "block_size: must be at least 2"),
    ({"layer_types": ["sliding_attention"] * 5, "sliding_window": None}, "sliding_window"),
    ({"layer_types": ["full_attention"] * 4}, "layer_types: has 4 entries for 5 layers"),
    ({"layer_types": ["linear_attention"] * 5}, r"layer_types\[0\]: unknown layer type"),
])
def test_bad_configs_are_one_clear_error(change, match):
    cfg = {**PUBLISHED_27B, **change}
    with pytest.raises(CheckpointError, match=match) as info:
        DFlashConfig.from_hf_config(cfg, source="draft/config.json")
    assert str(info.value).startswith("draft/config.json: ")


def test_check_target_mismatches():
    draft = DFlashConfig.preset("dflash-qwen3.5-27b")
    with pytest.raises(CheckpointError, match="hidden_size 5120 does not match the target's 128"):
        draft.check_target(ModelConfig.preset("tiny"))
    other = dataclasses.replace(ModelConfig.preset("qwen3.5-27b"), vocab_size=1000)
    with pytest.raises(CheckpointError, match="vocab_size"):
        draft.check_target(other)
    loose = dataclasses.replace(draft, num_target_layers=None)
    shallow = dataclasses.replace(ModelConfig.preset("qwen3.5-27b"), num_layers=48, layer_types=("linear_attention",
                                  "linear_attention", "linear_attention", "full_attention") * 12)
    with pytest.raises(CheckpointError, match="layer 61 does not exist in the 48-layer target"):
        loose.check_target(shallow)


# ------------------------------------------------------------------------------------------------ weights
def test_write_and_load_tiny_draft(tmp_path):
    cfg = PRESETS["dflash-tiny"]
    write_dflash_checkpoint(cfg, tmp_path / "d", seed=5, progress=False)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["config.json", "model.safetensors"]
    ck = load_checkpoint(tmp_path / "d")
    assert ck.config == dataclasses.replace(cfg, name="custom")
    assert ck.names() == list(cfg.tensor_shapes())
    for name, shape in cfg.tensor_shapes().items():
        assert ck.shape(name) == shape and ck.dtype(name) == "BF16"
        np.testing.assert_array_equal(ck.bf16(name), init_tensor(cfg, name, 5))
    fc = ck.f32("fc.weight")
    assert abs(fc.std() - 0.02) < 0.002 and abs(fc.mean()) < 0.002
    norm = ck.f32("layers.1.self_attn.k_norm.weight")
    assert abs(norm.mean() - 1.0) < 0.05 and 0.02 < norm.std() < 0.1  # ones-centred, not all ones
    # another seed, other weights; the file path loads too
    write_dflash_checkpoint(cfg, tmp_path / "e", seed=6, progress=False)
    other = load_checkpoint(tmp_path / "e" / "model.safetensors")
    assert not np.array_equal(other.bf16("fc.weight"), ck.bf16("fc.weight"))


def test_init_weights_cli_writes_draft(tmp_path, capsys):
    assert main(["init-weights", "--preset", "dflash-tiny", "--out", str(tmp_path / "draft"), "--seed", "1"]) == 0
    captured = capsys.readouterr()
    assert "wrote" in captured.err and captured.out.strip() == str(tmp_path / "draft")
    ck = load_checkpoint(tmp_path / "draft")
    assert isinstance(ck.config, DFlashConfig) and ck.config.mask_token_id == 511
    ck.config.check_target(ModelConfig.preset("tiny"))
    assert main(["init-weights", "--preset", "dflash-tiny", "--format", "safetensors", "--quant", "q8_0", "--out",
                 str(tmp_path / "g")]) == 2
    assert capsys.readouterr().err.startswith("lucegen: error: --quant q8_0: safetensors drafts are written in "
                                              "BF16 only")
    assert main(["init-weights", "--preset", "tiny", "--out", str(tmp_path / "t")]) == 2
    assert "--format: required for model preset tiny" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["init-weights", "--preset", "dflash-tiny", "--out", str(tmp_path / "file"), "--quiet"]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert not (tmp_path / "g").exists() and not list(tmp_path.rglob(".*.tmp"))


def _write_draft(directory, cfg, shapes):
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(cfg.to_hf_config()))
    write_safetensors(directory / "model.safetensors", [(n, "BF16", s) for n, s in shapes.items()],
                      lambda n: np.zeros(shapes[n], np.uint16))


def test_loading_a_damaged_draft_names_the_tensor(tmp_path):
    cfg = PRESETS["dflash-tiny"]
    good = cfg.tensor_shapes()
    wrong = dict(good, **{"fc.weight": (128, 128)})
    _write_draft(tmp_path / "shape", cfg, wrong)
    with pytest.raises(CheckpointError, match=r"tensor 'fc.weight': shape \[128, 128\], config.json implies "
                                              r"\[128, 256\]"):
        load_checkpoint(tmp_path / "shape")
    _write_draft(tmp_path / "missing", cfg, {n: s for n, s in good.items() if n != "norm.weight"})
    with pytest.raises(CheckpointError, match="missing draft tensor 'norm.weight'"):
        load_checkpoint(tmp_path / "missing")
    _write_draft(tmp_path / "extra", cfg, dict(good, **{"layers.2.input_layernorm.weight": (128,)}))
    with pytest.raises(CheckpointError, match="unexpected tensor 'layers.2.input_layernorm.weight' for a 2-layer"):
        load_checkpoint(tmp_path / "extra")
    _write_draft(tmp_path / "prefixed", cfg, {"model." + n: s for n, s in good.items()})
    assert load_checkpoint(tmp_path / "prefixed").shape("fc.weight") == (128, 256)
    # an index that lists a tensor its shard lacks (drafts share the target's shard and index checks)
    _write_draft(tmp_path / "indexed", cfg, good)
    index = {"weight_map": dict({n: "model.safetensors" for n in good}, **{"extra.weight": "model.safetensors"})}
    (tmp_path / "indexed" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="tensor 'extra.weight' listed in model.safetensors.index.json is missing"):
        load_checkpoint(tmp_path / "indexed")

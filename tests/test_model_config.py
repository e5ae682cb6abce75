from __future__ import annotations

import json

import pytest

from lucegen.errors import CheckpointError
from lucegen.model.config import FULL, LINEAR, PRESETS, ModelConfig


def test_08b_preset_shapes_and_parameter_count():
    c = ModelConfig.preset("qwen3.5-0.8b")
    assert (c.hidden_size, c.num_layers, c.intermediate_size, c.vocab_size) == (1024, 24, 3584, 248320)
    assert (c.num_attention_heads, c.num_kv_heads, c.head_dim, c.rotary_dim) == (8, 2, 256, 64)
    assert (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim) == \
        (16, 16, 128, 128)
    assert c.full_attention_layers == tuple(range(3, 24, 4))
    assert c.tie_word_embeddings and c.rope_theta == 1e7 and c.partial_rotary_factor == 0.25
    assert abs(c.num_parameters() - 752e6) < 1e6  # "about 752 M parameters"


def test_27b_preset():
    c = ModelConfig.preset("qwen3.5-27b")
    assert (c.hidden_size, c.num_layers, c.intermediate_size) == (5120, 64, 17408)
    assert (c.num_attention_heads, c.num_kv_heads) == (24, 4)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (16, 48)
    assert not c.tie_word_embeddings
    assert 26e9 < c.num_parameters() < 28e9


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_keep_the_3_to_1_pattern_and_round_trip_through_hf_config(name):
    c = ModelConfig.preset(name)
    assert all(t == (FULL if i % 4 == 3 else LINEAR) for i, t in enumerate(c.layer_types))
    assert ModelConfig.from_hf_config(c.to_hf_config()).to_hf_config() == c.to_hf_config()


def test_multimodal_wrapper_is_read_through_text_config():
    text = ModelConfig.preset("tiny").to_hf_config()
    wrapper = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
               "text_config": {k: v for k, v in text.items() if k != "tie_word_embeddings"},
               "vision_config": {"depth": 2}, "tie_word_embeddings": True}
    c = ModelConfig.from_hf_config(wrapper)
    assert c.tie_word_embeddings and c.layer_types == ModelConfig.preset("tiny").layer_types


def test_layer_types_default_from_full_attention_interval():
    cfg = ModelConfig.preset("tiny").to_hf_config()
    del cfg["layer_types"]
    cfg["full_attention_interval"] = 2
    assert ModelConfig.from_hf_config(cfg).full_attention_layers == (1, 3)


def test_unknown_layer_type_names_file_and_key(tmp_path):
    cfg = ModelConfig.preset("tiny").to_hf_config()
    cfg["layer_types"][2] = "sliding_attention"
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3_5", "text_config": cfg}))
    with pytest.raises(CheckpointError, match=r"config\.json: text_config\.layer_types\[2\]: unknown layer type"):
        ModelConfig.from_file(path)


@pytest.mark.parametrize("mutate,match", [
    (lambda c: c.pop("hidden_size"), "hidden_size: missing"),
    (lambda c: c.update(model_type="llama"), "model_type: 'llama' is not a Qwen3.5 model"),
    (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
    (lambda c: c.update(vocab_size="many"), "vocab_size: expected an integer"),
    (lambda c: c.update(layer_types=["linear_attention"]), "layer_types: has 1 entries for 4 layers"),
    (lambda c: c["rope_parameters"].update(rope_type="yarn"), "rope_type: 'yarn' is not supported"),
])
def test_bad_config_values_give_one_clear_error(tmp_path, mutate, match):
    cfg = ModelConfig.preset("tiny").to_hf_config()
    mutate(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match) as info:
        ModelConfig.from_file(path)
    assert str(path) in str(info.value)


def test_unknown_preset_and_bad_json(tmp_path):
    with pytest.raises(CheckpointError, match="unknown model preset 'huge'"):
        ModelConfig.preset("huge")
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        ModelConfig.from_file(path)


def test_transformers_reads_our_config_identically():
    transformers = pytest.importorskip("transformers")
    for name in PRESETS:
        ours = ModelConfig.preset(name).to_hf_config()
        theirs = transformers.Qwen3_5TextConfig(**{k: v for k, v in ours.items() if k != "architectures"})
        assert theirs.layer_types == ours["layer_types"]
        assert theirs.linear_num_value_heads == ours["linear_num_value_heads"]
        assert theirs.rope_parameters["partial_rotary_factor"] == 0.25
        assert theirs.rope_parameters["rope_theta"] == ours["rope_parameters"]["rope_theta"]

"""DFlash drafts as GGUF (lucegen/model/dflash_gguf.py): the same draft as the safetensors writer's for a seed (BF16
bit for bit, Q8_0 as quant.py quantises those values), its config read back, the DraftReference's output unchanged,
`lucegen init-weights` writing one, and one clear error for each kind of bad file."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lucegen.cli import main
from lucegen.errors import CheckpointError
from lucegen.model import quant
from lucegen.model.checkpoint import load_dflash
from lucegen.model.dflash import DFlashConfig
from lucegen.model.dflash_gguf import ARCH, draft_gguf_name
from lucegen.model.dtypes import bf16_bits_to_f32
from lucegen.model.init_dflash import write_dflash_checkpoint, write_dflash_gguf


def same_config(a: DFlashConfig, b: DFlashConfig) -> bool:
    return dataclasses.replace(a, name="x") == dataclasses.replace(b, name="x")


@pytest.fixture(scope="module", params=["dflash-tiny", "dflash-tiny-q"])
def drafts(request, tmp_path_factory):
    config = DFlashConfig.preset(request.param)
    root = tmp_path_factory.mktemp(request.param)
    write_dflash_checkpoint(config, root / "st", seed=3, progress=False)
    write_dflash_gguf(config, root / "bf16.gguf", "bf16", seed=3, progress=False)
    write_dflash_gguf(config, root / "q8.gguf", "q8_0", seed=3, progress=False)
    return config, root


def test_bf16_gguf_is_the_safetensors_draft(drafts):
    config, root = drafts
    st, gg = load_dflash(root / "st"), load_dflash(root / "bf16.gguf")
    assert same_config(st.config, gg.config) and same_config(gg.config, config)
    assert gg.config.name == config.name
    for name in st.names():
        np.testing.assert_array_equal(gg.bf16(name), st.bf16(name), err_msg=name)
        assert gg.dtype(name) == ("F32" if name.endswith("norm.weight") else "BF16")


def test_q8_0_gguf_holds_the_quantised_matrices(drafts):
    config, root = drafts
    st, q8 = load_dflash(root / "st"), load_dflash(root / "q8.gguf")
    assert same_config(st.config, q8.config)
    for name, shape in config.tensor_shapes().items():
        if len(shape) == 1:
            np.testing.assert_array_equal(q8.f32(name), st.f32(name), err_msg=name)
            continue
        tensor, raw = q8.gguf_tensor(name)
        assert tensor.type_name == "Q8_0" and tensor.shape == shape
        np.testing.assert_array_equal(raw, quant.quantize(bf16_bits_to_f32(st.bf16(name)), "Q8_0"), err_msg=name)
        assert np.abs(q8.f32(name) - st.f32(name)).max() <= np.abs(st.f32(name)).max() / 127 + 1e-6


def test_the_reference_drafts_the_same_block_from_either_file(drafts):
    """DraftReference over the BF16 GGUF: the safetensors draft's logits exactly; over the Q8_0 GGUF: close."""
    from lucegen.model.dflash_reference import DraftReference

    config, root = drafts
    rng = np.random.default_rng(0)
    embed = (rng.standard_normal((config.vocab_size, config.hidden_size)) * 0.5).astype(np.float32)
    features = rng.standard_normal((6, config.fc_in_features)).astype(np.float32)
    logits = []
    for path in ("st", "bf16.gguf", "q8.gguf"):
        ck = load_dflash(root / path)
        ref = DraftReference(ck.config, ck, embed, embed)
        ctx = ref.new_context()
        ref.add_context(ctx, features, np.arange(6))
        logits.append(ref.block_logits(ctx, root=7, start=6))
    np.testing.assert_array_equal(logits[1], logits[0])
    assert 0 < np.abs(logits[2] - logits[0]).max() < 0.05 * np.abs(logits[0]).max()


def test_init_weights_writes_a_gguf_draft(tmp_path, capsys):
    out = tmp_path / "d.gguf"
    assert main(["init-weights", "--preset", "dflash-tiny", "--format", "gguf", "--quant", "q8_0", "--out",
                 str(out), "--quiet"]) == 0
    assert load_dflash(out).dtype("layers.0.mlp.down_proj.weight") == "Q8_0"
    assert main(["init-weights", "--preset", "dflash-tiny", "--format", "gguf", "--quant", "q4_k_m", "--out",
                 str(tmp_path / "e.gguf"), "--quiet"]) == 2
    assert "bf16 or q8_0" in capsys.readouterr().err


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    config = DFlashConfig.preset("dflash-tiny")
    path = tmp_path_factory.mktemp("tiny-gguf") / "bf16.gguf"
    write_dflash_gguf(config, path, "bf16", seed=3, progress=False)
    return config, path


def rewrite(src, dst, *, drop_key=None, set_key=None, drop_tensor=None, rename=None):
    """A copy of GGUF ``src`` with one metadata key dropped or changed, or one tensor dropped or renamed."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    if set_key and set_key[0] == "general.architecture":
        arch = set_key[1]
    w = gguf.GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", drop_key):
            continue
        value = set_key[1] if set_key and key == set_key[0] else field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(key, value, vtype)
    for t in reader.tensors:
        if t.name == drop_tensor:
            continue
        name = rename[1] if rename and t.name == rename[0] else t.name
        w.add_tensor(name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.mark.parametrize("change, message", [
    (dict(set_key=("general.architecture", "qwen35")), "is not a DFlash draft"),
    (dict(drop_key=f"{ARCH}.dflash.mask_token_id"), "dflash.mask_token_id' is missing"),
    (dict(set_key=(f"{ARCH}.block_count", 1)), "unexpected tensor 'blk.1"),
    (dict(drop_tensor="blk.0.ffn_up.weight"), "missing draft tensor 'blk.0.ffn_up.weight'"),
    (dict(rename=("blk.0.ffn_norm.weight", "blk.0.post_attention_norm.weight")), None),
    (dict(set_key=(f"{ARCH}.embedding_length", 96)), "shape"),
])
def test_bad_draft_ggufs_are_refused_with_one_clear_error(tiny_gguf, tmp_path, change, message):
    config, good = tiny_gguf
    path = rewrite(good, tmp_path / "bad.gguf", **change)
    if message is None:  # lucebox-hub's other spelling of the post-attention norm loads
        assert load_dflash(path).f32("layers.0.post_attention_layernorm.weight").shape == (config.hidden_size,)
        return
    with pytest.raises(CheckpointError, match=message):
        load_dflash(path)


def test_vocab_size_comes_from_the_target_when_the_file_lacks_it(tiny_gguf, tmp_path):
    config, good = tiny_gguf
    path = rewrite(good, tmp_path / "novocab.gguf", drop_key=f"{ARCH}.vocab_size")
    with pytest.raises(CheckpointError, match="beside its target"):
        load_dflash(path)
    assert load_dflash(path, vocab_size=config.vocab_size).config.vocab_size == config.vocab_size


def test_gguf_names_are_lucebox_hubs():
    assert draft_gguf_name("fc.weight") == "dflash.fc.weight"
    assert draft_gguf_name("layers.2.self_attn.o_proj.weight") == "blk.2.attn_output.weight"
    assert draft_gguf_name("layers.0.post_attention_layernorm.weight") == "blk.0.ffn_norm.weight"
    with pytest.raises(KeyError):
        draft_gguf_name("layers.0.mlp.experts.weight")

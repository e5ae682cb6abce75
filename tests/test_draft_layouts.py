"""Every DFlash draft layout in use, each written here from a draft's tensors by gguf's GGUFWriter in that layout's
own keys and names, loaded beside a target: lucebox-hub's GGUF (dflash.n_target_layers = the tap count, taps
computed from the target as its gguf_target_loader.cpp does, the mask token from the target when absent, an older
file's fixed rope.freq_base warned about), llama.cpp's ``dflash`` arch (fc / enc.output_norm, dflash.target_layers
= HF ids + 1), a fork's extra token_embd / output tensors (ignored with a note), z-lab's HF configs with sliding
layers and use_sliding_window: false; and a target GGUF with MTP blocks (nextn_predict_layers) whose blocks are
skipped."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from lucegen.errors import CheckpointError
from lucegen.model.checkpoint import QWEN35_MASK_TOKEN_ID, load_dflash, target_facts
from lucegen.model.dflash import DFlashConfig
from lucegen.model.dflash_gguf import TargetFacts, lucebox_taps

gguf = pytest.importorskip("gguf")

ARCH = "qwen35-dflash-draft"


def test_lucebox_taps_are_its_loaders():
    """gguf_target_loader.cpp: step = (n_layer - 2) / (N - 1), ids[k] = 1 + k * step; its comment: 27B -> {1, 16,
    31, 46, 61}, 9B (32 layers) -> {1, 8, 15, 22, 29}."""
    assert lucebox_taps(64, 5) == (1, 16, 31, 46, 61)
    assert lucebox_taps(32, 5) == (1, 8, 15, 22, 29)
    assert lucebox_taps(8, 2) == (1, 7)


def copy_gguf(src, dst, arch: str, keys: dict, names: dict | None = None, extra: dict | None = None,
              drop_keys=()):
    """``src``'s tensors (renamed by ``names``, plus ``extra`` name -> float32 array) under ``arch`` with metadata
    ``keys`` (name -> value; ints as uint32, floats as float32, lists of ints as int32 arrays), keys of ``src`` kept
    unless dropped or replaced."""
    reader = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch)
    old_arch = reader.fields["general.architecture"].contents()
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        new_key = key
        if arch == "dflash" and key.startswith(f"{old_arch}.dflash."):  # llama.cpp's dflash.<key>, not dflash.dflash.
            new_key = key.replace(f"{old_arch}.dflash.", "dflash.", 1)
        elif key.startswith(f"{old_arch}."):
            new_key = key.replace(f"{old_arch}.", f"{arch}.", 1)
        if new_key in keys or key in drop_keys:
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(new_key, field.contents(), vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(new_key, field.contents(), vtype)
    for key, value in keys.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_array(key, [int(v) for v in value])
    for t in reader.tensors:
        name = (names or {}).get(t.name, t.name)
        w.add_tensor(name, np.asarray(t.data), raw_shape=np.asarray(t.data).shape, raw_dtype=t.tensor_type)
    for name, array in (extra or {}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny-q target GGUF and its draft (taps 1 and 7: lucebox's for 8 layers and 2 taps) as lucegen's GGUF."""
    from lucegen.model.config import ModelConfig
    from lucegen.model.init_dflash import write_dflash_gguf
    from lucegen.model.init_gguf import write_gguf_checkpoint

    root = tmp_path_factory.mktemp("layouts")
    target = ModelConfig.preset("tiny-q")
    write_gguf_checkpoint(target, root / "target.gguf", quant="q4_k_m", seed=0, progress=False)
    draft = dataclasses.replace(DFlashConfig.preset("dflash-tiny-q"), target_layer_ids=lucebox_taps(8, 2),
                                num_target_layers=None)
    write_dflash_gguf(draft, root / "draft.gguf", "q8_0", seed=2, progress=False)
    return SimpleNamespace(root=root, target=target, draft=draft)


def facts(files, mask=511):
    return TargetFacts(files.target.num_layers, files.target.vocab_size, files.target.rope_theta, mask)


def same_tensors(a, b):
    assert a.names() == b.names()
    for name in a.names():
        np.testing.assert_array_equal(a.f32(name), b.f32(name), err_msg=name)


def test_lucebox_gguf_takes_taps_mask_and_rope_check_from_the_target(files, caplog):
    """n_target_layers = 2 taps and no ids, no vocab_size, no mask token, rope.freq_base 1e6 (an older converter's
    fixed value) beside a target of 1e7: taps (1, 7) computed from the 8-layer target, the target's mask token, one
    warning naming both RoPE bases."""
    src = files.root / "draft.gguf"
    path = copy_gguf(src, files.root / "lucebox.gguf", ARCH,
                     {f"{ARCH}.dflash.n_target_layers": 2, f"{ARCH}.rope.freq_base": 1e6},
                     drop_keys=(f"{ARCH}.dflash.target_layer_ids", f"{ARCH}.vocab_size",
                                f"{ARCH}.dflash.mask_token_id"))
    with pytest.raises(CheckpointError, match="taps are computed from the target's depth"):
        load_dflash(path)
    with pytest.raises(CheckpointError, match="mask_token_id' is missing and the target names no mask token"):
        load_dflash(path, target=facts(files, mask=None))
    with caplog.at_level(logging.WARNING):
        ck = load_dflash(path, target=facts(files))
    assert ck.config.target_layer_ids == (1, 7) and ck.config.mask_token_id == 511
    assert ck.config.vocab_size == files.target.vocab_size and ck.config.rope_theta == 1e6
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1e+06" in warnings[0] and "1e+07" in warnings[0], warnings
    same_tensors(ck, load_dflash(src))


def test_target_mask_token(files):
    """A target GGUF's tokenizer.ggml.mask_token_id, else the Qwen3.5 vocabulary's 248070 (lucebox-hub dflash27b.h
    DFLASH27B_DRAFT_MASK_TOKEN_ID), else none."""
    from lucegen.model.gguf_io import load_gguf

    tiny = load_gguf(files.root / "target.gguf")
    assert target_facts(tiny).mask_token_id is None and target_facts(tiny).num_layers == 8
    qwen = SimpleNamespace(config=dataclasses.replace(files.target, vocab_size=248320), file=None)
    assert target_facts(qwen).mask_token_id == QWEN35_MASK_TOKEN_ID == 248070
    path = copy_gguf(files.root / "target.gguf", files.root / "target-mask.gguf", "qwen35",
                     {"tokenizer.ggml.mask_token_id": 500})
    assert target_facts(load_gguf(path)).mask_token_id == 500


def test_llama_cpp_dflash_arch(files):
    """llama.cpp's dflash arch: fc.weight, enc.output_norm.weight, keys dflash.block_size / mask_token_id /
    target_layers (HF ids + 1), the other keys under dflash.; the same draft as lucegen's layout."""
    src = files.root / "draft.gguf"
    keys = {"dflash.target_layers": [i + 1 for i in files.draft.target_layer_ids]}
    path = copy_gguf(src, files.root / "llama.gguf", "dflash", keys,
                     names={"dflash.fc.weight": "fc.weight", "dflash.hidden_norm.weight": "enc.output_norm.weight"},
                     drop_keys=(f"{ARCH}.dflash.target_layer_ids",))
    reader = gguf.GGUFReader(path)
    assert "dflash.block_size" in reader.fields and "dflash.dflash.block_size" not in reader.fields
    ck = load_dflash(path)
    assert ck.config.target_layer_ids == files.draft.target_layer_ids
    assert ck.config.mask_token_id == files.draft.mask_token_id
    same_tensors(ck, load_dflash(src))


def test_fork_layout_extra_tensors_are_ignored_with_a_note(files, caplog):
    src = files.root / "draft.gguf"
    h, v = files.draft.hidden_size, files.draft.vocab_size
    extra = {"token_embd.weight": np.zeros((v, h), np.float32), "output.weight": np.zeros((v, h), np.float32)}
    path = copy_gguf(src, files.root / "fork.gguf", ARCH, {}, extra=extra)
    with caplog.at_level(logging.WARNING):
        ck = load_dflash(path)
    notes = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(notes) == 1 and "output.weight, token_embd.weight" in notes[0] and "target's" in notes[0]
    same_tensors(ck, load_dflash(src))


def test_a_draft_that_does_not_fit_its_target_is_one_line(files):
    from lucegen.runtime.draft import check_pair

    ck = load_dflash(files.root / "draft.gguf")
    wide = dataclasses.replace(files.target, hidden_size=512)
    with pytest.raises(CheckpointError, match=r"hidden_size 256 does not match the target's 512") as info:
        check_pair(ck.config, wide, ck.path)
    assert "\n" not in str(info.value)
    shallow = dataclasses.replace(files.target, num_layers=4, layer_types=files.target.layer_types[:4])
    with pytest.raises(CheckpointError, match=r"layer 7 does not exist in the 4-layer target") as info:
        check_pair(ck.config, shallow, ck.path)
    assert "\n" not in str(info.value)


def test_lucebox_draft_runs_beside_a_quantised_target(files, require_compiler):
    """The Lucebox-layout draft through DFlashDrafter on HostDevice beside tiny-q's QuantDecoder: taps from the
    target, every launch checked, everything freed."""
    from lucegen.runtime.dflash import SpecDecoder
    from lucegen.runtime.draft import DFlashDrafter
    from lucegen.runtime.host_device import HostDevice
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier
    from lucegen.target import load_target

    path = files.root / "lucebox-run.gguf"
    copy_gguf(files.root / "draft.gguf", path, ARCH, {f"{ARCH}.dflash.n_target_layers": 2},
              drop_keys=(f"{ARCH}.dflash.target_layer_ids", f"{ARCH}.vocab_size"))
    target = load_target("sm_90")
    require_compiler(target)
    dev = HostDevice(target)

    def reply(buffer, dtype, shape):
        if np.dtype(dtype) == np.uint64:
            return np.full(shape, 0xFFFFFFFA, np.uint64)
        if np.dtype(dtype) == np.int32 and len(shape) == 2:
            return np.tile(np.arange(shape[1], dtype=np.int32), (shape[0], 1))
        return np.zeros(shape, dtype)

    dev.reply = reply
    dec = QuantDecoder(files.root / "target.gguf", device=dev, max_context=256)
    draft = DFlashDrafter(dec, path, k=4, ring=48, rows=64)
    assert draft.taps == {1: 0, 7: 1}
    pre = Prefiller(dec, draft=draft)
    ver = TreeVerifier(dec, budget=8, draft=draft)
    pre.prefill(np.arange(50, dtype=np.int32) % dec.config.vocab_size)
    SpecDecoder(ver, draft).generate(6)
    for part in (ver, pre, draft, dec):
        part.close()
    assert dev.allocated == 0


# ------------------------------------------------------------------------------------------------ z-lab HF drafts
Z_LAB_36 = {  # the keys of a z-lab Qwen3.x DFlash config.json, with sliding layers and use_sliding_window: false
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 5, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000}, "num_target_layers": 64,
    "vocab_size": 248320, "tie_word_embeddings": False, "attention_bias": False, "max_position_embeddings": 262144,
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "use_sliding_window": False,
    "sliding_window": 2048, "max_window_layers": 5, "dtype": "bfloat16",
}


def test_use_sliding_window_false_behaves_as_hf():
    """HF's Qwen3Config drops sliding_window when use_sliding_window is false; z-lab's Qwen3DFlashAttention then runs
    a sliding_attention layer causal (is_causal None) with no window, a full_attention layer non-causal."""
    c = DFlashConfig.from_hf_config(Z_LAB_36)
    assert c.sliding_window is None and c.unwindowed_sliding
    assert c.layer_is_causal(0) and c.layer_window(0) is None
    assert not c.layer_is_causal(4) and c.layer_window(4) is None
    pytest.importorskip("transformers")
    from transformers import Qwen3Config

    hf = Qwen3Config(**{k: v for k, v in Z_LAB_36.items() if k not in ("architectures", "dflash_config", "dtype",
                                                                        "block_size", "num_target_layers")})
    assert hf.sliding_window is None and hf.layer_types[0] == "sliding_attention"
    windowed = DFlashConfig.from_hf_config({**Z_LAB_36, "use_sliding_window": True})
    assert windowed.layer_window(0) == 2048 and windowed.layer_is_causal(0)
    assert DFlashConfig.from_hf_config(c.to_hf_config()) == c


def test_unwindowed_sliding_draft_in_the_reference():
    """A use_sliding_window: false draft's sliding layer attends causally over the whole context and block, as a
    windowed one with a window longer than both."""
    from lucegen.model.dflash_reference import DraftReference
    from lucegen.model.init_weights import init_tensor_f32

    base = DFlashConfig.preset("dflash-tiny")
    free = dataclasses.replace(base, layer_types=("sliding_attention", "full_attention"), sliding_window=None,
                               unwindowed_sliding=True)
    wide = dataclasses.replace(free, sliding_window=10_000, unwindowed_sliding=False)
    weights = {n: init_tensor_f32(free, n, 1) for n in free.tensor_shapes()}
    rng = np.random.default_rng(0)
    embed = (rng.standard_normal((free.vocab_size, free.hidden_size)) * 0.5).astype(np.float32)
    features = rng.standard_normal((9, free.fc_in_features)).astype(np.float32)
    out = []
    for cfg in (free, wide):
        ref = DraftReference(cfg, weights, embed, embed)
        ctx = ref.new_context()
        ref.add_context(ctx, features, np.arange(9))
        out.append(ref.block_logits(ctx, root=3, start=9))
    np.testing.assert_array_equal(out[0], out[1])


# ------------------------------------------------------------------------------------------------ MTP in a target
def test_mtp_blocks_in_a_target_gguf_are_skipped(files):
    """A target GGUF with nextn_predict_layers = 1 and that block's tensors after the text layers: block_count counts
    it, the loader skips it, the values are the file without it."""
    from lucegen.model.gguf_io import load_gguf

    n = files.target.num_layers
    h = files.target.hidden_size
    extra = {f"blk.{n}.nextn.eh_proj.weight": np.zeros((h, 2 * h), np.float32),
             f"blk.{n}.attn_norm.weight": np.ones(h, np.float32)}
    path = copy_gguf(files.root / "target.gguf", files.root / "mtp.gguf", "qwen35",
                     {"qwen35.block_count": n + 1, "qwen35.nextn_predict_layers": 1}, extra=extra)
    ck, plain = load_gguf(path), load_gguf(files.root / "target.gguf")
    assert ck.config.num_layers == n
    same_tensors(ck, plain)


def test_init_weights_writes_a_lucebox_layout_draft(tmp_path, capsys):
    """`init-weights --draft-layout lucebox`: the tap count alone; beside a 64-layer target the loader computes the
    27B draft's taps. A draft whose taps are not lucebox's for its target is refused."""
    from lucegen.cli import main
    from lucegen.model.dflash_gguf import GGUFFile

    out = tmp_path / "lucebox.gguf"
    assert main(["init-weights", "--preset", "dflash-tiny", "--format", "gguf", "--draft-layout", "lucebox",
                 "--out", str(out), "--quiet"]) == 2
    assert "are not the ones lucebox-hub computes" in capsys.readouterr().err
    from lucegen.model.init_dflash import write_dflash_gguf

    c = DFlashConfig.preset("dflash-qwen3.5-27b")
    small = dataclasses.replace(c, hidden_size=128, num_attention_heads=4, num_kv_heads=2, head_dim=32,
                                intermediate_size=256, vocab_size=512, mask_token_id=511)
    write_dflash_gguf(small, out, "q8_0", progress=False, layout="lucebox")
    meta = GGUFFile(out).metadata
    assert meta[f"{ARCH}.dflash.n_target_layers"] == 5 and f"{ARCH}.dflash.target_layer_ids" not in meta
    ck = load_dflash(out, target=TargetFacts(64, 512, 1e7, None))
    assert ck.config.target_layer_ids == (1, 16, 31, 46, 61)

"""The numpy DFlash draft reference (lucegen/model/dflash_reference.py) against a plain-Python statement of one block,
and its context bookkeeping; the packed layout of the device draft (lucegen/runtime/draft.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.model.dflash import PRESETS as DRAFT_PRESETS
from lucegen.model.config import ModelConfig
from lucegen.model.dflash import DFlashConfig
from lucegen.model.dflash_reference import DraftReference, log_softmax_topk, rms_norm
from lucegen.model.dtypes import bf16_bits_to_f32
from lucegen.model.init_dflash import init_tensor
from lucegen.runtime.draft import DraftLayout, draft_vectors

CFG = DFlashConfig.preset("dflash-tiny")


def weights(cfg: DFlashConfig, seed: int = 0) -> dict[str, np.ndarray]:
    return {n: bf16_bits_to_f32(init_tensor(cfg, n, seed)).reshape(s) for n, s in cfg.tensor_shapes().items()}


def draft(cfg=CFG, seed=0, **kw) -> DraftReference:
    rng = np.random.default_rng(seed)
    embed = rng.normal(0, 1, (cfg.vocab_size, cfg.hidden_size)).astype(np.float32)
    head = rng.normal(0, 0.05, (cfg.vocab_size, cfg.hidden_size)).astype(np.float32)
    return DraftReference(cfg, weights(cfg, seed), embed, head, **kw)


def features(cfg, n, seed=1):
    return np.random.default_rng(seed).normal(0, 1, (n, cfg.fc_in_features)).astype(np.float32)


def plain_block_logits(ref: DraftReference, feats, root: int, window=None) -> np.ndarray:
    """One block, written out position by position and head by head (no caches, no einsum)."""
    c, w = ref.config, ref.w
    n, B, hd = feats.shape[0], c.block_size, c.head_dim
    group = c.num_attention_heads // c.num_kv_heads

    def rope(vec, pos):
        half = hd // 2
        out = np.empty_like(vec)
        for d in range(hd):
            angle = np.float32(pos) * ref.inv_freq[d % half]
            partner = -vec[d + half] if d < half else vec[d - half]
            out[d] = vec[d] * math.cos(angle) + partner * math.sin(angle)
        return out

    eps = c.rms_norm_eps
    ctx = rms_norm(feats @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    tokens = [root] + [c.mask_token_id] * (B - 1)
    x = ref.embed[tokens].copy()
    for l in range(c.num_layers):
        p = f"layers.{l}."
        a = p + "self_attn."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        keys, values, key_pos = [], [], []
        for src, pos0 in ((ctx, 0), (h, n)):
            for i in range(src.shape[0]):
                k = (src[i] @ w[a + "k_proj.weight"].T).reshape(c.num_kv_heads, hd)
                v = (src[i] @ w[a + "v_proj.weight"].T).reshape(c.num_kv_heads, hd)
                keys.append([rope(rms_norm(k[g], w[a + "k_norm.weight"], eps), pos0 + i) for g in range(len(k))])
                values.append(v)
                key_pos.append(pos0 + i)
        out = np.zeros((B, c.q_dim), np.float32)
        for t in range(B):
            q = (h[t] @ w[a + "q_proj.weight"].T).reshape(c.num_attention_heads, hd)
            for head in range(c.num_attention_heads):
                qh = rope(rms_norm(q[head], w[a + "q_norm.weight"], eps), n + t)
                g = head // group
                js = [j for j in range(len(keys)) if window is None or key_pos[j] >= n - window or key_pos[j] >= n]
                s = np.array([qh @ keys[j][g] for j in js]) / math.sqrt(hd)
                pr = np.exp(s - s.max())
                pr /= pr.sum()
                out[t, head * hd : (head + 1) * hd] = sum(pr[i] * values[j][g] for i, j in enumerate(js))
        x = x + out @ w[a + "o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(x[1:], w["norm.weight"], eps) @ ref.lm_head.T


@settings(max_examples=4, deadline=None)
@given(n=st.integers(1, 12), root=st.integers(0, CFG.vocab_size - 1), window=st.sampled_from([None, 1, 5, 40]))
def test_block_matches_the_plain_statement(n, root, window):
    ref = draft(window=window)
    feats = features(CFG, n)
    ctx = ref.new_context()
    ref.add_context(ctx, feats, np.arange(n))
    got = ref.block_logits(ctx, root, n)
    want = plain_block_logits(ref, feats, root, window)
    assert got.shape == (CFG.block_size - 1, CFG.vocab_size)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_context_in_pieces_equals_context_at_once():
    ref, feats = draft(), features(CFG, 9)
    whole, parts = ref.new_context(), ref.new_context()
    ref.add_context(whole, feats, np.arange(9))
    for lo, hi in ((0, 4), (4, 5), (5, 9)):
        ref.add_context(parts, feats[lo:hi], np.arange(lo, hi))
    assert parts.length == 9
    np.testing.assert_allclose(ref.block_logits(parts, 3, 9), ref.block_logits(whole, 3, 9), rtol=1e-6, atol=1e-6)


def test_window_bounds_the_context():
    feats = features(CFG, 10)
    full, ringed = draft(), draft(window=4)
    a, b, c = full.new_context(), ringed.new_context(), full.new_context()
    full.add_context(a, feats, np.arange(10))
    ringed.add_context(b, feats, np.arange(10))
    full.add_context(c, feats[6:], np.arange(6, 10))  # only the last 4 positions
    assert np.allclose(ringed.block_logits(b, 5, 10), full.block_logits(c, 5, 10), atol=1e-5)
    assert not np.allclose(ringed.block_logits(b, 5, 10), full.block_logits(a, 5, 10), atol=1e-3)
    assert np.allclose(draft(window=10).block_logits(b, 5, 10), full.block_logits(a, 5, 10), atol=1e-6)


def test_causal_layers_hide_later_block_rows():
    causal = dataclasses.replace(CFG, is_causal=True)
    ref_c, ref_n = draft(causal), draft()
    feats = features(CFG, 3)
    outs = {}
    for name, ref in (("causal", ref_c), ("full", ref_n)):
        ctx = ref.new_context()
        ref.add_context(ctx, feats, np.arange(3))
        outs[name] = ref.block_logits(ctx, 7, 3)
    assert not np.allclose(outs["causal"], outs["full"], atol=1e-4)


def test_log_softmax_topk():
    logits = np.array([[1.0, 3.0, 3.0, -2.0, 0.5], [0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    lp, tok = log_softmax_topk(logits, 3)
    assert tok.tolist() == [[1, 2, 0], [0, 1, 2]], "ties go to the lower id"
    lse = np.log(np.exp(logits[0]).sum())
    np.testing.assert_allclose(lp[0], logits[0, [1, 2, 0]] - lse, rtol=1e-6)
    np.testing.assert_allclose(lp[1], np.log(0.2), rtol=1e-6)
    capped, _ = log_softmax_topk(logits * 100, 1, softcap=5.0)
    # 100, 300, 300, 50 all cap to ~+5 and -200 to -5: the best keeps a quarter of the mass
    np.testing.assert_allclose(capped[0, 0], -np.log(4 + np.exp(-10.0)), rtol=1e-4)


def test_draft_layout_packs_every_tensor_once():
    """Dense draft matrices (DenseDraftWeights, on lucegen/runtime/host_device.py's HostDevice: the uploads recorded) and the
    draft's vectors (draft_vectors): each inside its buffer, matrices 256-byte aligned, no two overlapping, every
    element once, the norms packed as w - 1."""
    from lucegen.families.prefill import prefill_params
    from lucegen.runtime.draft_weights import DenseDraftWeights
    from lucegen.runtime.host_device import HostDevice
    from lucegen.target import load_target

    cfg = CFG

    class Ckpt:
        config = cfg
        path = "tiny-draft"
        tensors = weights(cfg)

        def f32(self, name):
            return self.tensors[name]

        def bf16(self, name):
            from lucegen.model.dtypes import f32_to_bf16_bits
            return f32_to_bf16_bits(self.tensors[name]).reshape(self.tensors[name].shape)

    target = load_target("sm_90")
    dev = HostDevice(target)
    uploads = []
    upload = dev.upload
    dev.upload = lambda array, buffer=None: uploads.append((buffer.ptr, array.nbytes)) or upload(array, buffer)
    pf = prefill_params(ModelConfig.preset("tiny"), target)
    dense = DenseDraftWeights(dev, target, pf, Ckpt(), rows=64)
    wmat = np.zeros(dense.wmat.nbytes // 2, np.int32)
    for ptr, nbytes in uploads:
        offset = (ptr - dense.wmat.ptr) // 2
        assert offset % 128 == 0, "matrices start 256-byte aligned"
        wmat[offset : offset + nbytes // 2] += 1
    shapes = cfg.tensor_shapes()
    assert wmat.max() == 1 and wmat.sum() == sum(int(np.prod(s)) for s in shapes.values() if len(s) == 2)
    assert dense.weight_bytes == 2 * wmat.sum()

    lay = DraftLayout(cfg)
    wvec = np.zeros(lay.wvec_floats, np.int32)
    for offset, array in draft_vectors(lay, Ckpt()):
        wvec[offset : offset + array.size] += 1
    assert wvec.max() == 1 and wvec.sum() == sum(s[0] for s in shapes.values() if len(s) == 1) + cfg.head_dim // 2
    norms = dict(draft_vectors(lay, Ckpt()))
    np.testing.assert_array_equal(norms[lay.vec["hidden_norm"]] + 1, Ckpt.tensors["hidden_norm.weight"])


@pytest.mark.parametrize("change, match", [
    ({"rms_norm_eps": 1e-5}, "rms_norm_eps"),
    ({"input_embedding_scale": 2.0}, "input_embedding_scale"),
])
def test_pair_checks(change, match):
    from lucegen.errors import CheckpointError
    from lucegen.model.config import ModelConfig
    from lucegen.runtime.draft import check_pair

    with pytest.raises(CheckpointError, match=match):
        check_pair(dataclasses.replace(CFG, **change), ModelConfig.preset("tiny"), "draft/config.json")
    check_pair(CFG, ModelConfig.preset("tiny"), "draft/config.json")


#: The target preset each draft preset is made for (tests/gpu/test_dflash_draft.py runs these pairs).
TARGET_OF = {"dflash-tiny": "tiny", "dflash-tiny-q": "tiny-q", "dflash-qwen3.5-0.8b": "qwen3.5-0.8b",
             "dflash-qwen3.5-27b": "qwen3.5-27b"}


@pytest.mark.parametrize("name", list(DRAFT_PRESETS))
def test_every_draft_preset_pairs_with_its_target_alone(name):
    """check_pair accepts a draft preset with its target preset and refuses every other target preset (hidden size,
    vocabulary or layer count differ); its kernels compile on the chip the GPU tests run on."""
    from lucegen import codegen
    from lucegen.errors import CheckpointError
    from lucegen.model.config import PRESETS as TARGET_PRESETS
    from lucegen.model.config import ModelConfig
    from lucegen.runtime.draft import check_pair
    from lucegen.target import load_target

    cfg = DFlashConfig.preset(name)
    fits = []
    for target in TARGET_PRESETS:
        try:
            check_pair(cfg, ModelConfig.preset(target), name)
            fits.append(target)
        except CheckpointError:
            pass
    assert fits == [TARGET_OF[name]]
    chip = load_target("sm_90")
    module = codegen.build(chip, "dflash_draft", cfg)
    assert {"draft_capture", "draft_context_store", "draft_block_prepare", "draft_attention"} <= \
        {k.name for k in module.kernels}

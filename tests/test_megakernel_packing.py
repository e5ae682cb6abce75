"""CPU tests of the megakernel's host side: weight packing, layout, template parameters, shape checks, profile math.

The strongest one, ``test_packed_decode_matches_reference``, decodes tokens with numpy reading ONLY the packed
buffers the way the kernel indexes them (concatenated in-projections, interleaved gate/up, conv taps [C][K],
state transposed [NV][DV][DK], KV cache per attention slot) and compares with the Reference: a packing or indexing
mistake shows up here without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.errors import CheckpointError, TemplateError
from lucegen.families import megakernel
from lucegen.model.config import ModelConfig
from lucegen.model.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from lucegen.model.reference import Reference
from lucegen.runtime import packing
from lucegen.target import list_targets, load_target


class DictCheckpoint:
    """Random BF16-exact weights under internal names (what load_checkpoint returns, minus the file)."""

    def __init__(self, config: ModelConfig, seed: int):
        rng = np.random.default_rng(seed)
        self.config, self.path, self.t = config, "<dict>", {}
        for name, shape in config.tensor_shapes().items():
            if name.endswith("A_log"):
                a = np.log(rng.uniform(0.5, 4, shape))
            elif name.endswith("dt_bias"):
                a = rng.normal(1, 0.1, shape)
            elif "conv1d" in name:
                a = rng.uniform(-0.5, 0.5, shape)
            elif len(shape) == 1:
                a = rng.normal(0, 0.1, shape)
            else:
                a = rng.normal(0, 0.08, shape)
            self.t[name] = bf16_bits_to_f32(f32_to_bf16_bits(a.astype(np.float32)))

    def f32(self, name):
        return self.t[name]

    def bf16(self, name):
        return f32_to_bf16_bits(self.t[name])


def _rms1p(x, w, eps):
    return x / np.sqrt(np.mean(x * x) + np.float32(eps)) * (1 + w)


def _silu(x):
    return x / (1 + np.exp(-x))


def packed_decode(layout, wmat_bits, wvec, tokens):
    """Greedy-free teacher-forced decode of ``tokens`` from the packed buffers, one token at a time, mirroring
    templates/megakernel/*.cu.j2. Returns logits [T, V] and the final state."""
    c = layout.config
    wm = bf16_bits_to_f32(wmat_bits)
    H, I, V = c.hidden_size, c.intermediate_size, c.vocab_size
    NH, NKV, HD, RD = c.num_attention_heads, c.num_kv_heads, c.head_dim, c.rotary_dim
    NK, NV, DK, DV, CK = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                          c.linear_value_head_dim, c.conv_kernel)
    KD, VD, CONV = NK * DK, NV * DV, c.conv_dim
    eps = c.rms_norm_eps
    conv = np.zeros((layout.n_dn, CONV, CK - 1), np.float32)
    rec = np.zeros((layout.n_dn, NV, DV, DK), np.float32)
    kc = np.zeros((layout.n_at, 2, NKV, len(tokens), HD), np.float32)

    def mat(off, rows, cols):
        return wm[off : off + rows * cols].reshape(rows, cols)

    def vec(off, n):
        return wvec[off : off + n]

    inv_freq = vec(layout.inv_freq, RD // 2)
    out = []
    for pos, tok in enumerate(tokens):
        x = mat(layout.embed, V, H)[tok].copy()
        for lay in layout.layers:
            h = _rms1p(x, vec(lay.in_norm, H), eps)
            if lay.kind == 0:
                y = mat(lay.in_mat, megakernel.in_rows(c, 0), H) @ h
                win = conv[lay.slot]
                taps = vec(lay.conv_w, CONV * CK).reshape(CONV, CK)
                qkv = _silu((taps[:, : CK - 1] * win).sum(1) + taps[:, CK - 1] * y[:CONV])
                win[:, :-1], win[:, -1] = win[:, 1:].copy(), y[:CONV]
                z = y[CONV : CONV + VD]
                a, b = y[CONV + VD : CONV + VD + NV], y[CONV + VD + NV :]
                a_log, dt_bias = vec(lay.a_log, NV), vec(lay.dt_bias, NV)
                g = -np.exp(a_log) * np.where(a + dt_bias > 20, a + dt_bias, np.log1p(np.exp(a + dt_bias)))
                beta = 1 / (1 + np.exp(-b))
                o = np.zeros(VD, np.float32)
                for hh in range(NV):
                    hk = hh // (NV // NK)
                    q = qkv[hk * DK : (hk + 1) * DK]
                    k = qkv[KD + hk * DK : KD + (hk + 1) * DK]
                    q = q / np.sqrt((q * q).sum() + 1e-6) / np.sqrt(DK)
                    k = k / np.sqrt((k * k).sum() + 1e-6)
                    v = qkv[2 * KD + hh * DV : 2 * KD + (hh + 1) * DV]
                    S = rec[lay.slot, hh] * np.exp(g[hh])  # [DV, DK]
                    delta = (v - S @ k) * beta[hh]
                    S = S + delta[:, None] * k[None, :]
                    rec[lay.slot, hh] = S
                    o[hh * DV : (hh + 1) * DV] = S @ q
                oh = o.reshape(NV, DV)
                gn = oh / np.sqrt((oh * oh).mean(1, keepdims=True) + eps) * vec(lay.gnorm, DV) * _silu(z.reshape(NV, DV))
                x = x + mat(lay.out_mat, H, VD) @ gn.reshape(-1)
            else:
                y = mat(lay.in_mat, megakernel.in_rows(c, 1), H) @ h
                QP, KVD = 2 * NH * HD, NKV * HD
                ao = np.zeros(NH * HD, np.float32)
                ang = pos * inv_freq
                cs, sn = np.cos(np.concatenate([ang, ang])), np.sin(np.concatenate([ang, ang]))

                def rope(u):
                    r = u[:RD]
                    rh = np.concatenate([-r[RD // 2 :], r[: RD // 2]])
                    return np.concatenate([r * cs + rh * sn, u[RD:]])

                for gi in range(NKV):
                    k = _rms1p(y[QP + gi * HD : QP + (gi + 1) * HD], vec(lay.k_norm, HD), eps)
                    kc[lay.slot, 0, gi, pos] = rope(k)
                    kc[lay.slot, 1, gi, pos] = y[QP + KVD + gi * HD : QP + KVD + (gi + 1) * HD]
                for hh in range(NH):
                    gi = hh // (NH // NKV)
                    q = rope(_rms1p(y[hh * 2 * HD : hh * 2 * HD + HD], vec(lay.q_norm, HD), eps))
                    s = kc[lay.slot, 0, gi, : pos + 1] @ q * HD ** -0.5
                    p = np.exp(s - s.max())
                    att = (p / p.sum()) @ kc[lay.slot, 1, gi, : pos + 1]
                    gate = y[hh * 2 * HD + HD : (hh + 1) * 2 * HD]
                    ao[hh * HD : (hh + 1) * HD] = att / (1 + np.exp(-gate))
                x = x + mat(lay.out_mat, H, NH * HD) @ ao
            h = _rms1p(x, vec(lay.post_norm, H), eps)
            gu = mat(lay.gateup, 2 * I, H) @ h
            x = x + mat(lay.down, H, I) @ (_silu(gu[0::2]) * gu[1::2])
        out.append(mat(layout.lm_head, V, H) @ _rms1p(x, vec(layout.final_norm, H), eps))
    return np.array(out), conv, rec, kc


@pytest.mark.parametrize("preset", ["tiny", "tiny-gqa"])
def test_packed_decode_matches_reference(preset):
    config = ModelConfig.preset(preset)
    ckpt = DictCheckpoint(config, seed=5)
    layout = megakernel.plan_layout(config)
    wmat, wvec = packing.pack_host(layout, ckpt)
    tokens = np.random.default_rng(2).integers(0, config.vocab_size, 9)
    logits, conv, rec, kc = packed_decode(layout, wmat, wvec, tokens)
    ref = Reference(config, ckpt)
    state = ref.new_state(len(tokens))
    want = ref.forward(tokens, state)
    scale = np.abs(want).max()
    assert np.abs(logits - want).max() <= 1e-4 * scale
    for lay, st_ref in zip(layout.layers, state.layers):
        if lay.kind == 0:
            np.testing.assert_allclose(conv[lay.slot], st_ref.conv, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(rec[lay.slot].transpose(0, 2, 1), st_ref.recurrent, rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_allclose(kc[lay.slot, 0], st_ref.k, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(kc[lay.slot, 1], st_ref.v, rtol=1e-4, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(preset=st.sampled_from(["tiny", "tiny-gqa", "qwen3.5-0.8b", "qwen3.5-27b"]))
def test_layout_regions_are_aligned_and_disjoint(preset):
    c = ModelConfig.preset(preset)
    lay = megakernel.plan_layout(c)
    regions = []
    for i, l in enumerate(lay.layers):
        regions += [(l.in_mat, megakernel.in_rows(c, l.kind) * c.hidden_size), (l.out_mat, c.hidden_size * megakernel.out_cols(c, l.kind)),
                    (l.gateup, 2 * c.intermediate_size * c.hidden_size), (l.down, c.hidden_size * c.intermediate_size)]
    regions.append((lay.embed, c.vocab_size * c.hidden_size))
    if not c.tie_word_embeddings:
        regions.append((lay.lm_head, c.vocab_size * c.hidden_size))
    else:
        assert lay.lm_head == lay.embed
    regions.sort()
    for (a, n), (b, _) in zip(regions, regions[1:]):
        assert a + n <= b
    assert regions[-1][0] + regions[-1][1] <= lay.wmat_elems
    assert all(off % megakernel.MAT_ALIGN == 0 for off, _ in regions)
    assert len({l.slot for l in lay.layers if l.kind == 0}) == lay.n_dn


def test_pack_fills_every_matrix_in_the_kernel_order():
    c = ModelConfig.preset("tiny-gqa")
    ckpt = DictCheckpoint(c, seed=1)
    lay = megakernel.plan_layout(c)
    wmat, wvec = packing.pack_host(lay, ckpt)
    dn = c.linear_attention_layers[0]
    at = c.full_attention_layers[0]
    la, sa = f"layers.{dn}.linear_attn.", f"layers.{at}.self_attn."
    np.testing.assert_array_equal(packing.unpack_matrix(lay, wmat, dn, "in_mat"), np.concatenate(
        [ckpt.f32(la + n) for n in ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_a.weight", "in_proj_b.weight")]))
    np.testing.assert_array_equal(packing.unpack_matrix(lay, wmat, at, "in_mat"), np.concatenate(
        [ckpt.f32(sa + n) for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight")]))
    gu = packing.unpack_matrix(lay, wmat, at, "gateup")
    np.testing.assert_array_equal(gu[0::2], ckpt.f32(f"layers.{at}.mlp.gate_proj.weight"))
    np.testing.assert_array_equal(gu[1::2], ckpt.f32(f"layers.{at}.mlp.up_proj.weight"))
    np.testing.assert_array_equal(packing.unpack_matrix(lay, wmat, dn, "down"), ckpt.f32(f"layers.{dn}.mlp.down_proj.weight"))
    lm = bf16_bits_to_f32(wmat[lay.lm_head : lay.lm_head + c.vocab_size * c.hidden_size]).reshape(c.vocab_size, -1)
    np.testing.assert_array_equal(lm, ckpt.f32("lm_head.weight"))
    conv = wvec[lay.layers[dn].conv_w : lay.layers[dn].conv_w + c.conv_dim * c.conv_kernel]
    np.testing.assert_array_equal(conv, ckpt.f32(la + "conv1d.weight").reshape(-1))


def test_pack_refuses_a_wrongly_shaped_tensor():
    c = ModelConfig.preset("tiny")
    ckpt = DictCheckpoint(c, seed=1)
    ckpt.t["layers.0.mlp.down_proj.weight"] = ckpt.t["layers.0.mlp.down_proj.weight"][:, :-8]
    with pytest.raises(CheckpointError, match="down_proj.weight: shape"):
        packing.pack_host(megakernel.plan_layout(c), ckpt)


@pytest.mark.parametrize("target", list_targets())
def test_kernel_params_fit_every_target(target):
    t = load_target(target)
    for preset in ("tiny", "tiny-gqa", "qwen3.5-0.8b"):
        c = ModelConfig.preset(preset)
        p = megakernel.kernel_params(c, t)
        assert p["smem_floats"] * 4 <= t.smem_per_block
        for key, cols in (("segs_c_dn", c.linear_value_dim), ("segs_c_at", c.num_attention_heads * c.head_dim),
                          ("segs_e", c.intermediate_size)):
            assert cols % (8 * p[key]) == 0


def test_27b_shapes_are_refused_clearly():
    # the x vector of the 27B's down projection (17408 floats) does not fit one block's shared memory
    with pytest.raises(CheckpointError, match="shared memory .*does not fit sm_90's smem_per_block"):
        megakernel.kernel_params(ModelConfig.preset("qwen3.5-27b"), load_target("sm_90"))


def test_unsupported_shape_is_a_clear_error():
    import dataclasses

    bad = dataclasses.replace(ModelConfig.preset("tiny"), head_dim=48, rotary_dim=16)
    with pytest.raises(CheckpointError, match="head_dim must be a multiple of the warp size"):
        megakernel.kernel_params(bad, load_target("sm_90"))


@pytest.mark.parametrize("knob, value, rows", [("rows_a", 3, 3), ("pairs_d", 3, 6), ("rows_screen", 64, 64),
                                               ("rows_lm", 0, 0)])
def test_rows_a_warp_must_be_a_power_of_two(knob, value, rows):
    # the matvec's rows are summed over a warp by halving exchanges (warp_sum_rows)
    with pytest.raises(TemplateError, match=f"tuning {knob}={value}: {rows} rows a warp; .*power of two up to "
                                            "sm_90's warp size 32"):
        megakernel.kernel_params(ModelConfig.preset("tiny"), load_target("sm_90"), **{knob: value})
    megakernel.kernel_params(ModelConfig.preset("tiny"), load_target("sm_90"), rows_a=4, pairs_d=4, rows_screen=8)


def test_the_down_prefetch_needs_a_bulk_copy_engine():
    from lucegen import codegen

    cfg = ModelConfig.preset("tiny")
    for name, tma in (("sm_90", True), ("sm_86", False), ("gfx1100", False)):
        t = load_target(name)
        params = megakernel.kernel_params(cfg, t)
        assert params["prefetch_down"] is tma  # on by default exactly where the descriptor has features.tma
        assert ("mk_prefetch_l2(down.w" in codegen.render(t, "megakernel/decode.cu.j2", mk=params)) is tma
    off = megakernel.kernel_params(cfg, load_target("sm_90"), prefetch_down=False)
    assert "mk_prefetch_l2(down.w" not in codegen.render(load_target("sm_90"), "megakernel/decode.cu.j2", mk=off)
    with pytest.raises(TemplateError, match="prefetch_down=True: a bulk prefetch into the L2, which sm_86 lacks"):
        megakernel.kernel_params(cfg, load_target("sm_86"), prefetch_down=True)


def test_kernel_for_other_shapes_is_refused():
    from lucegen.runtime.megakernel import check_kernel_matches

    params = megakernel.kernel_params(ModelConfig.preset("qwen3.5-0.8b"), load_target("sm_90"))
    check_kernel_matches(params, ModelConfig.preset("qwen3.5-0.8b"))
    with pytest.raises(CheckpointError, match="cannot run.*H=1024 \\(model: 128\\)"):
        check_kernel_matches(params, ModelConfig.preset("tiny"))


def test_barrier_count():
    cfg = ModelConfig.preset("qwen3.5-0.8b")
    assert packing.barriers_per_step(cfg) == 1 and packing.phases_per_step(cfg) == 121


def test_profile_summary_splits_work_and_barrier_wait():
    from lucegen.bench.decode import profile_summary

    kinds = [0, 1]  # 2 layers -> 11 phases per step
    steps, phases = 3, 11
    stamps = np.zeros((steps, phases, 2), np.uint64)
    t = 0
    for s in range(steps):
        for p in range(phases):
            stamps[s, p, 0] = t
            stamps[s, p, 1] = t + 1000  # 1 µs of work
            t += 1500  # then 0.5 µs until the next phase starts
    out = profile_summary(stamps, kinds)
    assert out["mlp_gate_up"] == pytest.approx(2.0)  # two layers, 1 µs each
    assert out["lm_head"] == pytest.approx(1.0)
    assert out["barrier_wait"] == pytest.approx(phases * 0.5)


def test_critical_path_follows_the_last_block():
    from lucegen.bench.decode import critical_path

    kinds = [0, 1]
    steps, phases, blocks = 3, 11, 4
    stamps = np.zeros((steps, phases, blocks, 4), np.uint64)
    t = 0
    for s in range(steps):
        for p in range(phases):
            done = t + np.array([1000, 1000, 1000, 3000 if p == 4 else 1000])  # block 3 is 2 µs late in mlp_down
            stamps[s, p, :, 0] = t
            stamps[s, p, :, 3] = done
            t = int(done.max()) + 500
    out = critical_path(stamps, kinds)
    assert out["mlp_down"] == pytest.approx(3.5 + 1.5)  # layer 0: 0.5 + 3 µs (late); layer 1: 0.5 + 1 µs
    assert out["mlp_gate_up"] == pytest.approx(2 * 1.5)
    assert out["total"] == pytest.approx(phases * 1.5 + 2.0)
    assert out["skew"] == pytest.approx(2.0)
    assert list(out["slowest_blocks"])[0] == 0  # ties go to the lowest block; block 3 only in one phase in 11


def test_phase_breakdown_splits_wait_staging_and_rest():
    from lucegen.bench.decode import phase_breakdown

    kinds = [0, 1]
    steps, phases, blocks = 2, 11, 2
    stamps = np.zeros((steps, phases, blocks, 4), np.uint64)
    t = 1000
    for s in range(steps):
        for p in range(phases):
            stamps[s, p, :, 0] = t
            stamps[s, p, :, 1] = [t + 300, t + 500] if p != 1 else 0  # delta_rule: no barrier stamp
            stamps[s, p, :, 2] = t + 700 if p in (0, 2) else 0          # only two phases stage inputs
            stamps[s, p, :, 3] = t + 2000
            t += 3000
    out = phase_breakdown(stamps, kinds)
    assert out["dn_in_proj"] == [0.4, 0.3, 1.3]        # waits 0.3 / 0.5 µs, staged at 0.7, done at 2.0
    assert out["delta_rule"] == [0.0, 0.0, 2.0]
    assert out["mlp_gate_up"] == [0.8, 0.0, 3.2]       # two layers: 2 x (0.4, 0, 1.6)

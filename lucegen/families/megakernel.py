"""The decode megakernel (templates/megakernel/decode.cu.j2): its half of the template contract, where every weight
lives and the work split, rendered for a model shape (`lucegen build`: DEFAULT_MODEL; the runtime: the loaded model).

``plan_layout(config)`` places every tensor of a Qwen3.5 text model in two device buffers:

* ``wmat`` (the target's compute dtype, bf16 or fp16): the matrices, row-major, each 256-byte aligned. Per
  DeltaNet layer ``in_mat`` = [in_proj_qkv | in_proj_z | in_proj_a | in_proj_b] rows (one matvec splits evenly over
  all blocks), ``out_mat`` = out_proj; per attention layer ``in_mat`` = [q_proj | k_proj | v_proj], ``out_mat`` =
  o_proj; every layer ``gateup`` = gate_proj and up_proj rows interleaved (row 2i = gate i, row 2i+1 = up i, so one
  warp produces silu(gate_i) * up_i) and ``down``. Then the embedding (= lm_head when tied) and lm_head.
* ``wvec`` (float32): norms, conv1d taps [conv_dim][K], A_log, dt_bias, the gated-norm weight, q/k norms and
  RoPE's inverse frequencies.

``kernel_params(config, target)`` is everything the template needs beyond the descriptor: shapes, this layout's
offsets, scratch offsets, shared-memory carve-up and the per-phase work split. lucegen.runtime.packing packs a
checkpoint into this layout.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..errors import CheckpointError, TemplateError
from ..kernel_signature import KernelSignature, pointer, scalar
from ..model import lm_screen as lm_screen_bound
from ..model.config import FULL, ModelConfig
from ..target import DTYPES, Target
from .base import KernelFamily, f32_literal

#: The model shape `lucegen build` renders the megakernel for; the runtime renders the loaded model's own shape.
DEFAULT_MODEL = "qwen3.5-0.8b"
TEMPLATE = "megakernel/decode.cu.j2"

#: The kernel's name.
KERNEL_NAME = "qwen35_decode"
MAT_ALIGN = 128  # elements (256 bytes for 2-byte types)
VEC_ALIGN = 16  # floats
SCRATCH_ALIGN = 32  # floats


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class LayerLayout:
    kind: int  # 0 DeltaNet, 1 attention
    slot: int  # index among layers of its kind (state / KV cache slot)
    in_mat: int
    out_mat: int
    gateup: int
    down: int
    in_norm: int
    post_norm: int
    conv_w: int = -1
    a_log: int = -1
    dt_bias: int = -1
    gnorm: int = -1
    q_norm: int = -1
    k_norm: int = -1


@dataclass(frozen=True)
class Layout:
    config: ModelConfig
    layers: tuple[LayerLayout, ...]
    embed: int
    lm_head: int
    final_norm: int
    inv_freq: int
    wmat_elems: int
    wvec_floats: int
    scratch: dict
    scratch_floats: int

    @property
    def n_dn(self) -> int:
        return sum(1 for l in self.layers if l.kind == 0)

    @property
    def n_at(self) -> int:
        return sum(1 for l in self.layers if l.kind == 1)

    @property
    def conv_window_floats(self) -> int:
        """One DeltaNet layer's conv window: [conv_dim][conv_kernel - 1]."""
        return self.config.conv_dim * (self.config.conv_kernel - 1)

    @property
    def recurrent_state_floats(self) -> int:
        """One DeltaNet layer's recurrent state: [NV][DV][DK]."""
        c = self.config
        return c.linear_num_value_heads * c.linear_value_head_dim * c.linear_key_head_dim

    def conv_state_floats(self) -> int:
        return max(1, self.n_dn * self.conv_window_floats)

    def recurrent_floats(self) -> int:
        return max(1, self.n_dn * self.recurrent_state_floats)


def in_rows(config: ModelConfig, kind: int) -> int:
    c = config
    if kind == 0:
        return c.conv_dim + c.linear_value_dim + 2 * c.linear_num_value_heads
    return c.q_proj_dim + 2 * c.kv_dim


def out_cols(config: ModelConfig, kind: int) -> int:
    c = config
    return c.linear_value_dim if kind == 0 else c.num_attention_heads * c.head_dim


#: Key ranges per attention head at most in the decode megakernel (its scratch holds that many partial softmaxes).
ATTENTION_SPLITS_MAX = 32


def attention_splits(config: ModelConfig, blocks: int) -> int:
    """Key ranges per head at most: a power of two, one block each (so that every head's ranges run at once)."""
    per_head = max(1, blocks // config.num_attention_heads)
    return min(ATTENTION_SPLITS_MAX, 1 << (per_head.bit_length() - 1))


def plan_layout(config: ModelConfig) -> Layout:
    c = config
    h = c.hidden_size
    mat = 0
    vec = 0

    def take_mat(rows: int, cols: int) -> int:
        nonlocal mat
        off = mat
        mat = _align(mat + rows * cols, MAT_ALIGN)
        return off

    def take_vec(n: int) -> int:
        nonlocal vec
        off = vec
        vec = _align(vec + n, VEC_ALIGN)
        return off

    final_norm = take_vec(h)
    inv_freq = take_vec(c.rotary_dim // 2)
    layers = []
    slots = [0, 0]
    for kind_name in c.layer_types:
        kind = 1 if kind_name == FULL else 0
        slot = slots[kind]
        slots[kind] += 1
        in_mat = take_mat(in_rows(c, kind), h)
        out_mat = take_mat(h, out_cols(c, kind))
        gateup = take_mat(2 * c.intermediate_size, h)
        down = take_mat(h, c.intermediate_size)
        fields = dict(kind=kind, slot=slot, in_mat=in_mat, out_mat=out_mat, gateup=gateup, down=down,
                      in_norm=take_vec(h), post_norm=take_vec(h))
        if kind == 0:
            fields.update(conv_w=take_vec(c.conv_dim * c.conv_kernel), a_log=take_vec(c.linear_num_value_heads),
                          dt_bias=take_vec(c.linear_num_value_heads), gnorm=take_vec(c.linear_value_head_dim))
        else:
            fields.update(q_norm=take_vec(c.head_dim), k_norm=take_vec(c.head_dim))
        layers.append(LayerLayout(**fields))
    embed = take_mat(c.vocab_size, h)
    lm_head = embed if c.tie_word_embeddings else take_mat(c.vocab_size, h)

    scratch = {}
    size = 0
    for name, n in (("x", h), ("dn_in", c.conv_dim), ("dn_z", c.linear_value_dim),
                    ("dn_g", c.linear_num_value_heads), ("dn_beta", c.linear_num_value_heads),
                    ("dn_o", c.linear_value_dim), ("at_in", in_rows(c, 1)),
                    ("at_o", c.num_attention_heads * c.head_dim), ("act", c.intermediate_size),
                    ("at_part", c.num_attention_heads * ATTENTION_SPLITS_MAX * (c.head_dim + 2))):
        scratch[name] = size
        size = _align(size + n, SCRATCH_ALIGN)
    return Layout(c, tuple(layers), embed, lm_head, final_norm, inv_freq, mat, vec, scratch, size)




# ---------------------------------------------------------------------------------------------- template params
def _segments(rows: int, blocks: int, warps: int, cols: int) -> int:
    """How many column segments to split each row of a (rows x cols) matvec into so that the block's few rows
    still give every warp work; each segment a whole number of 8-element (16-byte) chunks."""
    per_block = max(1, math.ceil(rows / blocks))
    want = max(1, warps // per_block)
    for s in range(want, 0, -1):
        if cols % (8 * s) == 0:
            return s
    return 1


def check_supported(config: ModelConfig, target: Target) -> None:
    """The shapes this template handles; a clear error for anything else (before rendering)."""
    c, w = config, target.warp_size
    threads = target.megakernel.threads
    rules = [
        (c.hidden_size % 8 == 0, "hidden_size must be a multiple of 8 (16-byte weight rows)"),
        (c.intermediate_size % 8 == 0, "intermediate_size must be a multiple of 8"),
        (c.linear_value_dim % 8 == 0, "linear value dim must be a multiple of 8"),
        ((c.num_attention_heads * c.head_dim) % 8 == 0, "num_attention_heads * head_dim must be a multiple of 8"),
        (c.linear_key_head_dim % w == 0, f"linear_key_head_dim must be a multiple of the warp size {w}"),
        (c.head_dim % w == 0, f"head_dim must be a multiple of the warp size {w}"),
        (c.head_dim <= threads, f"head_dim must not exceed the megakernel's {threads} threads"),
        (c.conv_kernel >= 2, "conv_kernel must be at least 2"),
    ]
    for ok, reason in rules:
        if not ok:
            raise CheckpointError(f"model {c.name}: the decode megakernel cannot run this shape: {reason}")


def kernel_params(config: ModelConfig, target: Target, *, profile: bool = False, pipeline_a: bool = True,
                  rows_a: int = 2, pairs_d: int = 2, rows_lm: int = 2, rows_screen: int = 4,
                  att_keys_per_warp: int | None = None, prefetch_down: bool | None = None,
                  sampling: bool = False) -> dict:
    """The ``mk`` dict the template renders with (plus the descriptor's own params). Tuning knobs: ``pipeline_a``
    (double-buffer the in-projection), rows per warp of the row-split matvecs (powers of two), cached keys per warp
    per batch of the attention (its split over blocks follows: a head's keys are cut into ranges of at most that many
    per block), ``prefetch_down`` (gate/up asks the L2 for the block's down rows once its inputs are staged; a bulk
    prefetch: default on where the descriptor has features.tma). ``sampling``: the sampled instance,
    whose lm_head adds each token's Gumbel noise to its logit over the temperature (its launch takes sample_seed
    and temperature; the greedy instance is rendered as without it)."""
    check_supported(config, target)
    if prefetch_down is None:
        prefetch_down = target.features.tma
    if prefetch_down and not target.features.tma:
        raise TemplateError(f"megakernel tuning prefetch_down=True: a bulk prefetch into the L2, which {target.name} "
                            "lacks (features.tma = false)")
    rows_a_warp = {"rows_a": (rows_a, rows_a), "pairs_d": (pairs_d, 2 * pairs_d), "rows_lm": (rows_lm, rows_lm),
                   "rows_screen": (rows_screen, rows_screen)}  # knob: (its value, rows a warp)
    for knob, (value, rows) in rows_a_warp.items():
        if rows < 1 or rows & (rows - 1) or rows > target.warp_size:  # warp_sum_rows' halving exchange
            raise TemplateError(f"megakernel tuning {knob}={value}: {rows} rows a warp; the template takes a power of "
                                f"two up to {target.name}'s warp size {target.warp_size}")
    c = config
    lay = plan_layout(c)
    blocks, threads, warp = target.megakernel.blocks, target.megakernel.threads, target.warp_size
    warps = threads // warp
    h, ao, vd = c.hidden_size, c.num_attention_heads * c.head_dim, c.linear_value_dim
    # a batch of cached K and V rows in a lane's registers: 16 floats (measured on the H100: 32 is slower at short
    # contexts, where a key range twice as long leaves half as many blocks a head; docs/lab/megakernel-perf.md)
    if att_keys_per_warp is None:
        att_keys_per_warp = max(1, 8 // (c.head_dim // warp))
    segs_c_dn = _segments(h, blocks, warps, vd)
    segs_c_at = _segments(h, blocks, warps, ao)
    segs_e = _segments(h, blocks, warps, c.intermediate_size)
    rows_per_block = math.ceil(h / blocks)
    xs_max = _align(max(h, vd, ao, c.intermediate_size), 8)
    heads_max = _align(max(c.linear_num_value_heads, 2), 32)
    part = _align(max(2 * warps * rows_lm, rows_per_block * max(segs_c_dn, segs_c_at, segs_e)), 32)
    matvec_floats = 2 * xs_max + 64 + heads_max + part
    attn_fixed = 3 * c.head_dim + 64 + warps * c.head_dim
    smem_floats = max(matvec_floats, attn_fixed)
    if 4 * smem_floats > target.smem_per_block:
        raise CheckpointError(f"model {c.name}: the decode megakernel's shared memory ({4 * smem_floats} bytes) "
                              f"does not fit {target.name}'s smem_per_block {target.smem_per_block}")
    # the screened lm_head (lm_screen.py): a block's rows' upper ends after the matvec carve-up, and a count and the
    # candidates where the staging's raw inputs were (or after the upper ends); rendered where it fits and the rows
    # pack into 6-bit chunks (a multiple of 64 columns)
    screen_rows = math.ceil(c.vocab_size / blocks)
    list_in_raw = screen_rows + 1 <= xs_max
    screen_floats = matvec_floats + screen_rows + (0 if list_in_raw else screen_rows + 1)
    lm_screen = (not sampling and 4 * screen_floats <= target.smem_per_block
                 and h % (2 * lm_screen_bound.CHUNK) == 0)
    if lm_screen:
        smem_floats = max(smem_floats, screen_floats)
    return {
        "kernel_name": KERNEL_NAME,
        "model_name": c.name,
        "H": h, "I": c.intermediate_size, "V": c.vocab_size, "L": c.num_layers,
        "NH": c.num_attention_heads, "NKV": c.num_kv_heads, "HD": c.head_dim, "RD": c.rotary_dim,
        "NK": c.linear_num_key_heads, "NV": c.linear_num_value_heads, "DK": c.linear_key_head_dim,
        "DV": c.linear_value_head_dim, "CK": c.conv_kernel,
        "EPS": f32_literal(c.rms_norm_eps),
        "q_scale": f32_literal(1.0 / np.sqrt(c.linear_key_head_dim)),
        "attn_scale": f32_literal(c.head_dim ** -0.5),
        "n_dn": lay.n_dn, "n_at": lay.n_at,
        "blocks": blocks,
        "att_splits": attention_splits(c, blocks),
        # AMD: the waves of blocks_per_cu blocks spread over the CU's SIMDs (their register budget)
        "waves_per_simd": (-(-threads * target.megakernel.blocks_per_cu // (warp * target.simds_per_cu))
                           if target.is_amd else 0),
        "att_keys_per_warp": att_keys_per_warp, "att_keys_per_block": att_keys_per_warp * warps,
        "smem_floats": smem_floats,
        "xs_max": xs_max,
        "heads_max": heads_max,
        "segs_c_dn": segs_c_dn, "segs_c_at": segs_c_at, "segs_e": segs_e,
        "rows_a": rows_a, "pairs_d": pairs_d, "rows_lm": rows_lm, "rows_screen": rows_screen,
        "prefetch_down": bool(prefetch_down),
        "pipeline_a": pipeline_a,
        "lm_screen": lm_screen, "sm_screen": matvec_floats, "screen_list_in_raw": list_in_raw,
        "screen_rows": screen_rows,
        "screen_norm_slack": f32_literal(lm_screen_bound.norm_slack(h)),
        "screen_margin_rel": f32_literal(lm_screen_bound.MARGIN_REL),
        "profile": profile,
        "sampling": bool(sampling),
        "kv_dtype": target.kv_cache_type,
        "kv_ctype": DTYPES[target.kv_cache_type][0],
        "embed": lay.embed, "lm_head": lay.lm_head, "final_norm": lay.final_norm, "inv_freq": lay.inv_freq,
        "layers": [dataclasses.asdict(l) for l in lay.layers],
        "s": dict(lay.scratch),
    }


#: The kernel's parameters (wt_t, kv_t and code6_t are the template's types of a weight, a KV cache element and a byte of the
#: lm_head screen's codes).
SIGNATURES = (
    KernelSignature(KERNEL_NAME, (
        pointer("wmat", "wt_t", const=True, restrict=False), pointer("wvec", "float", const=True, restrict=False),
        pointer("conv_state", "float", restrict=False), pointer("recurrent", "float", restrict=False),
        pointer("kv_cache", "kv_t", restrict=False), pointer("scratch", "unsigned long long", restrict=False),
        pointer("barrier", "unsigned", restrict=False), pointer("argmax", "unsigned long long", restrict=False),
        pointer("tokens_in", "int", const=True, restrict=False), pointer("tokens_out", "int", restrict=False),
        pointer("logits", "float", restrict=False), pointer("lm_codes", "code6_t", const=True, restrict=False),
        pointer("lm_rows", "float2", const=True, restrict=False),
        pointer("screen_floor", "unsigned long long", restrict=False),
        pointer("profile", "unsigned long long", restrict=False), scalar("max_context", "int"),
        scalar("start_pos", "int"), scalar("n_steps", "int"), scalar("n_forced", "int"),
        scalar("epoch_base", "unsigned"), scalar("sample_seed", "unsigned long long", when="sampling"),
        scalar("temperature", "float", when="sampling"),
    )),
)


def _params(target: Target, config: ModelConfig) -> dict:
    return {"mk": kernel_params(config, target)}


FAMILIES = (KernelFamily("megakernel", TEMPLATE, params=_params, shapes=(DEFAULT_MODEL,), quantised_shapes=(),
                         preset=ModelConfig.preset, signatures=SIGNATURES),)

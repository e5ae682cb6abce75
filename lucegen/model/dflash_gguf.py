"""DFlash drafts as GGUF files, in the layout lucebox-hub's draft loader reads (architecture ``qwen35-dflash-draft``;
``dflash-draft`` is read too).

Tensors (numpy order, rows first; matrices in BF16, F16, F32 or Q8_0, norms in F32, stored as the draft's own
weights, not 1 + w):

    dflash.fc.weight [hidden, taps * hidden]     dflash.hidden_norm.weight [hidden]     output_norm.weight [hidden]
    blk.<i>.attn_norm / ffn_norm / attn_q_norm / attn_k_norm .weight
    blk.<i>.attn_q / attn_k / attn_v / attn_output / ffn_gate / ffn_up / ffn_down .weight

Metadata, under ``<arch>.``: embedding_length, block_count, feed_forward_length, attention.head_count,
attention.head_count_kv, attention.key_length, attention.layer_norm_rms_epsilon, rope.freq_base, context_length,
dflash.block_size, dflash.target_layer_ids (int32 array; or dflash.n_target_layers to derive them),
dflash.mask_token_id, vocab_size (the target's; a file without it takes the target's when loaded beside one),
attention.sliding_window and attention.sliding_window_pattern (bool per layer) for sliding layers, and
dflash.is_causal / input_embedding_scale / output_multiplier / final_logit_softcapping where not the default.

``load_dflash_gguf(path)`` checks every tensor's presence, shape and type and returns a checkpoint under the
safetensors names (:meth:`DFlashConfig.tensor_shapes`); :mod:`lucegen.model.init_dflash` writes random drafts in
this layout.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .dflash import FULL, SLIDING, DFlashConfig, build_target_layer_ids
from .gguf_io import LAYER_NAMES as TARGET_LAYER_NAMES, GGUFFile, GGUFStoredCheckpoint, gguf_name
from .quant import READABLE

ARCH = "qwen35-dflash-draft"
ARCHES = (ARCH, "dflash-draft")
GLOBAL_NAMES = {"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
                "norm.weight": "output_norm.weight"}
# per layer: llama.cpp's names for the leaves a draft layer shares with a target's attention layer, except that the
# post-attention norm is ffn_norm (the draft is a Qwen3 stack)
LAYER_NAMES = {**{leaf: TARGET_LAYER_NAMES[leaf] for leaf in (
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight")}, "post_attention_layernorm.weight": "ffn_norm.weight"}
# other spellings lucebox-hub's loader accepts: GGUF name -> ours
ALIASES = {"dflash_fc.weight": "dflash.fc.weight", "dflash_hidden_norm.weight": "dflash.hidden_norm.weight"}
LAYER_ALIASES = {"post_attention_norm.weight": "ffn_norm.weight"}


def draft_gguf_name(name: str) -> str:
    """The GGUF name of draft tensor ``name`` (a safetensors name)."""
    return gguf_name(name, GLOBAL_NAMES, LAYER_NAMES)


def _canonical(gname: str) -> str:
    if gname in ALIASES:
        return ALIASES[gname]
    m = re.fullmatch(r"(blk\.\d+\.)(.+)", gname)
    return m.group(1) + LAYER_ALIASES.get(m.group(2), m.group(2)) if m else gname


# ------------------------------------------------------------------------------------------------ config
def config_from_draft_gguf(g: GGUFFile, vocab_size: int | None = None) -> DFlashConfig:
    """The draft's config from the GGUF metadata (``vocab_size``: the target's, for a file that does not say)."""
    meta, source = g.metadata, g.path
    arch = meta.get("general.architecture")
    if arch not in ARCHES:
        raise CheckpointError(f"{source}: general.architecture {arch!r} is not a DFlash draft "
                              f"(expected {' or '.join(ARCHES)})")

    def get(key, kind, default=dataclasses.MISSING):
        full = f"{arch}.{key}"
        if full not in meta:
            if default is dataclasses.MISSING:
                raise CheckpointError(f"{source}: metadata {full!r} is missing")
            return default
        value = meta[full]
        ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
              float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              bool: lambda v: isinstance(v, bool) or v in (0, 1), list: lambda v: isinstance(v, list)}[kind](value)
        if not ok:
            raise CheckpointError(f"{source}: metadata {full!r}: expected {kind.__name__}, got {value!r}")
        if kind is float:  # stored as float32: the shortest decimal that rounds to it (1e-06, not 9.99e-07)
            return float(str(np.float32(value)))
        return kind(value) if kind is not list else value

    num_layers = get("block_count", int)
    ids = get("dflash.target_layer_ids", list, None)
    n_target = get("dflash.n_target_layers", int, None)
    if ids is None:
        if n_target is None:
            raise CheckpointError(f"{source}: metadata {arch}.dflash.target_layer_ids is missing (and no "
                                  f"{arch}.dflash.n_target_layers to derive it from)")
        ids = build_target_layer_ids(n_target, num_layers)
    window = get("attention.sliding_window", int, None) or None
    pattern = get("attention.sliding_window_pattern", list, [False] * num_layers)
    if len(pattern) != num_layers:
        raise CheckpointError(f"{source}: metadata {arch}.attention.sliding_window_pattern has {len(pattern)} "
                              f"entries for {num_layers} layers")
    vocab = get("vocab_size", int, vocab_size)
    if vocab is None:
        raise CheckpointError(f"{source}: metadata {arch}.vocab_size is missing: load the draft beside its target "
                              "(whose vocabulary it shares)")
    is_causal = get("dflash.is_causal", bool, None)
    softcap = get("dflash.final_logit_softcapping", float, 0.0)
    try:
        return DFlashConfig(
            hidden_size=get("embedding_length", int), num_layers=num_layers,
            intermediate_size=get("feed_forward_length", int), vocab_size=vocab,
            num_attention_heads=get("attention.head_count", int),
            num_kv_heads=get("attention.head_count_kv", int), head_dim=get("attention.key_length", int),
            rms_norm_eps=get("attention.layer_norm_rms_epsilon", float, 1e-6),
            rope_theta=get("rope.freq_base", float), block_size=get("dflash.block_size", int),
            mask_token_id=get("dflash.mask_token_id", int), target_layer_ids=tuple(int(i) for i in ids),
            num_target_layers=n_target, layer_types=tuple(SLIDING if s else FULL for s in pattern),
            sliding_window=window, is_causal=is_causal,
            max_position_embeddings=get("context_length", int, 262144),
            input_embedding_scale=get("dflash.input_embedding_scale", float, 1.0),
            output_multiplier=get("dflash.output_multiplier", float, 1.0),
            final_logit_softcapping=softcap or None, name=str(meta.get("general.name") or "custom"))
    except CheckpointError as exc:  # DFlashConfig.validate names the field; add the file
        raise CheckpointError(str(exc).replace("<config>", str(source), 1)) from None


# ------------------------------------------------------------------------------------------------ checkpoint
def load_dflash_gguf(path, vocab_size: int | None = None) -> GGUFStoredCheckpoint:
    """A draft GGUF under the safetensors names (its values as stored: the draft's own), every tensor checked for
    presence, shape and a readable type; nothing unexpected."""
    path = Path(path)
    g = GGUFFile(path)
    config = config_from_draft_gguf(g, vocab_size)
    stored = {}
    for gname in g.tensors:
        canonical = _canonical(gname)
        if canonical in stored:
            raise CheckpointError(f"{path}: tensors {stored[canonical]!r} and {gname!r} are the same tensor")
        stored[canonical] = gname
    where = {}
    for name, shape in config.tensor_shapes().items():
        canonical = draft_gguf_name(name)
        if canonical not in stored:
            raise CheckpointError(f"{path}: missing draft tensor {canonical!r} ({name})")
        t = g.tensors[stored.pop(canonical)]
        if t.shape != shape:
            raise CheckpointError(f"{path}: tensor {t.name!r}: shape {list(t.shape)}, the metadata implies "
                                  f"{list(shape)}")
        if t.type_name not in READABLE:
            raise CheckpointError(f"{path}: tensor {t.name!r}: type {t.type_name} is not supported (readable: "
                                  f"{', '.join(READABLE)})")
        where[name] = t.name
    if stored:
        extra = sorted(stored.values())
        raise CheckpointError(f"{path}: unexpected tensor {extra[0]!r} for a {config.num_layers}-layer DFlash draft")
    return GGUFStoredCheckpoint(path, g, config, where)


def is_gguf(path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return path.is_file() and f.read(4) == b"GGUF"
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------ writing

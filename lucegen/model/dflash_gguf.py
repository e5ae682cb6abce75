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

Other layouts in use, read too:
- lucebox-hub's converters (``convert_dflash_to_gguf.py``, ``quantize_draft_q8.py``) write
  ``dflash.n_target_layers`` = the number of tapped target layers (fc's input is that many hidden vectors), and
  ``dflash.target_layer_ids`` only where the taps are known; without them the taps are computed from the target's
  depth N as lucebox-hub's ``gguf_target_loader.cpp`` does: step = (N - 2) / (taps - 1) in integers, tap k at
  1 + k * step (1, 16, 31, 46, 61 on 64 layers). A file without ``dflash.mask_token_id`` takes the target's mask
  token (its loader's ``target->mask_token_id``). Its older converters wrote a fixed ``rope.freq_base``: one that
  differs from the target's is warned about (:func:`check_rope`).
- llama.cpp's own ``dflash`` architecture (``conversion/qwen.py`` DFlashModel, ``src/models/dflash.cpp``):
  ``fc.weight``, ``enc.output_norm.weight`` (the hidden norm), ``output_norm.weight``, the same layer names, and
  ``dflash.target_layers`` = the HF target_layer_ids + 1 (hidden_states indices).
- fork layouts that also carry ``token_embd.weight`` / ``output.weight`` (a copy of the target's): ignored, with a
  note; the draft always uses the target's embedding and head.

``load_dflash_gguf(path)`` checks every tensor's presence, shape and type and returns a checkpoint under the
safetensors names (:meth:`DFlashConfig.tensor_shapes`); :mod:`lucegen.model.init_dflash` writes random drafts in
this layout.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .dflash import FULL, SLIDING, DFlashConfig
from .gguf_io import LAYER_NAMES as TARGET_LAYER_NAMES, GGUFFile, GGUFStoredCheckpoint, gguf_name
from .quant import READABLE

log = logging.getLogger(__name__)

ARCH = "qwen35-dflash-draft"
LLAMA_CPP_ARCH = "dflash"
ARCHES = (ARCH, "dflash-draft", LLAMA_CPP_ARCH)
GLOBAL_NAMES = {"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
                "norm.weight": "output_norm.weight"}
#: llama.cpp's dflash arch spells the two DFlash tensors without the prefix (hidden_norm as the encoder norm).
LLAMA_CPP_NAMES = {"fc.weight": "dflash.fc.weight", "enc.output_norm.weight": "dflash.hidden_norm.weight"}
#: Tensors some fork layouts add (a copy of the target's embedding / head): ignored.
IGNORED = ("token_embd.weight", "output.weight")
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


def _canonical(gname: str, arch: str) -> str:
    if gname in ALIASES:
        return ALIASES[gname]
    if arch == LLAMA_CPP_ARCH and gname in LLAMA_CPP_NAMES:
        return LLAMA_CPP_NAMES[gname]
    m = re.fullmatch(r"(blk\.\d+\.)(.+)", gname)
    return m.group(1) + LAYER_ALIASES.get(m.group(2), m.group(2)) if m else gname


# ------------------------------------------------------------------------------------------------ config
def lucebox_taps(target_layers: int, taps: int) -> tuple[int, ...]:
    """The target layers lucebox-hub taps for a draft of ``taps`` taps on a ``target_layers``-layer target
    (gguf_target_loader.cpp: step = (n_layer - 2) / (N - 1) in integers, ids[k] = 1 + k * step)."""
    if taps == 1:
        return (1,)
    step = (target_layers - 2) // (taps - 1)
    return tuple(1 + k * step for k in range(taps))


@dataclasses.dataclass(frozen=True)
class TargetFacts:
    """What a draft file may leave to its target: depth (for computed taps), vocabulary, mask token, RoPE base."""
    num_layers: int
    vocab_size: int
    rope_theta: float
    mask_token_id: int | None = None


def config_from_draft_gguf(g: GGUFFile, vocab_size: int | None = None,
                           target: TargetFacts | None = None) -> DFlashConfig:
    """The draft's config from the GGUF metadata; ``target`` (or ``vocab_size`` alone) supplies what the file leaves
    to its target: vocab_size, the taps of a file that gives only their count, the mask token."""
    meta, source = g.metadata, g.path
    arch = meta.get("general.architecture")
    if arch not in ARCHES:
        raise CheckpointError(f"{source}: general.architecture {arch!r} is not a DFlash draft "
                              f"(expected {' or '.join(ARCHES)})")

    def get(key, kind, default=dataclasses.MISSING):
        # llama.cpp's dflash arch: its DFlash keys are "dflash.<key>", the arch prefix being "dflash" itself
        full = key if arch == LLAMA_CPP_ARCH and key.startswith("dflash.") else f"{arch}.{key}"
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

    if target is not None and vocab_size is None:
        vocab_size = target.vocab_size
    num_layers = get("block_count", int)
    ids = get("dflash.target_layer_ids", list, None)
    n_target = get("dflash.n_target_layers", int, None)
    depth = None  # the target depth the file names, if any
    if arch == LLAMA_CPP_ARCH:
        hidden_ids = get("dflash.target_layers", list, None)
        if hidden_ids is None:
            raise CheckpointError(f"{source}: metadata 'dflash.target_layers' is missing")
        if not all(isinstance(i, int) and i >= 1 for i in hidden_ids):
            raise CheckpointError(f"{source}: metadata 'dflash.target_layers': {hidden_ids!r} are not "
                                  "hidden-state indices (HF target_layer_ids + 1, each at least 1)")
        ids = [i - 1 for i in hidden_ids]
    elif ids is not None:
        # lucebox-hub writes the tap count here; lucegen's own files, the target's depth
        depth = n_target if n_target is not None and n_target != len(ids) else None
    elif n_target is not None:
        if target is None:
            raise CheckpointError(f"{source}: metadata {arch}.dflash.target_layer_ids is missing: the "
                                  f"{n_target} taps are computed from the target's depth (load the draft beside "
                                  "its target)")
        ids = lucebox_taps(target.num_layers, n_target)
    else:
        raise CheckpointError(f"{source}: metadata {arch}.dflash.target_layer_ids is missing (and no "
                              f"{arch}.dflash.n_target_layers to compute it from)")
    mask = get("dflash.mask_token_id", int, None)
    if mask is None:
        if target is None or target.mask_token_id is None:
            raise CheckpointError(f"{source}: metadata '{arch}.dflash.mask_token_id' is missing"
                                  + ("" if target is None else " and the target names no mask token"))
        mask = target.mask_token_id
    window = get("attention.sliding_window", int, None) or None
    pattern = get("attention.sliding_window_pattern", list, [False] * num_layers)
    if len(pattern) != num_layers:
        raise CheckpointError(f"{source}: metadata {arch}.attention.sliding_window_pattern has {len(pattern)} "
                              f"entries for {num_layers} layers")
    tokens = meta.get("tokenizer.ggml.tokens")  # llama.cpp's dflash files carry the target's vocabulary
    vocab = get("vocab_size", int, vocab_size if vocab_size is not None or not isinstance(tokens, list)
                else len(tokens))
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
            mask_token_id=mask, target_layer_ids=tuple(int(i) for i in ids),
            num_target_layers=depth, layer_types=tuple(SLIDING if s else FULL for s in pattern),
            sliding_window=window, is_causal=is_causal,
            unwindowed_sliding=window is None and any(pattern),
            max_position_embeddings=get("context_length", int, 262144),
            input_embedding_scale=get("dflash.input_embedding_scale", float, 1.0),
            output_multiplier=get("dflash.output_multiplier", float, 1.0),
            final_logit_softcapping=softcap or None, name=str(meta.get("general.name") or "custom"))
    except CheckpointError as exc:  # DFlashConfig.validate names the field; add the file
        raise CheckpointError(str(exc).replace("<config>", str(source), 1)) from None


# ------------------------------------------------------------------------------------------------ checkpoint
def load_dflash_gguf(path, vocab_size: int | None = None, target: TargetFacts | None = None) -> GGUFStoredCheckpoint:
    """A draft GGUF under the safetensors names (its values as stored: the draft's own), every tensor checked for
    presence, shape and a readable type; nothing unexpected but a fork's copy of the target's embedding / head
    (ignored, with a note)."""
    path = Path(path)
    g = GGUFFile(path)
    config = config_from_draft_gguf(g, vocab_size, target)
    arch = g.metadata.get("general.architecture")
    ignored = sorted(n for n in g.tensors if n in IGNORED)
    if ignored:
        log.warning("%s: ignoring %s: the draft uses its target's embedding and lm_head", path, ", ".join(ignored))
    stored = {}
    for gname in g.tensors:
        if gname in IGNORED:
            continue
        canonical = _canonical(gname, arch)
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


def check_rope(config: DFlashConfig, target_rope_theta: float, source) -> None:
    """One warning when a draft GGUF's rope.freq_base differs from its target's (lucebox-hub's older converters wrote
    a fixed value); the file's value is used."""
    if config.rope_theta != target_rope_theta:
        log.warning("%s: rope.freq_base %g differs from the target's rope_theta %g (lucebox-hub's older converters "
                    "wrote a fixed value); using the draft's %g", source, config.rope_theta, target_rope_theta,
                    config.rope_theta)


def is_gguf(path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return path.is_file() and f.read(4) == b"GGUF"
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------ writing

"""The DFlash draft model: its config, tensor shapes and its directory reader (random weights:
:mod:`lucegen.model.init_dflash`; any draft path: :func:`lucegen.model.checkpoint.load_dflash`).

What a DFlash draft is (z-lab/dflash ``dflash/model.py``: ``DFlashDraftModel``, ``Qwen3DFlashAttention``; the same
model in liranringel/ddtree ``model/dflash.py``):

- A few Qwen3 decoder layers (q/k/v/o projections, per-head q/k RMSNorm, SwiGLU MLP, Qwen3 RMSNorms that multiply
  by the weight itself, no ``1 + w``), a final ``norm``. No embedding and no lm_head of its own: the block's input
  is the *target's* embedding of [last committed token, mask token x (block_size - 1)] and its output goes through
  the *target's* lm_head (``target.model.embed_tokens`` / ``target.lm_head`` in ddtree ``ddtree.py``).
- Context: the target's hidden states after layers ``target_layer_ids`` (HF ``hidden_states[i + 1]``,
  ``extract_context_feature``), concatenated along features, projected by ``fc`` [hidden, n * hidden] and normalised
  by ``hidden_norm``. Every draft layer projects this context with its own k_proj/v_proj (then k_norm and RoPE at the
  context positions) and its queries attend to [context keys | block keys]; non-causal inside the block unless a
  layer is ``sliding_attention`` or ``is_causal`` says otherwise.
- Config keys are read the way z-lab's ``_draft_value`` reads them: ``dflash_config[key]`` first, then the top
  level (``block_size`` sits at the top level in the published Qwen3 drafts, in ``dflash_config`` in newer ones);
  ``block_size`` defaults to 16. When ``target_layer_ids`` is absent it is derived from ``num_target_layers`` as
  liranringel/ddtree ``model/utils.py`` ``build_target_layer_ids`` does.
- Tensor names in ``model.safetensors`` have no prefix: ``fc.weight``, ``hidden_norm.weight``,
  ``layers.{i}.{input_layernorm,post_attention_layernorm}.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
  ``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``norm.weight``
  (z-lab/dflash ``tests/fixtures/dflash2-safetensors-header.json`` lists the same names for its DFlash2 variant,
  which adds conv and selector tensors that plain DFlash lacks).

The ``dflash-qwen3.5-27b`` preset is z-lab/Qwen3.5-27B-DFlash (3.22 GiB of BF16 safetensors): 5 layers, hidden 5120
(the target's), 32 q / 8 kv heads of 128, intermediate 17408, vocab 248320, rms eps 1e-6, rope theta 1e7, block 16,
mask token 248070, target layers {1, 16, 31, 46, 61} of 64 (so ``fc`` is [5120, 25600]). Source: the constants
lucebox hard-codes for this exact pair, Luce-Org/lucebox-hub ``dflash/include/dflash27b.h``
(``DFLASH27B_DRAFT_*``, ``DFLASH27B_TARGET_N_HEADS/N_KV_HEADS/HEAD_DIM`` which are draft dims, see its note) and
``DFLASH27B_ROPE_THETA`` in its later revisions; the target layer ids equal ``build_target_layer_ids(64, 5)``.
The parameter count (1.73 G = 3.22 GiB in BF16) matches the published file size.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .config import MAX_RMS_NORM_EPS, MAX_ROPE_THETA, MIN_ROPE_THETA

FULL = "full_attention"
SLIDING = "sliding_attention"
LAYER_TYPES = (FULL, SLIDING)
ARCHITECTURE = "DFlashDraftModel"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """The default choice of target layers (liranringel/ddtree ``model/utils.py``): evenly spread over
    [1, num_target_layers - 3], rounded; the middle layer for a one-layer draft."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    span = end - start
    return tuple(int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int  # = the target's hidden size (the draft reuses its embedding and lm_head)
    num_layers: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int  # tokens per draft block: the last committed token + block_size - 1 mask tokens
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # target layers whose outputs feed fc, in fc's input order
    num_target_layers: int | None = None  # layer count of the target it was trained for, when the config says
    layer_types: tuple[str, ...] = ()  # () = all full_attention
    sliding_window: int | None = None
    is_causal: bool | None = None  # None: causal only in sliding layers (z-lab Qwen3DFlashAttention)
    max_position_embeddings: int = 262144
    initializer_range: float = 0.02
    # newer z-lab drafts scale the target embedding / the logits and may soft-cap them (dflash/model.py:
    # input_embedding_scale, output_multiplier, final_logit_softcapping); the Qwen3.5 drafts use the defaults
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    # use_sliding_window: false with sliding_attention layers: HF's Qwen3Config sets sliding_window to None, and z-lab's
    # Qwen3DFlashAttention then runs those layers causal (is_causal None) with no window
    unwindowed_sliding: bool = False
    name: str = "custom"

    def __post_init__(self):
        object.__setattr__(self, "target_layer_ids", tuple(self.target_layer_ids))
        types = tuple(self.layer_types) or (FULL,) * self.num_layers
        object.__setattr__(self, "layer_types", types)
        self.validate("<config>")

    # ----------------------------------------------------------------------------------------- derived sizes
    @property
    def draft_horizon(self) -> int:  # positions proposed per block (the first block slot is the committed token)
        return self.block_size - 1

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def fc_in_features(self) -> int:
        return len(self.target_layer_ids) * self.hidden_size

    def layer_is_causal(self, i: int) -> bool:
        return self.layer_types[i] == SLIDING if self.is_causal is None else self.is_causal

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_types[i] == SLIDING else None

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the draft, names as stored in its ``model.safetensors``."""
        h = self.hidden_size
        shapes: dict[str, tuple[int, ...]] = {"fc.weight": (h, self.fc_in_features), "hidden_norm.weight": (h,)}
        for i in range(self.num_layers):
            p = f"layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (self.q_dim, h)
            shapes[p + "self_attn.k_proj.weight"] = (self.kv_dim, h)
            shapes[p + "self_attn.v_proj.weight"] = (self.kv_dim, h)
            shapes[p + "self_attn.o_proj.weight"] = (h, self.q_dim)
            shapes[p + "self_attn.q_norm.weight"] = (self.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (self.head_dim,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "mlp.gate_proj.weight"] = (self.intermediate_size, h)
            shapes[p + "mlp.up_proj.weight"] = (self.intermediate_size, h)
            shapes[p + "mlp.down_proj.weight"] = (h, self.intermediate_size)
        shapes["norm.weight"] = (h,)
        return shapes

    def num_parameters(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) for s in self.tensor_shapes().values())

    # ----------------------------------------------------------------------------------------- validation
    def validate(self, source) -> None:
        def bad(key, reason):
            raise CheckpointError(f"{source}: {key}: {reason}")

        for key in ("hidden_size", "num_layers", "intermediate_size", "vocab_size", "num_attention_heads",
                    "num_kv_heads", "head_dim", "block_size", "max_position_embeddings"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                bad(key, f"must be a positive integer, got {value!r}")
        if self.block_size < 2:
            bad("block_size", f"must be at least 2 (the committed token and one proposal), got {self.block_size}")
        if self.num_attention_heads % self.num_kv_heads:
            bad("num_key_value_heads", f"{self.num_kv_heads} does not divide {self.num_attention_heads} q heads")
        if self.head_dim % 2:
            bad("head_dim", f"must be even for RoPE, got {self.head_dim}")
        if not isinstance(self.mask_token_id, int) or isinstance(self.mask_token_id, bool) \
                or not 0 <= self.mask_token_id < self.vocab_size:
            bad("dflash_config.mask_token_id", f"{self.mask_token_id!r} is not a token id below vocab_size "
                                               f"{self.vocab_size}")
        if not self.target_layer_ids:
            bad("dflash_config.target_layer_ids", "is empty")
        for i, layer in enumerate(self.target_layer_ids):
            if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
                bad(f"dflash_config.target_layer_ids[{i}]", f"must be a non-negative integer, got {layer!r}")
            if self.num_target_layers is not None and layer >= self.num_target_layers:
                bad(f"dflash_config.target_layer_ids[{i}]",
                    f"layer {layer} does not exist in a {self.num_target_layers}-layer target")
        if len(set(self.target_layer_ids)) != len(self.target_layer_ids):
            bad("dflash_config.target_layer_ids", f"repeats a layer: {list(self.target_layer_ids)}")
        if self.num_target_layers is not None and (not isinstance(self.num_target_layers, int)
                                                   or self.num_target_layers <= 0):
            bad("num_target_layers", f"must be a positive integer, got {self.num_target_layers!r}")
        if len(self.layer_types) != self.num_layers:
            bad("layer_types", f"has {len(self.layer_types)} entries for {self.num_layers} layers")
        for i, t in enumerate(self.layer_types):
            if t not in LAYER_TYPES:
                bad(f"layer_types[{i}]", f"unknown layer type {t!r} (expected one of {', '.join(LAYER_TYPES)})")
        if SLIDING in self.layer_types and not self.unwindowed_sliding and (
                not isinstance(self.sliding_window, int) or self.sliding_window <= 0):
            bad("sliding_window", f"sliding_attention layers need a positive window, got {self.sliding_window!r}")
        if self.unwindowed_sliding and self.sliding_window is not None:
            bad("sliding_window", f"{self.sliding_window!r} with use_sliding_window: false (HF drops the window)")
        if not 0 < self.rms_norm_eps <= MAX_RMS_NORM_EPS:
            bad("rms_norm_eps", f"must be in (0, {MAX_RMS_NORM_EPS:g}], got {self.rms_norm_eps!r}")
        if not MIN_ROPE_THETA < self.rope_theta <= MAX_ROPE_THETA:
            bad("rope_theta", f"must be in ({MIN_ROPE_THETA:g}, {MAX_ROPE_THETA:g}], got {self.rope_theta!r}")

    def check_target(self, target, source="draft") -> None:
        """Raise CheckpointError unless this draft fits ``target`` (a :class:`ModelConfig`): same hidden size and
        vocabulary (it borrows the target's embedding and lm_head), tapped layers inside the target."""
        if self.hidden_size != target.hidden_size:
            raise CheckpointError(f"{source}: hidden_size {self.hidden_size} does not match the target's "
                                  f"{target.hidden_size}")
        if self.vocab_size != target.vocab_size:
            raise CheckpointError(f"{source}: vocab_size {self.vocab_size} does not match the target's "
                                  f"{target.vocab_size}")
        if self.num_target_layers is not None and self.num_target_layers != target.num_layers:
            raise CheckpointError(f"{source}: num_target_layers {self.num_target_layers}: the target has "
                                  f"{target.num_layers} layers")
        bad = [i for i in self.target_layer_ids if i >= target.num_layers]
        if bad:
            raise CheckpointError(f"{source}: dflash_config.target_layer_ids: layer {bad[0]} does not exist in the "
                                  f"{target.num_layers}-layer target")

    # ----------------------------------------------------------------------------------------- constructors
    @classmethod
    def preset(cls, name: str) -> DFlashConfig:
        try:
            return PRESETS[name]
        except KeyError:
            raise CheckpointError(f"unknown draft preset {name!r} (known: {', '.join(PRESETS)})") from None

    @classmethod
    def from_hf_config(cls, cfg: dict, source="config.json") -> DFlashConfig:
        """From a draft's ``config.json`` dict (z-lab layout: a Qwen3 config plus ``dflash_config``)."""
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
        archs = cfg.get("architectures")
        if archs is not None:
            if not isinstance(archs, list) or ARCHITECTURE not in archs:
                other = f" ({archs[0]} drafts are not supported)" if isinstance(archs, list) and archs else ""
                raise CheckpointError(f"{source}: architectures: {archs!r} is not a DFlash draft (expected "
                                      f"{ARCHITECTURE!r}){other}")
        model_type = cfg.get("model_type")
        if model_type is not None and model_type != "qwen3":
            raise CheckpointError(f"{source}: model_type: {model_type!r} (a DFlash draft is a 'qwen3' model)")
        dflash = cfg.get("dflash_config", {})
        if not isinstance(dflash, dict):
            raise CheckpointError(f"{source}: dflash_config: expected an object, got {dflash!r}")

        def where(key):
            return f"dflash_config.{key}" if key in dflash else key

        def get(key, default=dataclasses.MISSING):
            if key in dflash:
                return dflash[key]
            if key in cfg:
                return cfg[key]
            if default is dataclasses.MISSING:
                raise CheckpointError(f"{source}: {key}: missing (looked in dflash_config and at the top level)")
            return default

        def integer(key, default=dataclasses.MISSING):
            value = get(key, default)
            if value is None and default is None:
                return None
            if not isinstance(value, int) or isinstance(value, bool):
                raise CheckpointError(f"{source}: {where(key)}: expected an integer, got {value!r}")
            return value

        def number(key, default=dataclasses.MISSING, value=dataclasses.MISSING):
            value = get(key, default) if value is dataclasses.MISSING else value
            if value is None and default is None:
                return None
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise CheckpointError(f"{source}: {where(key)}: expected a number, got {value!r}")
            return float(value)

        if cfg.get("attention_bias", False):
            raise CheckpointError(f"{source}: attention_bias: true is not supported (DFlash drafts have no biases)")
        if cfg.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{source}: hidden_act: {cfg['hidden_act']!r} is not supported (only 'silu')")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise CheckpointError(f"{source}: rope_parameters: expected an object, got {rope!r}")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise CheckpointError(f"{source}: rope_parameters.rope_type: {rope_type!r} is not supported "
                                  "(only 'default')")
        num_layers = integer("num_hidden_layers")
        num_target_layers = integer("num_target_layers", None)
        target_layer_ids = get("target_layer_ids", None)
        if target_layer_ids is None:
            if num_target_layers is None:
                raise CheckpointError(f"{source}: dflash_config.target_layer_ids: missing (and no "
                                      "num_target_layers to derive it from)")
            target_layer_ids = build_target_layer_ids(num_target_layers, num_layers)
        if not isinstance(target_layer_ids, (list, tuple)):
            raise CheckpointError(f"{source}: dflash_config.target_layer_ids: expected a list, got "
                                  f"{target_layer_ids!r}")
        use_sliding = cfg.get("use_sliding_window", True)
        layer_types = cfg.get("layer_types")
        if layer_types is None:  # HF Qwen3Config's default
            first_sliding = integer("max_window_layers", 28)
            layer_types = [SLIDING if cfg.get("use_sliding_window", False) and i >= first_sliding else FULL
                           for i in range(num_layers)]
        if not isinstance(layer_types, (list, tuple)):
            raise CheckpointError(f"{source}: layer_types: expected a list, got {layer_types!r}")
        window = cfg.get("sliding_window") if use_sliding else None
        unwindowed = cfg.get("use_sliding_window") is False and SLIDING in layer_types
        if window is not None and (not isinstance(window, int) or isinstance(window, bool)):
            raise CheckpointError(f"{source}: sliding_window: expected an integer or null, got {window!r}")
        is_causal = cfg.get("is_causal", dflash.get("is_causal"))
        if is_causal is not None and not isinstance(is_causal, bool):
            raise CheckpointError(f"{source}: is_causal: expected true, false or null, got {is_causal!r}")
        hidden = integer("hidden_size")
        heads = integer("num_attention_heads")
        softcap = number("final_logit_softcapping", None)
        try:
            return cls(
                hidden_size=hidden,
                num_layers=num_layers,
                intermediate_size=integer("intermediate_size"),
                vocab_size=integer("vocab_size"),
                num_attention_heads=heads,
                num_kv_heads=integer("num_key_value_heads"),
                head_dim=integer("head_dim", hidden // heads if heads else 0),
                rms_norm_eps=number("rms_norm_eps", 1e-6),
                rope_theta=number("rope_theta", value=rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                block_size=integer("block_size", 16),
                mask_token_id=integer("mask_token_id"),
                target_layer_ids=tuple(target_layer_ids),
                num_target_layers=num_target_layers,
                layer_types=tuple(layer_types),
                sliding_window=window,
                is_causal=is_causal,
                max_position_embeddings=integer("max_position_embeddings", 262144),
                initializer_range=number("initializer_range", 0.02),
                input_embedding_scale=number("input_embedding_scale", 1.0),
                output_multiplier=number("output_multiplier", 1.0),
                final_logit_softcapping=softcap if softcap else None,
                unwindowed_sliding=unwindowed,
                name=str(cfg.get("_name_or_path") or "custom"),
            )
        except CheckpointError as exc:  # validate() names the key; add the file
            raise CheckpointError(str(exc).replace("<config>", f"{source}", 1)) from None

    @classmethod
    def from_file(cls, path) -> DFlashConfig:
        return cls.from_hf_config(read_json(path), source=path)

    def to_hf_config(self) -> dict:
        """The draft's ``config.json`` in the published z-lab layout (``from_hf_config`` reads it back)."""
        cfg = {
            "architectures": [ARCHITECTURE],
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "model_type": "qwen3",
            "block_size": self.block_size,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)},
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "layer_types": list(self.layer_types),
            "use_sliding_window": self.sliding_window is not None,
            "sliding_window": self.sliding_window,
            "tie_word_embeddings": False,
            "vocab_size": self.vocab_size,
            "dtype": "bfloat16",
        }
        if self.num_target_layers is not None:
            cfg["num_target_layers"] = self.num_target_layers
        if self.is_causal is not None:
            cfg["is_causal"] = self.is_causal
        for key, default in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0),
                             ("final_logit_softcapping", None)):
            if getattr(self, key) != default:
                cfg["dflash_config"][key] = getattr(self, key)
        return cfg


PRESETS: dict[str, DFlashConfig] = {
    # z-lab/Qwen3.5-27B-DFlash, the draft for the qwen3.5-27b preset (sources in the module docstring).
    "dflash-qwen3.5-27b": DFlashConfig(
        name="dflash-qwen3.5-27b", hidden_size=5120, num_layers=5, intermediate_size=17408, vocab_size=248320,
        num_attention_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e7, block_size=16,
        mask_token_id=248070, target_layer_ids=(1, 16, 31, 46, 61), num_target_layers=64),
    # Not a published draft: the 27B draft's structure (5 layers, block 16, taps spread by build_target_layer_ids,
    # the target's vocabulary and mask token) at the qwen3.5-0.8b preset's width, so that the 0.8B target on the
    # device can run a draft network of proportionate cost (benchmarks, tests).
    "dflash-qwen3.5-0.8b": DFlashConfig(
        name="dflash-qwen3.5-0.8b", hidden_size=1024, num_layers=5, intermediate_size=3584, vocab_size=248320,
        num_attention_heads=8, num_kv_heads=2, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e7, block_size=16,
        mask_token_id=248070, target_layer_ids=build_target_layer_ids(24, 5), num_target_layers=24),
    # A draft for the "tiny" target preset (hidden 128, 4 layers, vocab 512): same structure, small dims.
    "dflash-tiny": DFlashConfig(
        name="dflash-tiny", hidden_size=128, num_layers=2, intermediate_size=256, vocab_size=512,
        num_attention_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6, rope_theta=1e7, block_size=16,
        mask_token_id=511, target_layer_ids=(1, 2), num_target_layers=4),
    # A draft for the "tiny-q" target preset (hidden 256, 8 layers, vocab 512; the quantised-target tests write it as
    # a Q4_K_M GGUF): same structure, taps spread by build_target_layer_ids(8, 2).
    "dflash-tiny-q": DFlashConfig(
        name="dflash-tiny-q", hidden_size=256, num_layers=2, intermediate_size=512, vocab_size=512,
        num_attention_heads=4, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=1e7, block_size=16,
        mask_token_id=511, target_layer_ids=build_target_layer_ids(8, 2), num_target_layers=8),
}


def read_json(path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from None


def is_dflash_config(cfg) -> bool:
    """Whether a parsed ``config.json`` describes a DFlash draft (rather than a Qwen3.5 target)."""
    if not isinstance(cfg, dict):
        return False
    archs = cfg.get("architectures")
    return "dflash_config" in cfg or (isinstance(archs, list) and any("DFlash" in str(a) for a in archs))


# ------------------------------------------------------------------------------------------------ loading


def load_dflash_directory(directory):
    """A draft's HF directory -> a :class:`~lucegen.model.checkpoint_base.SafetensorsCheckpoint` whose ``config`` is a
    :class:`DFlashConfig`; every tensor checked for presence, dtype and shape. Names may carry a ``model.`` prefix
    (stripped)."""
    from .checkpoint_base import read_safetensors_directory

    directory = Path(directory)
    config = DFlashConfig.from_file(directory / "config.json")
    expected = config.tensor_shapes()

    def internal(stored: str, path: Path) -> str:
        name = stored.removeprefix("model.")
        if name not in expected:
            raise CheckpointError(f"{path}: unexpected tensor {stored!r} for a {config.num_layers}-layer DFlash draft")
        return name

    return read_safetensors_directory(directory, config, internal, "draft tensor")

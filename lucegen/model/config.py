"""The Qwen3.5 text-model hyper-parameters: presets, reading a HF ``config.json`` and writing one back.

A :class:`ModelConfig` is everything a kernel or the reference needs to know about the model's shapes. It is built
from a preset name (``ModelConfig.preset("qwen3.5-0.8b")``), from a HF config dict (text config or the multimodal
wrapper with ``text_config``), or from GGUF metadata (see :mod:`lucegen.model.gguf_io`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import CheckpointError

LINEAR = "linear_attention"
FULL = "full_attention"
LAYER_TYPES = (LINEAR, FULL)


#: Physical ranges of the scalar hyper-parameters. The RMSNorm epsilon only guards a division (published models:
#: 1e-6 .. 1e-5); a RoPE base at or below 1 makes every frequency 1 or growing (published: 1e4 .. 1e7).
MAX_RMS_NORM_EPS = 1e-2
MIN_ROPE_THETA, MAX_ROPE_THETA = 1.0, 1e10


#: Decoder layers a config may declare: the deepest published models have 126 (Llama 3.1 405B); anything near the
#: bound is a damaged number, and reading it would build a table of that many layers.
MAX_LAYERS = 1024


def check_layer_count(layers, where: str) -> None:
    if isinstance(layers, int) and not isinstance(layers, bool) and not 0 < layers <= MAX_LAYERS:
        raise CheckpointError(f"{where}: {layers} layers is outside 1..{MAX_LAYERS}")


def read_layer_types(num_layers: int, full_attention_interval: int, where: str) -> tuple[str, ...]:
    """:func:`hybrid_layer_types` for the numbers a checkpoint states, each checked first (``where`` names the
    file; the fields are named as in a HF config)."""
    check_layer_count(num_layers, f"{where}num_hidden_layers")
    if not 0 < full_attention_interval <= MAX_LAYERS:
        raise CheckpointError(f"{where}full_attention_interval: {full_attention_interval} is outside 1..{MAX_LAYERS}")
    return hybrid_layer_types(num_layers, full_attention_interval)


def check_token_id(token, vocab_size: int, where: str) -> None:
    """A token id a checkpoint's metadata names (eos, pad) must lie in the vocabulary: ``where`` names the field."""
    if isinstance(token, int) and not isinstance(token, bool) and not 0 <= token < vocab_size:
        raise CheckpointError(f"{where}: {token} is not a token id of the {vocab_size}-token vocabulary")


def hybrid_layer_types(num_layers: int, full_attention_interval: int = 4) -> tuple[str, ...]:
    """Every ``full_attention_interval``-th layer (3, 7, 11, ... for 4) is full attention, the rest DeltaNet."""
    return tuple(FULL if (i + 1) % full_attention_interval == 0 else LINEAR for i in range(num_layers))


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    # gated full attention
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # RoPE covers the first rotary_dim dims of each head (partial_rotary_factor * head_dim)
    rope_theta: float
    rms_norm_eps: float
    # Gated DeltaNet
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    conv_kernel: int
    layer_types: tuple[str, ...]
    tie_word_embeddings: bool
    initializer_range: float = 0.02
    max_position_embeddings: int = 262144
    eos_token_id: int | None = None
    name: str = "custom"

    def __post_init__(self):
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self.validate("<config>")

    # ----------------------------------------------------------------------------------------- derived sizes
    @property
    def partial_rotary_factor(self) -> float:
        return self.rotary_dim / self.head_dim

    @property
    def linear_key_dim(self) -> int:  # all key heads together (q and k each)
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:  # channels of in_proj_qkv / conv1d: [q | k | v]
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def q_proj_dim(self) -> int:  # q_proj emits per head [query(head_dim) | gate(head_dim)]
        return 2 * self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of the text model, internal names (HF text-model names without prefix), in file order."""
        h = self.hidden_size
        shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (self.vocab_size, h)}
        for i, kind in enumerate(self.layer_types):
            p = f"layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            if kind == LINEAR:
                la = p + "linear_attn."
                shapes[la + "in_proj_qkv.weight"] = (self.conv_dim, h)
                shapes[la + "in_proj_z.weight"] = (self.linear_value_dim, h)
                shapes[la + "in_proj_b.weight"] = (self.linear_num_value_heads, h)
                shapes[la + "in_proj_a.weight"] = (self.linear_num_value_heads, h)
                shapes[la + "conv1d.weight"] = (self.conv_dim, 1, self.conv_kernel)
                shapes[la + "dt_bias"] = (self.linear_num_value_heads,)
                shapes[la + "A_log"] = (self.linear_num_value_heads,)
                shapes[la + "norm.weight"] = (self.linear_value_head_dim,)
                shapes[la + "out_proj.weight"] = (h, self.linear_value_dim)
            else:
                sa = p + "self_attn."
                shapes[sa + "q_proj.weight"] = (self.q_proj_dim, h)
                shapes[sa + "k_proj.weight"] = (self.kv_dim, h)
                shapes[sa + "v_proj.weight"] = (self.kv_dim, h)
                shapes[sa + "o_proj.weight"] = (h, self.num_attention_heads * self.head_dim)
                shapes[sa + "q_norm.weight"] = (self.head_dim,)
                shapes[sa + "k_norm.weight"] = (self.head_dim,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "mlp.gate_proj.weight"] = (self.intermediate_size, h)
            shapes[p + "mlp.up_proj.weight"] = (self.intermediate_size, h)
            shapes[p + "mlp.down_proj.weight"] = (h, self.intermediate_size)
        shapes["norm.weight"] = (h,)
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        return shapes

    def num_parameters(self) -> int:
        total = 0
        for shape in self.tensor_shapes().values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    # ----------------------------------------------------------------------------------------- validation
    def validate(self, source) -> None:
        def bad(key, reason):
            raise CheckpointError(f"{source}: {key}: {reason}")

        for key in ("hidden_size", "num_layers", "intermediate_size", "vocab_size", "num_attention_heads",
                    "num_kv_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                    "linear_key_head_dim", "linear_value_head_dim", "conv_kernel"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                bad(key, f"must be a positive integer, got {value!r}")
        if len(self.layer_types) != self.num_layers:
            bad("layer_types", f"has {len(self.layer_types)} entries for {self.num_layers} layers")
        for i, t in enumerate(self.layer_types):
            if t not in LAYER_TYPES:
                bad(f"layer_types[{i}]", f"unknown layer type {t!r} (expected one of {', '.join(LAYER_TYPES)})")
        if self.num_attention_heads % self.num_kv_heads:
            bad("num_key_value_heads", f"{self.num_kv_heads} does not divide {self.num_attention_heads} q heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            bad("linear_num_value_heads",
                f"{self.linear_num_value_heads} is not a multiple of {self.linear_num_key_heads} key heads")
        if not (0 < self.rotary_dim <= self.head_dim) or self.rotary_dim % 2:
            bad("partial_rotary_factor", f"rotary dim {self.rotary_dim} must be even and in (0, {self.head_dim}]")
        if not 0 < self.rms_norm_eps <= MAX_RMS_NORM_EPS:
            bad("rms_norm_eps", f"must be in (0, {MAX_RMS_NORM_EPS:g}], got {self.rms_norm_eps!r}")
        if not MIN_ROPE_THETA < self.rope_theta <= MAX_ROPE_THETA:
            bad("rope_theta", f"must be in ({MIN_ROPE_THETA:g}, {MAX_ROPE_THETA:g}], got {self.rope_theta!r}")
        if not 0 < self.initializer_range < 1:
            bad("initializer_range", f"must be in (0, 1), got {self.initializer_range!r}")
        if not isinstance(self.max_position_embeddings, int) or self.max_position_embeddings < 2:
            bad("max_position_embeddings", f"must be an integer of at least 2, got {self.max_position_embeddings!r}")

    # ----------------------------------------------------------------------------------------- constructors
    @classmethod
    def preset(cls, name: str) -> ModelConfig:
        try:
            return PRESETS[name]
        except KeyError:
            raise CheckpointError(f"unknown model preset {name!r} (known: {', '.join(PRESETS)})") from None

    @classmethod
    def from_hf_config(cls, cfg: dict, source="config.json") -> ModelConfig:
        """From a HF config dict: ``Qwen3_5TextConfig`` (``qwen3_5_text``) or the multimodal ``Qwen3_5Config``
        (``qwen3_5``) whose text part is under ``text_config``. ``source`` names the file in error messages."""
        if not isinstance(cfg, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
        if isinstance(cfg.get("text_config"), dict):
            text = dict(cfg["text_config"])
            prefix = "text_config."
            text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        else:
            text, prefix = cfg, ""
        model_type = text.get("model_type", cfg.get("model_type"))
        if model_type is not None and model_type not in ("qwen3_5_text", "qwen3_5"):
            raise CheckpointError(f"{source}: {prefix}model_type: {model_type!r} is not a Qwen3.5 model "
                                  "(expected 'qwen3_5_text' or 'qwen3_5')")

        def get(key, default=dataclasses.MISSING):
            if key in text:
                return text[key]
            if default is dataclasses.MISSING:
                raise CheckpointError(f"{source}: {prefix}{key}: missing")
            return default

        def integer(key, default=dataclasses.MISSING):
            value = get(key, default)
            if not isinstance(value, int) or isinstance(value, bool):
                raise CheckpointError(f"{source}: {prefix}{key}: expected an integer, got {value!r}")
            return value

        def number(value, key):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise CheckpointError(f"{source}: {prefix}{key}: expected a number, got {value!r}")
            return float(value)

        num_layers = integer("num_hidden_layers")
        check_layer_count(num_layers, f"{source}: {prefix}num_hidden_layers")
        layer_types = text.get("layer_types")
        if layer_types is None:
            layer_types = read_layer_types(num_layers, integer("full_attention_interval", 4), f"{source}: {prefix}")
        if not isinstance(layer_types, (list, tuple)):
            raise CheckpointError(f"{source}: {prefix}layer_types: expected a list, got {layer_types!r}")
        for i, t in enumerate(layer_types):
            if t not in LAYER_TYPES:
                raise CheckpointError(f"{source}: {prefix}layer_types[{i}]: unknown layer type {t!r} "
                                      f"(expected one of {', '.join(LAYER_TYPES)})")
        rope = text.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise CheckpointError(f"{source}: {prefix}rope_parameters: expected an object, got {rope!r}")
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise CheckpointError(f"{source}: {prefix}rope_parameters.rope_type: {rope_type!r} is not supported "
                                  "(only 'default')")
        rope_theta = number(rope.get("rope_theta", text.get("rope_theta", 10000.0)), "rope_parameters.rope_theta")
        partial = number(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)),
                         "rope_parameters.partial_rotary_factor")
        head_dim = integer("head_dim", 256)
        eos = text.get("eos_token_id", cfg.get("eos_token_id"))
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        check_token_id(eos, integer("vocab_size"), f"{source}: {prefix}eos_token_id")
        try:
            return cls(
                hidden_size=integer("hidden_size"),
                num_layers=num_layers,
                intermediate_size=integer("intermediate_size"),
                vocab_size=integer("vocab_size"),
                num_attention_heads=integer("num_attention_heads"),
                num_kv_heads=integer("num_key_value_heads"),
                head_dim=head_dim,
                rotary_dim=int(head_dim * partial),
                rope_theta=rope_theta,
                rms_norm_eps=number(get("rms_norm_eps", 1e-6), "rms_norm_eps"),
                linear_num_key_heads=integer("linear_num_key_heads"),
                linear_num_value_heads=integer("linear_num_value_heads"),
                linear_key_head_dim=integer("linear_key_head_dim"),
                linear_value_head_dim=integer("linear_value_head_dim"),
                conv_kernel=integer("linear_conv_kernel_dim", 4),
                layer_types=tuple(layer_types),
                tie_word_embeddings=bool(get("tie_word_embeddings", False)),
                initializer_range=number(get("initializer_range", 0.02), "initializer_range"),
                max_position_embeddings=integer("max_position_embeddings", 262144),
                eos_token_id=eos if isinstance(eos, int) else None,
                name=str(cfg.get("_name_or_path") or "custom"),
            )
        except CheckpointError as exc:  # validate() names the key; add the file
            raise CheckpointError(str(exc).replace("<config>", f"{source}", 1)) from None

    @classmethod
    def from_file(cls, path) -> ModelConfig:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
        return cls.from_hf_config(data, source=path)

    def to_hf_config(self) -> dict:
        """The ``config.json`` of a text-only ``Qwen3_5ForCausalLM`` checkpoint."""
        return {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "rms_norm_eps": self.rms_norm_eps,
            "use_cache": True,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
            "attention_bias": False,
            "attention_dropout": 0.0,
            "linear_conv_kernel_dim": self.conv_kernel,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "layer_types": list(self.layer_types),
            "eos_token_id": self.eos_token_id,
            "dtype": "bfloat16",
        }


def _preset(name, num_layers, **kw) -> ModelConfig:
    return ModelConfig(name=name, num_layers=num_layers, layer_types=hybrid_layer_types(num_layers), **kw)


PRESETS: dict[str, ModelConfig] = {
    # Qwen/Qwen3.5-0.8B (text part of its config.json): about 752 M parameters, tied embeddings.
    "qwen3.5-0.8b": _preset(
        "qwen3.5-0.8b", 24, hidden_size=1024, intermediate_size=3584, vocab_size=248320,
        num_attention_heads=8, num_kv_heads=2, head_dim=256, rotary_dim=64, rope_theta=1e7, rms_norm_eps=1e-6,
        linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        conv_kernel=4, tie_word_embeddings=True, eos_token_id=248044),
    # Qwen/Qwen3.5-27B, text_config of the official config.json: hidden 5120, 64 layers, intermediate 17408,
    # 24 q / 4 kv heads of 256, linear_num_key_heads 16, linear_num_value_heads 48, key/value head dim 128,
    # conv 4, rope_theta 1e7, partial_rotary_factor 0.25, tie_word_embeddings false. Source: the config as mirrored
    # verbatim in public code (e.g. THUDM/slime scripts/models/qwen3.5-27B.sh for the attention figures; several
    # copies of the HF text_config agree on the DeltaNet head counts 16 key / 48 value).
    "qwen3.5-27b": _preset(
        "qwen3.5-27b", 64, hidden_size=5120, intermediate_size=17408, vocab_size=248320,
        num_attention_heads=24, num_kv_heads=4, head_dim=256, rotary_dim=64, rope_theta=1e7, rms_norm_eps=1e-6,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        conv_kernel=4, tie_word_embeddings=False, eos_token_id=248044),
    # Tiny models for fast tests: the 3:1 layer pattern, small dims, real structure. Dims are multiples of 32 so
    # that kernels tiled for warps/blocks run on them unchanged.
    "tiny": _preset(
        "tiny", 4, hidden_size=128, intermediate_size=256, vocab_size=512,
        num_attention_heads=4, num_kv_heads=2, head_dim=64, rotary_dim=16, rope_theta=1e7, rms_norm_eps=1e-6,
        linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        conv_kernel=4, tie_word_embeddings=True, eos_token_id=1),
    # As tiny, but DeltaNet value heads = 2 x key heads (the 27B's repeat_interleave path), untied lm_head, 8 layers.
    "tiny-gqa": _preset(
        "tiny-gqa", 8, hidden_size=128, intermediate_size=384, vocab_size=512,
        num_attention_heads=4, num_kv_heads=1, head_dim=64, rotary_dim=16, rope_theta=1e7, rms_norm_eps=1e-6,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=64,
        conv_kernel=4, tie_word_embeddings=False, eos_token_id=1),
    # As tiny-gqa with every matrix dimension a multiple of 256: quantisable to K-quants (the Q4_K_M GGUF path).
    "tiny-q": _preset(
        "tiny-q", 8, hidden_size=256, intermediate_size=512, vocab_size=512,
        num_attention_heads=4, num_kv_heads=1, head_dim=64, rotary_dim=16, rope_theta=1e7, rms_norm_eps=1e-6,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=64,
        conv_kernel=4, tie_word_embeddings=False, eos_token_id=1),
}

"""GGUF files in llama.cpp's ``qwen35`` layout: a bounds-checked reader of our own (no ``gguf`` package needed to
load); :mod:`lucegen.model.init_gguf` writes random-weight files in this layout.

llama.cpp's converter (``convert_hf_to_gguf.py``, Qwen3NextModel / _LinearAttentionVReorderBase /
Qwen3_5TextModel) changes some tensors on the way in; the loader undoes each change, the writer applies it:
- the (1 + w) RMSNorm weights (attn_norm, post_attention_norm, output_norm, attn_q_norm, attn_k_norm) are stored
  as 1 + w; the gated DeltaNet norm (ssm_norm) is stored as is
- A_log is stored as ssm_a = -exp(A_log); dt_bias as ssm_dt.bias; conv1d [C, 1, K] squeezed to [C, K]
- with more value heads than key heads, DeltaNet value heads go from HF's grouped order (key head g serves value
  heads g*r .. g*r+r-1) to ggml's tiled order (value head v*G + g): the V rows of attn_qkv, the rows of attn_gate,
  ssm_alpha, ssm_beta, the entries of ssm_a and ssm_dt, the V channels of ssm_conv1d, the columns of ssm_out.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .checkpoint_base import Checkpoint
from .config import ModelConfig, check_token_id, read_layer_types
from .quant import READABLE, TYPE_BY_ID, TYPES, dequantize, nbytes

ARCH = "qwen35"
GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF metadata value types
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_DIMS = 4

# internal tensor name suffix -> GGUF name suffix (per layer) / whole-model names
GLOBAL_NAMES = {"embed_tokens.weight": "token_embd.weight", "norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight", "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a", "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
}
ONE_PLUS_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
                  "self_attn.k_norm.weight")


def gguf_name(name: str, global_names: dict = GLOBAL_NAMES, layer_names: dict = LAYER_NAMES) -> str:
    """The GGUF name of tensor ``name`` (an internal name: ``layers.<i>.<rest>`` or a global one) under the given
    tables (the text model's by default); KeyError for a name they do not hold."""
    if name in global_names:
        return global_names[name]
    m = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    if not m or m.group(2) not in layer_names:
        raise KeyError(name)
    return f"blk.{m.group(1)}.{layer_names[m.group(2)]}"


# ------------------------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class GGUFTensor:
    name: str
    type_name: str
    shape: tuple[int, ...]  # numpy order (ggml ne reversed): rows first
    offset: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """Header, metadata and tensor directory of a GGUF file, every offset and length checked against the file."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            self.size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                self._map = np.memmap(f, dtype=np.uint8, mode="r") if self.size else np.zeros(0, np.uint8)
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        self.pos = 0
        self.metadata: dict = {}
        self.tensors: dict[str, GGUFTensor] = {}
        self._parse()

    def _fail(self, reason):
        return CheckpointError(f"{self.path}: {reason}")

    def _take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise self._fail(f"truncated while reading {what} at byte {self.pos} (file has {self.size} bytes)")
        data = bytes(self._map[self.pos : self.pos + n])
        self.pos += n
        return data

    def _scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self._take(struct.calcsize(fmt), what))[0]

    def _string(self, what: str) -> str:
        n = self._scalar("<Q", what)
        raw = self._take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail(f"{what}: not valid UTF-8") from None

    def _value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALARS:
            return self._scalar(_SCALARS[vtype], what)
        if vtype == _STRING:
            return self._string(what)
        if vtype == _ARRAY:
            if depth > 2:
                raise self._fail(f"{what}: arrays nested too deeply")
            item_type = self._scalar("<I", what)
            count = self._scalar("<Q", what)
            if item_type in _SCALARS:  # read numeric arrays in one go
                fmt = _SCALARS[item_type]
                size = struct.calcsize(fmt)
                if count * size > self.size - self.pos:
                    raise self._fail(f"{what}: array of {count} items runs past the end of the file")
                return np.frombuffer(self._take(count * size, what), dtype=np.dtype(fmt)).tolist()
            if item_type not in (_STRING, _ARRAY):
                raise self._fail(f"{what}: unknown array item type {item_type}")
            if count > self.size - self.pos:  # every item takes at least one byte
                raise self._fail(f"{what}: array of {count} items runs past the end of the file")
            return [self._value(item_type, what, depth + 1) for _ in range(count)]
        raise self._fail(f"{what}: unknown value type {vtype}")

    def _parse(self):
        if self._take(4, "the magic") != GGUF_MAGIC:
            raise self._fail("not a GGUF file (bad magic)")
        version = self._scalar("<I", "the version")
        if version not in (2, 3):
            raise self._fail(f"unsupported GGUF version {version}")
        n_tensors = self._scalar("<Q", "the tensor count")
        n_kv = self._scalar("<Q", "the metadata count")
        if n_tensors > self.size or n_kv > self.size:
            raise self._fail(f"header claims {n_tensors} tensors and {n_kv} metadata keys, more than the file holds")
        for i in range(n_kv):
            key = self._string(f"metadata key #{i}")
            vtype = self._scalar("<I", f"metadata {key!r}")
            if key in self.metadata:
                raise self._fail(f"metadata {key!r} appears twice")
            self.metadata[key] = self._value(vtype, f"metadata {key!r}")
        infos = []
        for i in range(n_tensors):
            name = self._string(f"tensor name #{i}")
            n_dims = self._scalar("<I", f"tensor {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise self._fail(f"tensor {name!r}: {n_dims} dimensions")
            ne = [self._scalar("<Q", f"tensor {name!r}") for _ in range(n_dims)]
            type_id = self._scalar("<I", f"tensor {name!r}")
            offset = self._scalar("<Q", f"tensor {name!r}")
            if name in self.tensors or any(name == t[0] for t in infos):
                raise self._fail(f"tensor {name!r} appears twice")
            infos.append((name, ne, type_id, offset))
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise self._fail(f"metadata 'general.alignment': {alignment!r} is not a power of two")
        data_start = -(-self.pos // alignment) * alignment
        spans = []
        tiled = 0  # where the next tensor's data must start: the tensors before it, each padded to the alignment
        for name, ne, type_id, offset in infos:
            type_name = TYPE_BY_ID.get(type_id)
            if type_name is None:
                raise self._fail(f"tensor {name!r}: unknown ggml type {type_id}")
            n_values = 1
            for d in ne:
                n_values *= d
            block = TYPES[type_name][1]
            if ne[0] % block:
                raise self._fail(f"tensor {name!r}: row length {ne[0]} is not a multiple of the {type_name} "
                                 f"block size {block}")
            size = nbytes(type_name, n_values)
            start = data_start + offset
            if offset % alignment or start + size > self.size:
                raise self._fail(f"tensor {name!r}: data at offset {offset} (+{size} bytes) lies outside the file "
                                 f"or is misaligned (truncated file?)")
            spans.append((start, start + size, name))
            self.tensors[name] = GGUFTensor(name, type_name, tuple(reversed(ne)), start, size)
            if offset != tiled:
                raise self._fail(_tiling_error(name, type_name, ne, size, offset, tiled))
            tiled += -(-size // alignment) * alignment
        spans.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
            if s1 < e0 and s1 != e1:
                raise self._fail(f"tensor {n1!r}: data overlaps tensor {n0!r}")
        if infos and self.size > data_start + tiled:
            name, ne, type_id, _ = infos[-1]
            raise self._fail(f"{self.size - data_start - tiled} bytes after the data of the last tensor {name!r} "
                             f"({TYPE_BY_ID[type_id]} {list(reversed(ne))}): its declared type or shape does not "
                             f"match its data")

    def raw(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return self._map[t.offset : t.offset + t.nbytes]

    def values(self, name: str) -> np.ndarray:
        """float32 values in numpy order."""
        t = self.tensors[name]
        if t.type_name not in READABLE:
            raise CheckpointError(f"{self.path}: tensor {name!r}: type {t.type_name} is not supported "
                                  f"(readable: {', '.join(READABLE)})")
        n = int(np.prod(t.shape, dtype=np.int64))
        return dequantize(self.raw(name), t.type_name, n).reshape(t.shape)


def _tiling_error(name: str, type_name: str, ne: list[int], size: int, offset: int, tiled: int) -> str:
    """The message for a tensor whose data does not start where the tensors before it end (llama.cpp's rule: in
    directory order, each tensor's data follows the previous one's, padded to the alignment), which is what a tensor
    relabelled to a type or shape of another byte size looks like."""
    where = "the first tensor's data starts at offset 0" if tiled == 0 else f"the tensors before it end at {tiled}"
    return (f"tensor {name!r}: data at offset {offset}, but {where} ({type_name} {list(reversed(ne))} is {size} "
            f"bytes): a declared type or shape does not match the data")


# ------------------------------------------------------------------------------------------------ config
def config_from_gguf(g: GGUFFile) -> ModelConfig:
    meta = g.metadata

    def get(key, kind=int, default=None):
        full = f"{ARCH}.{key}"
        if full not in meta:
            if default is not None:
                return default
            raise CheckpointError(f"{g.path}: metadata {full!r}: missing")
        value = meta[full]
        if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
            raise CheckpointError(f"{g.path}: metadata {full!r}: expected an integer, got {value!r}")
        if kind is float and not isinstance(value, (int, float)):
            raise CheckpointError(f"{g.path}: metadata {full!r}: expected a number, got {value!r}")
        if kind is float:  # stored as float32: take the shortest decimal that rounds to it (1e-06, not 9.99e-07)
            return float(str(np.float32(value)))
        return value

    arch = meta.get("general.architecture")
    if arch != ARCH:
        raise CheckpointError(f"{g.path}: metadata 'general.architecture': {arch!r} is not {ARCH!r} (Qwen3.5)")
    n_blocks = get("block_count")
    n_layers = n_blocks - get("nextn_predict_layers", int, 0)  # MTP blocks come last
    layer_types = read_layer_types(n_layers, get("full_attention_interval", int, 4), f"{g.path}: metadata ")
    value_heads = get("ssm.time_step_rank")
    inner = get("ssm.inner_size")
    if value_heads <= 0 or inner % value_heads:
        raise CheckpointError(f"{g.path}: metadata '{ARCH}.ssm.inner_size': {inner} is not a multiple of "
                              f"time_step_rank {value_heads}")
    if "token_embd.weight" not in g.tensors:
        raise CheckpointError(f"{g.path}: missing tensor 'token_embd.weight'")
    vocab = g.tensors["token_embd.weight"].shape[0]
    eos = meta.get("tokenizer.ggml.eos_token_id")
    check_token_id(eos, vocab, f"{g.path}: metadata 'tokenizer.ggml.eos_token_id'")
    try:
        return ModelConfig(
            hidden_size=get("embedding_length"), num_layers=n_layers, intermediate_size=get("feed_forward_length"),
            vocab_size=vocab, num_attention_heads=get("attention.head_count"),
            num_kv_heads=get("attention.head_count_kv"), head_dim=get("attention.key_length"),
            rotary_dim=get("rope.dimension_count"), rope_theta=float(get("rope.freq_base", float)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", float)),
            linear_num_key_heads=get("ssm.group_count"), linear_num_value_heads=value_heads,
            linear_key_head_dim=get("ssm.state_size"), linear_value_head_dim=inner // value_heads,
            conv_kernel=get("ssm.conv_kernel"),
            layer_types=layer_types,
            tie_word_embeddings="output.weight" not in g.tensors,
            max_position_embeddings=get("context_length", int, 262144),
            eos_token_id=eos if isinstance(eos, int) else None, name=str(meta.get("general.name", "gguf")))
    except CheckpointError as exc:
        raise CheckpointError(str(exc).replace("<config>", f"{g.path}: metadata", 1)) from None


# ------------------------------------------------------------------------------------------------ transforms
def v_head_order(config: ModelConfig, head_dim: int, to_tiled: bool) -> np.ndarray:
    """Row permutation between HF's grouped and ggml's tiled value-head order (rows of head_dim each)."""
    g, r = config.linear_num_key_heads, config.linear_num_value_heads // config.linear_num_key_heads
    heads = np.arange(g * r).reshape(g, r)  # grouped index of (key group, repeat)
    tiled = heads.T.reshape(-1)  # tiled position p holds grouped head tiled[p]
    order = tiled if to_tiled else np.argsort(tiled)
    return (order[:, None] * head_dim + np.arange(head_dim)[None, :]).reshape(-1)


def to_gguf_layout(config: ModelConfig, name: str, x: np.ndarray) -> np.ndarray:
    """Internal float32 tensor -> the tensor llama.cpp's converter would store (numpy order)."""
    return _transform(config, name, x, forward=True)


def from_gguf_layout(config: ModelConfig, name: str, x: np.ndarray) -> np.ndarray:
    return _transform(config, name, x, forward=False)


def _transform(config, name, x, forward):
    leaf = name.split(".", 2)[-1] if name.startswith("layers.") else name
    x = np.asarray(x, dtype=np.float32)
    if leaf in ONE_PLUS_NORMS or name == "norm.weight":
        return x + np.float32(1) if forward else x - np.float32(1)
    if not leaf.startswith("linear_attn."):
        return x
    if leaf == "linear_attn.A_log":
        x = -np.exp(x) if forward else np.log(-x)
    elif leaf == "linear_attn.conv1d.weight":
        x = x[:, 0, :] if forward else x[:, None, :]
    grouped = config.linear_num_value_heads != config.linear_num_key_heads
    if not grouped:
        return x.astype(np.float32)
    dv, kd = config.linear_value_head_dim, config.linear_key_dim
    if leaf in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
        v = x[2 * kd :]
        x = np.concatenate([x[: 2 * kd], v[v_head_order(config, dv, forward)]])
    elif leaf == "linear_attn.in_proj_z.weight":
        x = x[v_head_order(config, dv, forward)]
    elif leaf in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight", "linear_attn.A_log",
                  "linear_attn.dt_bias"):
        x = x[v_head_order(config, 1, forward)]
    elif leaf == "linear_attn.out_proj.weight":
        x = x[:, v_head_order(config, dv, forward)]
    return np.ascontiguousarray(x, dtype=np.float32)


# ------------------------------------------------------------------------------------------------ checkpoint
class GGUFStoredCheckpoint(Checkpoint):
    """The tensors of a GGUF file under internal names (``where``: internal name -> GGUF name), values as stored
    (numpy order, rows first); ``gguf_tensor(name)`` gives the stored tensor and its raw bytes."""

    def __init__(self, path: Path, g: GGUFFile, config, where: dict[str, str]):
        self.path, self.file, self.config, self.where = path, g, config, where

    def names(self):
        return list(self.where)

    def _tensor(self, name) -> GGUFTensor:
        if name not in self.where:
            raise self._unknown(name)
        return self.file.tensors[self.where[name]]

    def shape(self, name):
        self._tensor(name)
        return self.config.tensor_shapes()[name]

    def dtype(self, name):
        return self._tensor(name).type_name

    def gguf_tensor(self, name) -> tuple[GGUFTensor, np.ndarray]:
        t = self._tensor(name)
        return t, self.file.raw(t.name)

    def f32(self, name):
        return np.ascontiguousarray(self.file.values(self._tensor(name).name), np.float32)


class GGUFCheckpoint(GGUFStoredCheckpoint):
    """A ``qwen35`` GGUF: values in HF's layout (llama.cpp's changes undone, see the module docstring);
    ``gguf_tensor`` gives them as stored."""

    def __init__(self, path: Path, g: GGUFFile, config: ModelConfig):
        super().__init__(path, g, config, {name: gguf_name(name) for name in config.tensor_shapes()})

    def f32(self, name):
        return from_gguf_layout(self.config, name, super().f32(name))


def load_gguf(path) -> GGUFCheckpoint:
    path = Path(path)
    g = GGUFFile(path)
    config = config_from_gguf(g)
    expected = config.tensor_shapes()
    wanted = {}
    for name, shape in expected.items():
        gname = gguf_name(name)
        if gname not in g.tensors:
            raise CheckpointError(f"{path}: missing tensor {gname!r} ({name})")
        stored = g.tensors[gname].shape
        want = shape
        if name.endswith("linear_attn.conv1d.weight"):
            want = (shape[0], shape[2])
        if stored != want:
            raise CheckpointError(f"{path}: tensor {gname!r}: shape {list(stored)}, metadata implies {list(want)}")
        if g.tensors[gname].type_name not in READABLE:
            raise CheckpointError(f"{path}: tensor {gname!r}: type {g.tensors[gname].type_name} is not supported "
                                  f"(readable: {', '.join(READABLE)})")
        wanted[gname] = name
    for gname in g.tensors:
        if gname in wanted:
            continue
        m = re.match(r"blk\.(\d+)\.", gname)
        if m and int(m.group(1)) >= config.num_layers:
            continue  # MTP (nextn) blocks
        raise CheckpointError(f"{path}: unexpected tensor {gname!r} for this config")
    return GGUFCheckpoint(path, g, config)

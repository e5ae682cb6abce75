"""GGUF files in llama.cpp's ``qwen35`` layout: a bounds-checked reader of our own (no ``gguf`` package needed to
load) and a streaming writer (``gguf.GGUFWriter``, imported lazily).

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
from .checkpoint import Checkpoint
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


# ------------------------------------------------------------------------------------------------ writing
def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of layers that get more bits in the _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_types(config: ModelConfig) -> dict[str, str]:
    """llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_M recipe (llama_tensor_get_type) for a qwen35 model: Q4_K by default;
    output (token_embd when tied) Q6_K; attn_v and ffn_down Q6_K in the use_more_bits layers; attn_qkv Q5_K;
    1-D tensors, norms and ssm_conv1d stay F32. A row length not divisible by 256 falls back as llama.cpp does
    (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0; F16 if not divisible by 32)."""
    fallback = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
    types = {}
    n_v = len(config.full_attention_layers)
    i_v = 0
    for name, shape in config.tensor_shapes().items():
        g = gguf_name(name)
        if len(shape) < 2 or not g.endswith("weight") or "_norm.weight" in g or "ssm_conv1d" in g:
            types[name] = "F32"
            continue
        kind = "Q4_K"
        if g == "output.weight" or (config.tie_word_embeddings and g == "token_embd.weight"):
            kind = "Q6_K" if shape[1] % 256 == 0 else "Q8_0"
        elif g.endswith("attn_v.weight"):
            kind = "Q6_K" if use_more_bits(i_v, n_v) else "Q4_K"
            i_v += 1
        elif g.endswith("ffn_down.weight"):
            kind = "Q6_K" if use_more_bits(int(g.split(".")[1]), config.num_layers) else "Q4_K"
        elif g.endswith("attn_qkv.weight"):
            kind = "Q5_K"
        if shape[-1] % TYPES[kind][1]:
            kind = fallback.get(kind, kind)
            if shape[-1] % TYPES[kind][1]:
                kind = "F16"
        types[name] = kind
    return types


def tensor_types(config: ModelConfig, quant: str) -> dict[str, str]:
    if quant == "q4_k_m":
        return q4_k_m_types(config)
    base = {"bf16": "BF16", "f16": "F16", "f32": "F32", "q8_0": "Q8_0", "q4_0": "Q4_0"}[quant]
    out = {}
    for name, shape in config.tensor_shapes().items():
        g = gguf_name(name)
        small = len(shape) < 2 or "_norm.weight" in g or "ssm_conv1d" in g
        kind = "F32" if small else base
        if shape[-1] % TYPES[kind][1]:
            kind = "F16"
        out[name] = kind
    return out


FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "bf16": 32}  # llama_ftype


def random_k_blocks(rng: np.random.Generator, type_name: str, n_blocks: int, std: float) -> np.ndarray:
    """Valid random blocks of a K-quant (or Q8_0) whose values have mean ~0 and standard deviation ~std: random
    quants, 6-bit sub-scales in 32..63, super-scales set so the values are centred. For files too large to
    quantise from floats in reasonable time (27B)."""
    size = TYPES[type_name][2]
    blocks = np.frombuffer(rng.bytes(n_blocks * size), np.uint8).reshape(n_blocks, size).copy()
    if type_name in ("Q4_K", "Q5_K"):
        nmax = 15 if type_name == "Q4_K" else 31
        sc = rng.integers(32, 64, size=(n_blocks, 8), dtype=np.uint8)
        # x = d*sc*q - dmin*m with q ~ U{0..nmax}: std = d*sc*sqrt(((nmax+1)^2-1)/12); centre with dmin*m = d*sc*nmax/2
        d = np.float32(std / (47.5 * np.sqrt(((nmax + 1) ** 2 - 1) / 12)))
        blocks[:, 0:2] = np.full((n_blocks, 1), d, np.float16).view(np.uint8)
        blocks[:, 2:4] = np.full((n_blocks, 1), d * nmax / 2, np.float16).view(np.uint8)
        from .quant import pack_k_scales

        blocks[:, 4:16] = pack_k_scales(sc, sc)
    elif type_name == "Q6_K":
        scales = rng.integers(64, 128, size=(n_blocks, 16), dtype=np.int8)
        blocks[:, 192:208] = scales.view(np.uint8)
        blocks[:, 208:210] = np.full((n_blocks, 1), std / (96 * 18.5), np.float16).view(np.uint8)
    elif type_name == "Q8_0":
        blocks[:, 0:2] = np.full((n_blocks, 1), std / 73.6, np.float16).view(np.uint8)
    else:
        raise ValueError(f"no random-block generator for {type_name}")
    return blocks.reshape(-1)


def write_gguf_checkpoint(config: ModelConfig, out, quant: str = "bf16", seed: int = 0, progress: bool = True,
                          draw_blocks: bool | None = None) -> float:
    """Random weights (same values as the safetensors writer for the same seed) as a qwen35 GGUF with the
    generated tokenizer embedded. Streams tensor by tensor into a temp file, then renames it. ``draw_blocks``
    (default: for models over 4 B parameters with a K-quant mix) draws K-quant blocks directly instead of
    quantising the float init."""
    import gguf

    from .init_weights import Progress, checkpoint_config, init_tensor_f32, tensor_rng
    from .quant import quantize
    from ..atomic import atomic_path
    from .tokenizer import SPECIAL_TOKENS, build_tokenizer

    out = Path(out)
    config = checkpoint_config(config)
    types = tensor_types(config, quant)
    if draw_blocks is None:
        draw_blocks = quant == "q4_k_m" and config.num_parameters() > 4e9
    shapes = config.tensor_shapes()

    with atomic_path(out) as tmp:
        writer = gguf.GGUFWriter(tmp, ARCH)
        writer.add_name(config.name)
        writer.add_file_type(FILE_TYPES[quant])
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_block_count(config.num_layers)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_kv_heads)
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_rope_freq_base(config.rope_theta)
        writer.add_rope_dimension_count(config.rotary_dim)
        writer.add_rope_dimension_sections([11, 11, 10, 0])
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        writer.add_ssm_conv_kernel(config.conv_kernel)
        writer.add_ssm_state_size(config.linear_key_head_dim)
        writer.add_ssm_group_count(config.linear_num_key_heads)
        writer.add_ssm_time_step_rank(config.linear_num_value_heads)
        writer.add_ssm_inner_size(config.linear_value_dim)
        writer.add_full_attention_interval(4)
        _add_tokenizer(writer, build_tokenizer(config.vocab_size), config.vocab_size, SPECIAL_TOKENS)

        for name, shape in shapes.items():
            stored = (shape[0], shape[2]) if name.endswith("conv1d.weight") else shape
            n = int(np.prod(stored, dtype=np.int64))
            kind = types[name]
            writer.add_tensor_info(gguf_name(name), stored, np.dtype(np.float32), nbytes(kind, n),
                                   raw_dtype=gguf.GGMLQuantizationType[kind])
        bar = Progress(sum(nbytes(types[n], int(np.prod(s, dtype=np.int64))) for n, s in shapes.items()),
                       f"writing {out}") if progress else None
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, shape in shapes.items():
            kind = types[name]
            if draw_blocks and kind in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"):
                n = int(np.prod(shape, dtype=np.int64))
                data = random_k_blocks(tensor_rng(seed, name), kind, n // TYPES[kind][1], config.initializer_range)
            else:
                data = quantize(to_gguf_layout(config, name, init_tensor_f32(config, name, seed)), kind)
            writer.write_tensor_data(data)
            if bar:
                bar(data.nbytes)
        writer.close()
    return bar.finish() if bar else 0.0


def _add_tokenizer(writer, tok, vocab_size: int, specials) -> None:
    """gpt2-style BPE vocabulary padded to the model's vocab_size (as llama.cpp's converter pads)."""
    import gguf

    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if by_id[i] in specials else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    import json

    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab[specials[0]])
    writer.add_pad_token_id(vocab[specials[0]])
    writer.add_add_bos_token(False)


def tokenizer_from_gguf(path):
    """Rebuild a byte-level BPE tokenizer from a GGUF's tokenizer.ggml.* metadata."""
    from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    from .tokenizer import Tokenizer

    g = GGUFFile(path)
    meta = g.metadata
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.model': {meta.get('tokenizer.ggml.model')!r} "
                              "is not a byte-level BPE ('gpt2')")
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    merges = meta.get("tokenizer.ggml.merges", [])
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.tokens': missing or not a list of strings")
    if types is None:
        types = [1] * len(tokens)
    if (not isinstance(types, list) or len(types) != len(tokens)
            or not all(isinstance(k, int) and not isinstance(k, bool) for k in types)):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.token_type': not one integer per token "
                              f"({len(tokens)} tokens)")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.merges': not a list of strings")
    vocab = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k != 5}  # 5: UNUSED padding
    pairs = [tuple(m.split(" ", 1)) for m in merges if " " in m]
    try:  # the tokenizers library raises plain Exceptions (a merge of tokens not in the vocabulary, ...)
        inner = HFTokenizer(models.BPE(vocab=vocab, merges=pairs))
        inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        inner.decoder = decoders.ByteLevel()
        inner.add_special_tokens([AddedToken(t, special=True) for t, k in zip(tokens, types) if k == 3])
    except Exception as exc:
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.*' does not form a BPE tokenizer: {exc}") from None
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return Tokenizer(inner, path, eos if isinstance(eos, int) else None)


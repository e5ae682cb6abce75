"""The KV cache formats of the full-attention layers, and their numpy statement (what the kernels must write).

A cache row is one (head, position): ``head_dim`` values of k or v.

- ``bf16`` / ``fp16``: the row as it is, in that type (2 bytes a value).
- ``q8_0``: blocks of 32 values, each an fp16 scale ``d = amax / 127`` and 32 int8 codes ``round(x / d)`` (half away
  from zero); value = code * d. 1.0625 bytes a value.
- ``q4_0``: blocks of 32 values, each an fp16 scale ``d = m / -8`` (``m``: the block's value of largest magnitude,
  the first if tied) and 32 four-bit codes ``min(15, trunc(x / d + 8.5))``; value = (code - 8) * d. 0.5625 bytes a
  value. Codes go two a byte in order: value 2i in the low nibble of byte i, value 2i + 1 in the high one.
- ``tq3_0``: TurboQuant's 3-bit MSE quantiser (Zandieh et al., 2025) on blocks of 32 values, 3.5 bits a value as in
  the reference project's TQ3_0 (a norm and 3 bits a value; our block is its own rotation group). A block x is
  rotated, y = H (s * x) / sqrt(32) (H the 32-point Walsh-Hadamard matrix, s the fixed signs ``TQ3_SIGNS``), so that
  its coordinates y_i / (|y| / sqrt(32)) are close to N(0, 1) whatever x looked like; each gets the nearest of the
  8 Lloyd-Max levels for N(0, 1), a sign and a magnitude ``TQ3_LEVELS[k]``; the fp16 scale
  ``d = |y| / |levels chosen|`` keeps the block's norm. The cache holds the rotated block: attention reads
  q' = H (s * q) / sqrt(32) against the rotated keys (the same dot products) and rotates its output back.
  Value i of a block is bit i of three 32-bit words: bit 0 and bit 1 of k, then the sign (1: negative). 14 bytes a
  block: 0.4375 bytes a value.

q8_0 / q4_0 are ggml's Q8_0 / Q4_0 block rules (codes from the float32 scale, the scale stored as fp16); only the
nibble order is the cache's own (sequential, so a thread's run of values is a run of bytes). In memory, one
attention layer's cache is the codes of all its rows, [2][num_kv_heads][max_context][code bytes] (k heads, then v
heads), then the scales of all its rows, [2][num_kv_heads][max_context][head_dim / 32] fp16. The float types have
no scales.

tq3_0's arithmetic is stated here in the order the kernel does it (templates/common/kv_cache.cuh.j2: the
butterflies in stages of 1, 2, .. 16 lanes, the sums of squares over the 32 lanes by the same butterfly), so that
numpy and the device choose the same codes for the same inputs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import LucegenError
from .dtypes import round_to

F32 = np.float32
BLOCK = 32  # values per quantised block
QUANTISED = ("q8_0", "q4_0", "tq3_0")
# tq3_0: the Lloyd-Max quantiser of N(0, 1) in 8 levels (Max, 1960): magnitudes of the levels and the thresholds
# between neighbouring magnitudes (their midpoints; the sign is the eighth threshold, 0), and the fixed signs s
# (bit i set: value i of a block is negated before the Walsh-Hadamard transform)
TQ3_LEVELS = (0.2450942, 0.7560053, 1.3439093, 2.1519457)
TQ3_THRESHOLDS = (0.5005497, 1.0499573, 1.7479275)
TQ3_SIGNS = 0x37939CC9
_SQRT32, _INV_SQRT32 = F32(5.656854249492381), F32(0.17677669529663687)


@dataclasses.dataclass(frozen=True)
class KvFormat:
    name: str
    code_bits: int  # bits a value in the code array: 16 for the float types

    @property
    def quantised(self) -> bool:
        return self.name in QUANTISED

    @property
    def rotated(self) -> bool:
        """Whether the cache holds each block rotated (attention rotates q and its output: module docstring)."""
        return self.name == "tq3_0"

    def code_bytes(self, head_dim: int) -> int:
        return head_dim * self.code_bits // 8

    def scale_bytes(self, head_dim: int) -> int:
        return 2 * (head_dim // BLOCK) if self.quantised else 0

    def row_bytes(self, head_dim: int) -> int:
        """Bytes of one (head, position) row, scales included."""
        return self.code_bytes(head_dim) + self.scale_bytes(head_dim)

    def layer_bytes(self, num_kv_heads: int, head_dim: int, max_context: int) -> int:
        """One attention layer's cache: k and v rows of every head and position."""
        return 2 * num_kv_heads * max_context * self.row_bytes(head_dim)

    @property
    def ctype(self) -> str:
        """The C type of the storage elements (templates/common/prelude.cuh.j2's names): the float type, or bytes."""
        return "unsigned char" if self.quantised else {"bf16": "bf16_t", "fp16": "fp16_t"}[self.name]

    def code_step(self, scales: np.ndarray) -> np.ndarray:
        """The most one code away moves a value of each block (float32, the shape of ``scales``): q8_0 / q4_0 one
        step of the scale; tq3_0 the widest gap between neighbouring levels (in the rotated block, which spreads it
        over the block's values)."""
        d = np.abs(np.asarray(scales).astype(F32))
        return d * F32(max(np.diff((0.0,) + TQ3_LEVELS)) if self.rotated else 1.0)

    def template_params(self) -> dict:
        """What the cache kernels are rendered with (templates/common/kv_cache.cuh.j2): the format, its storage
        element and, for tq3_0, its levels, thresholds, signs and the float32 constants of its rotation."""
        return {"kv": self.name, "kv_ctype": self.ctype, "kv_quantised": self.quantised, "kv_rotated": self.rotated,
                "kv_bits": self.code_bits, "kv_levels": [repr(float(F32(x))) for x in TQ3_LEVELS],
                "kv_thresholds": [repr(float(F32(x))) for x in TQ3_THRESHOLDS], "kv_signs": f"0x{TQ3_SIGNS:08X}",
                "kv_sqrt32": repr(float(_SQRT32)), "kv_inv_sqrt32": repr(float(_INV_SQRT32))}

    def check_head_dim(self, head_dim: int, where: str) -> None:
        if self.quantised and head_dim % BLOCK:
            raise LucegenError(f"{where}: a {self.name} KV cache needs head_dim a multiple of {BLOCK}, got {head_dim}")


FORMATS = {f.name: f for f in (KvFormat("bf16", 16), KvFormat("fp16", 16), KvFormat("q8_0", 8), KvFormat("q4_0", 4),
                                KvFormat("tq3_0", 3))}


def kv_format(name: str) -> KvFormat:
    """The format called ``name``; one clear error for anything else."""
    try:
        return FORMATS[name]
    except KeyError:
        raise LucegenError(f"unknown KV cache type {name!r}: choose one of {', '.join(FORMATS)}") from None


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf, exactly (numpy's round is half to even)."""
    whole = np.trunc(x)
    return whole + np.where(np.abs(x - whole) >= F32(0.5), np.sign(x), F32(0)).astype(F32)


_LANE = np.arange(BLOCK)


def _lanes_sum(v: np.ndarray) -> np.ndarray:
    """The sum over each block's 32 values [..., 32] in the kernel's butterfly order (every lane's result)."""
    for offset in (16, 8, 4, 2, 1):
        v = v + v[..., _LANE ^ offset]
    return v


def tq3_rotate(blocks: np.ndarray, inverse: bool = False) -> np.ndarray:
    """Blocks [..., 32] rotated as tq3_0 rotates them, H (s * x) / sqrt(32), or back, s * (H y) / sqrt(32): the
    butterflies of stage h (h = 1, 2, .. 16) leave a + b at the lower value of each pair (i, i + h), a - b at the
    upper (float32, the kernel's operations)."""
    signs = np.where((TQ3_SIGNS >> _LANE) & 1, F32(-1), F32(1))
    t = np.asarray(blocks, F32)
    if not inverse:
        t = t * signs
    for h in (1, 2, 4, 8, 16):
        other = t[..., _LANE ^ h]
        t = np.where(_LANE & h, other - t, t + other)
    t = t * _INV_SQRT32
    return t * signs if inverse else t


def tq3_levels(codes: np.ndarray) -> np.ndarray:
    """Each code's level (float32): a sign and a magnitude, codes [..., 32] in 0 .. 7."""
    mag = np.asarray(TQ3_LEVELS, F32)[codes & 3]
    return np.where(codes & 4, -mag, mag)


def _tq3_quantise(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Blocks [..., 32] as (codes 0 .. 7 [..., 32], scales float32 [..., 1]): the kernel's kv_store_group."""
    y = tq3_rotate(blocks)
    nrm = np.sqrt(_lanes_sum(y * y)[..., :1])
    inv = np.divide(_SQRT32, nrm, out=np.zeros_like(nrm), where=nrm != 0)
    u = y * inv
    mag = np.abs(u)
    k = sum((mag >= F32(t)).astype(np.uint8) for t in TQ3_THRESHOLDS)
    codes = k | np.where(u < 0, np.uint8(4), np.uint8(0))
    level = np.asarray(TQ3_LEVELS, F32)[k]
    return codes, nrm / np.sqrt(_lanes_sum(level * level)[..., :1])


def _pack_planes(codes: np.ndarray) -> np.ndarray:
    """Codes [..., 32] in 0 .. 7 as 12 bytes a block: bit p of every code in word p (value i at bit i)."""
    weights = np.left_shift(np.uint32(1), _LANE.astype(np.uint32))
    words = np.stack([((codes >> p) & 1).astype(np.uint32) @ weights for p in range(3)], axis=-1)
    return words.astype("<u4").view(np.uint8)


def _unpack_planes(codes: np.ndarray) -> np.ndarray:
    """The inverse of _pack_planes: bytes [..., 12 * blocks] as codes [..., blocks, 32]."""
    words = np.ascontiguousarray(codes).view("<u4").reshape(*codes.shape[:-1], -1, 3)
    bits = (words[..., None] >> _LANE.astype(np.uint32)) & 1  # [..., blocks, plane, value]
    return (bits[..., 0, :] | (bits[..., 1, :] << 1) | (bits[..., 2, :] << 2)).astype(np.uint8)


def quantise(fmt: KvFormat, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``x`` [..., head_dim] as (codes uint8 [..., code bytes], scales fp16 [..., head_dim / 32])."""
    x = np.asarray(x, F32)
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    if fmt.name == "tq3_0":
        q, d = _tq3_quantise(blocks)
        return _pack_planes(q).reshape(*x.shape[:-1], -1), d[..., 0].astype(np.float16)
    if fmt.name == "q8_0":
        d = np.abs(blocks).max(axis=-1, keepdims=True) / F32(127)
        inv = np.divide(F32(1), d, out=np.zeros_like(d), where=d != 0)
        codes = _round_half_away(blocks * inv).astype(np.int8).view(np.uint8)
    elif fmt.name == "q4_0":
        first = np.abs(blocks).argmax(axis=-1)[..., None]
        d = np.take_along_axis(blocks, first, axis=-1) / F32(-8)
        inv = np.divide(F32(1), d, out=np.zeros_like(d), where=d != 0)
        q = np.minimum(F32(15), np.trunc(blocks * inv + F32(8.5))).astype(np.uint8)
        codes = q[..., 0::2] | (q[..., 1::2] << 4)
    else:
        raise ValueError(f"quantise: {fmt.name} is not a quantised KV format")
    return codes.reshape(*x.shape[:-1], -1), d[..., 0].astype(np.float16)


def dequantise(fmt: KvFormat, codes: np.ndarray, scales: np.ndarray, rotated: bool = False) -> np.ndarray:
    """The values [..., head_dim] that (codes, scales) stand for (float32); tq3_0's rotated back, unless
    ``rotated`` (what the attention kernels read)."""
    if fmt.name == "tq3_0":
        y = tq3_levels(_unpack_planes(codes)) * scales.astype(F32)[..., None]
        y = y if rotated else tq3_rotate(y, inverse=True)
        return y.reshape(*codes.shape[:-1], -1)
    if fmt.name == "q8_0":
        q = codes.view(np.int8).astype(F32)
    elif fmt.name == "q4_0":
        q = np.stack([codes & 15, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1).astype(F32) - F32(8)
    else:
        raise ValueError(f"dequantise: {fmt.name} is not a quantised KV format")
    blocks = q.reshape(*q.shape[:-1], -1, BLOCK) * scales.astype(F32)[..., None]
    return blocks.reshape(q.shape)


def stored(fmt: KvFormat, x: np.ndarray) -> np.ndarray:
    """What the cache holds for rows ``x`` (float32): rounded to the float type, or quantised and back."""
    if fmt.quantised:
        return dequantise(fmt, *quantise(fmt, x))
    return round_to(x, fmt.name)


def decode_layers(fmt: KvFormat, raw: np.ndarray, n_layers: int, num_kv_heads: int, head_dim: int,
                  max_context: int) -> np.ndarray:
    """A device cache's bytes (``n_layers`` attention layers, the layout of the module docstring) as float32
    [n_layers, 2, num_kv_heads, max_context, head_dim]."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(n_layers, -1)
    rows = 2 * num_kv_heads * max_context
    shape = (n_layers, 2, num_kv_heads, max_context)
    codes = raw[:, : rows * fmt.code_bytes(head_dim)]
    if not fmt.quantised:
        from .dtypes import bf16_bits_to_f32

        bits = codes.view(np.uint16).reshape(*shape, head_dim)
        return bf16_bits_to_f32(bits) if fmt.name == "bf16" else bits.view(np.float16).astype(F32)
    scales = raw[:, rows * fmt.code_bytes(head_dim):].view(np.float16)
    return dequantise(fmt, codes.reshape(*shape, -1), scales.reshape(*shape, head_dim // BLOCK))

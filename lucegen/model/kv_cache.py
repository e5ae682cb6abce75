"""The KV cache formats of the full-attention layers, and their numpy statement (what the kernels must write).

A cache row is one (head, position): ``head_dim`` values of k or v.

- ``bf16`` / ``fp16``: the row as it is, in that type (2 bytes a value).
- ``q8_0``: blocks of 32 values, each an fp16 scale ``d = amax / 127`` and 32 int8 codes ``round(x / d)`` (half away
  from zero); value = code * d. 1.0625 bytes a value.
- ``q4_0``: blocks of 32 values, each an fp16 scale ``d = m / -8`` (``m``: the block's value of largest magnitude,
  the first if tied) and 32 four-bit codes ``min(15, trunc(x / d + 8.5))``; value = (code - 8) * d. 0.5625 bytes a
  value. Codes go two a byte in order: value 2i in the low nibble of byte i, value 2i + 1 in the high one.

These are ggml's Q8_0 / Q4_0 block rules (codes from the float32 scale, the scale stored as fp16); only the nibble
order is the cache's own (sequential, so a thread's run of values is a run of bytes). In memory, one attention
layer's cache is the codes of all its rows, [2][num_kv_heads][max_context][code bytes] (k heads, then v heads), then
the scales of all its rows, [2][num_kv_heads][max_context][head_dim / 32] fp16. The float types have no scales.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import LucegenError

F32 = np.float32
BLOCK = 32  # values per quantised block


@dataclasses.dataclass(frozen=True)
class KvFormat:
    name: str
    code_bits: int  # bits a value in the code array: 16 for the float types

    @property
    def quantised(self) -> bool:
        return self.name in ("q8_0", "q4_0")

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

    def check_head_dim(self, head_dim: int, where: str) -> None:
        if self.quantised and head_dim % BLOCK:
            raise LucegenError(f"{where}: a {self.name} KV cache needs head_dim a multiple of {BLOCK}, got {head_dim}")


FORMATS = {f.name: f for f in (KvFormat("bf16", 16), KvFormat("fp16", 16), KvFormat("q8_0", 8), KvFormat("q4_0", 4))}


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


def quantise(fmt: KvFormat, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``x`` [..., head_dim] as (codes uint8 [..., code bytes], scales fp16 [..., head_dim / 32])."""
    x = np.asarray(x, F32)
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
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


def dequantise(fmt: KvFormat, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The values [..., head_dim] that (codes, scales) stand for (float32)."""
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
    from .reference import round_to

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

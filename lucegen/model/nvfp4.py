"""NVFP4 in numpy: the statement of the format that the readers, the writer and the kernels are checked against.

A matrix W [rows, cols] (cols a multiple of 16) is stored as ModelOpt writes it (docs/nvfp4.md has the sources):

- ``weight``: uint8 [rows, cols/2], two E2M1 codes per byte, element 2j in the low nibble, 2j+1 in the high one;
  an E2M1 code is sign (bit 3) and a magnitude index (bits 0-2) into {0, 0.5, 1, 1.5, 2, 3, 4, 6};
- ``weight_scale``: FP8 E4M3 (the "fn" variant: bias 7, no infinities, 0x7F/0xFF NaN, largest 448) [rows, cols/16],
  one per block of 16 consecutive values along a row;
- ``weight_scale_2``: FP32, one per tensor.

Dequantised value = e2m1(code) * (e4m3(block scale) * scale_2), the product of the two scales taken first, in FP32.

Quantising (round to nearest, as ModelOpt's NVFP4QTensor does it): scale_2 = amax(|W|) / (6 * 448) (1.0 for an
all-zero matrix, whose codes are all zero whatever the scale); per block, s = amax(block) / (6 * scale_2) in FP32,
1.0 where the block is all zero, raised to at least 2**-9 (the smallest E4M3 subnormal) and rounded to E4M3 to
nearest, ties to even; each value x / (e4m3(s) * scale_2) is rounded to the nearest E2M1 magnitude, ties to the even
code, magnitudes above 6 saturating to 6.
"""

from __future__ import annotations

import numpy as np

BLOCK = 16  # values per E4M3 block scale
E2M1_MAX, E4M3_MAX = 6.0, 448.0
E4M3_MIN_SCALE = 2.0**-9  # smallest positive E4M3 value (a subnormal)
#: E2M1 magnitude of the codes 0-7; codes 8-15 are the same magnitudes negated
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_VALUES = np.concatenate([E2M1_MAGNITUDES, -E2M1_MAGNITUDES]).astype(np.float32)


def e4m3_decode(codes: np.ndarray) -> np.ndarray:
    """FP8 E4M3 (fn) bytes -> float32; 0x7F and 0xFF are NaN."""
    codes = np.asarray(codes, dtype=np.uint8).astype(np.int32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent, mantissa = (codes >> 3) & 0xF, codes & 0x7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = mantissa * 2.0**-9
    value = sign * np.where(exponent == 0, subnormal, normal)
    return np.where((codes & 0x7F) == 0x7F, np.nan, value).astype(np.float32)


_E4M3_POSITIVE = e4m3_decode(np.arange(0x7F, dtype=np.uint8)).astype(np.float64)  # codes 0..0x7E, increasing


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """float -> FP8 E4M3 (fn) bytes: round to nearest, ties to the even code; magnitudes above 448 saturate to
    448; NaN -> 0x7F."""
    x = np.asarray(x, dtype=np.float64)
    magnitude = np.minimum(np.abs(x), E4M3_MAX)
    hi = np.clip(np.searchsorted(_E4M3_POSITIVE, magnitude, side="left"), 0, len(_E4M3_POSITIVE) - 1)
    lo = np.maximum(hi - 1, 0)
    below, above = magnitude - _E4M3_POSITIVE[lo], _E4M3_POSITIVE[hi] - magnitude
    code = np.where(below < above, lo, np.where(above < below, hi, np.where(lo % 2 == 0, lo, hi)))
    code = code.astype(np.uint8) | np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(np.isnan(x), 0x7F, code).astype(np.uint8)


def e2m1_encode(x: np.ndarray) -> np.ndarray:
    """float -> E2M1 codes (uint8, 0-15): nearest magnitude, ties to the even code, above 6 saturating to 6; the
    sign bit is set for negative inputs (a negative value rounding to zero gives code 8, -0)."""
    x = np.asarray(x, dtype=np.float32)
    magnitude = np.abs(x).astype(np.float64)
    table = E2M1_MAGNITUDES.astype(np.float64)
    hi = np.clip(np.searchsorted(table, magnitude, side="left"), 0, len(table) - 1)
    lo = np.maximum(hi - 1, 0)
    below, above = magnitude - table[lo], table[hi] - magnitude
    code = np.where(below < above, lo, np.where(above < below, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(x < 0, 8, 0)).astype(np.uint8)


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes [..., 2n] -> bytes [..., n]: element 2j in the low nibble, 2j+1 in the high nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """Bytes [..., n] -> E2M1 codes [..., 2n] (the inverse of :func:`pack_e2m1`)."""
    packed = np.asarray(packed, dtype=np.uint8)
    codes = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), dtype=np.uint8)
    codes[..., 0::2], codes[..., 1::2] = packed & 0x0F, packed >> 4
    return codes


def global_scale(w: np.ndarray) -> np.float32:
    """``weight_scale_2``: amax / (6 * 448) in FP32; 1.0 for an all-zero matrix."""
    amax = np.float32(np.max(np.abs(w))) if w.size else np.float32(0)
    return np.float32(amax / np.float32(E2M1_MAX * E4M3_MAX)) if amax > 0 else np.float32(1.0)


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """float matrix [rows, cols] -> (packed uint8 [rows, cols/2], E4M3 block scales uint8 [rows, cols/16],
    FP32 global scale), rounded as the module docstring states."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"NVFP4 quantises a matrix whose rows are a multiple of {BLOCK} long, got shape {w.shape}")
    rows, cols = w.shape
    scale_2 = global_scale(w)
    blocks = w.reshape(rows, cols // BLOCK, BLOCK)
    block_amax = np.max(np.abs(blocks), axis=-1)
    s = block_amax / (np.float32(E2M1_MAX) * scale_2)
    s = np.where(s == 0, np.float32(1.0), s)
    scale_codes = e4m3_encode(np.maximum(s, np.float32(E4M3_MIN_SCALE)))
    block_scale = e4m3_decode(scale_codes) * scale_2
    codes = e2m1_encode(blocks / block_scale[..., None]).reshape(rows, cols)
    return pack_e2m1(codes), scale_codes, scale_2


def dequantize(packed: np.ndarray, scale_codes: np.ndarray, scale_2) -> np.ndarray:
    """(packed bytes [rows, cols/2], E4M3 block scales [rows, cols/16], FP32 global scale) -> float32 [rows, cols]:
    e2m1(code) * (e4m3(scale) * scale_2)."""
    values = E2M1_VALUES[unpack_e2m1(packed)]
    rows, cols = values.shape
    block_scale = e4m3_decode(scale_codes) * np.float32(scale_2)
    if block_scale.shape != (rows, cols // BLOCK):
        raise ValueError(f"block scales of shape {block_scale.shape} for a {rows}x{cols} matrix")
    return (values.reshape(rows, cols // BLOCK, BLOCK) * block_scale[..., None]).reshape(rows, cols)

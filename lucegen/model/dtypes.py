"""bfloat16 <-> float32 conversions on raw bits (numpy has no bfloat16), and rounding to the two-byte float types."""

from __future__ import annotations

import numpy as np


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits -> float32 (exact: bf16 is the top half of a float32)."""
    bits = np.asarray(bits, dtype=np.uint16)
    out = np.zeros(bits.size, np.uint32)
    out.view(np.uint16)[1::2] = bits.reshape(-1)  # little-endian: the high half of each uint32 is the odd uint16
    return out.view(np.float32).reshape(bits.shape)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bf16 bits, round to nearest even (NaN stays NaN), as torch's ``.to(torch.bfloat16)``."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded = np.where(nan, ((u >> 16) | np.uint32(0x40)).astype(np.uint16), rounded)
    return rounded


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to a two-byte float type (round to nearest even) and back to float32."""
    if dtype == "bf16":
        return bf16_bits_to_f32(f32_to_bf16_bits(np.ascontiguousarray(x, np.float32))).reshape(np.shape(x))
    if dtype == "fp16":
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
    raise ValueError(f"round_to: unknown dtype {dtype!r}")

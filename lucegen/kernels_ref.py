"""numpy references for the small kernels (templates/kernels/small_kernels.cu.j2), and the bf16/fp16 rounding they
need. The GPU tests compare the generated kernels against these."""

from __future__ import annotations

import numpy as np


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (round to nearest, ties to even; NaN stays NaN) → uint16 bit patterns."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, np.uint32(0x7FC0), rounded).astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_device_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """The host array a kernel of ``dtype`` ("bf16"/"fp16") reads: uint16 bf16 bits or float16."""
    if dtype == "bf16":
        return f32_to_bf16_bits(x)
    if dtype == "fp16":
        return np.asarray(x, dtype=np.float16)
    raise ValueError(f"unknown dtype {dtype!r}")


def from_device_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    """Inverse of :func:`to_device_dtype`: the float32 values the device array holds."""
    return bf16_bits_to_f32(x) if dtype == "bf16" else np.asarray(x, dtype=np.float32)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of ``x`` rounded to ``dtype``."""
    return from_device_dtype(to_device_dtype(np.asarray(x, dtype=np.float32), dtype), dtype)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Qwen3.5 RMSNorm (Qwen3_5RMSNorm): x * rsqrt(mean(x^2) + eps) * (1 + w), per row, in float64."""
    x = np.asarray(x, dtype=np.float64)
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * scale * (1.0 + np.asarray(w, dtype=np.float64))


def matvec(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """y[N] = W[N, K] . x[K] in float64."""
    return np.asarray(w, dtype=np.float64) @ np.asarray(x, dtype=np.float64)


def argmax(x: np.ndarray) -> int:
    """numpy's argmax: the first maximum; the first NaN if there is one."""
    return int(np.argmax(x))

"""GGML tensor types: block layouts, vectorised numpy dequantisation (bit-exact with the ``gguf`` package's
``gguf.quants``) and simple quantisers (min/max scales, no iterative search) for writing GGUF files.

Block formats (little-endian, QK_K = 256):
- Q8_0 (32 values, 34 B): d f16, q int8[32];                     x = d * q
- Q4_0 (32, 18 B): d f16, qs[16] (low nibble i, high nibble i+16); x = d * (q - 8)
- Q5_0 (32, 22 B): d f16, qh u32 (5th bits), qs[16];               x = d * (q - 16)
- Q5_1 (32, 24 B): d f16, m f16, qh u32, qs[16];                   x = d * q + m
- Q4_K (256, 144 B): d f16, dmin f16, 12 B of 6-bit (scale, min) for 8 sub-blocks of 32, qs[128];
                     x = (d * sc_j) * q - (dmin * m_j), q in 0..15
- Q5_K (256, 176 B): as Q4_K plus qh[32] (bit j of qh[l] is the 5th bit of sub-block j, element l), q in 0..31
- Q6_K (256, 210 B): ql[128], qh[64], scales int8[16] (sub-blocks of 16), d f16; x = (d * sc_i) * (q - 32)
"""

from __future__ import annotations

import numpy as np

from .dtypes import bf16_bits_to_f32

QK_K = 256
# type name -> (ggml type id, values per block, bytes per block)
TYPES = {
    "F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24), "Q8_0": (8, 32, 34), "Q8_1": (9, 32, 36), "Q2_K": (10, 256, 84), "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144), "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210), "Q8_K": (15, 256, 292),
    "I8": (24, 1, 1), "I16": (25, 1, 2), "I32": (26, 1, 4), "I64": (27, 1, 8), "F64": (28, 1, 8),
    "BF16": (30, 1, 2),
}
TYPE_BY_ID = {tid: name for name, (tid, _, _) in TYPES.items()}
READABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def nbytes(type_name: str, n_values: int) -> int:
    _, block, size = TYPES[type_name]
    return n_values // block * size


def _f16(b: np.ndarray) -> np.ndarray:
    """Two bytes per row -> float32 column."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


# ------------------------------------------------------------------------------------------------ dequantisation
def dequantize(data: np.ndarray, type_name: str, n_values: int) -> np.ndarray:
    """Raw bytes (uint8) of ``n_values`` values of ``type_name`` -> float32 [n_values]."""
    data = np.asarray(data, dtype=np.uint8).reshape(-1)
    if type_name == "F32":
        return data.view(np.float32).copy()
    if type_name == "F16":
        return data.view(np.float16).astype(np.float32)
    if type_name == "BF16":
        return bf16_bits_to_f32(data.view(np.uint16))
    _, block, size = TYPES[type_name]
    blocks = data.reshape(-1, size)
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf f16 scales give NaN/inf values, as in ggml
        return _DEQUANT[type_name](blocks).reshape(-1)


def _q8_0(b):
    return b[:, 2:].view(np.int8).astype(np.float32) * _f16(b[:, :2])


def nibbles32(qs):
    """qs [n, 16] -> [n, 32]: low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _q4_0(b):
    q = nibbles32(b[:, 2:]).astype(np.int8) - np.int8(8)
    return _f16(b[:, :2]) * q.astype(np.float32)


def fifth_bits(qh4):
    """qh [n, 4] bytes as a little-endian u32 -> [n, 32] bit i of it."""
    return np.unpackbits(qh4, axis=1, bitorder="little")


def _q5_0(b):
    q = (nibbles32(b[:, 6:]) | (fifth_bits(b[:, 2:6]) << 4)).astype(np.int8) - np.int8(16)
    return _f16(b[:, :2]) * q.astype(np.float32)


def _q5_1(b):
    q = (nibbles32(b[:, 8:]) | (fifth_bits(b[:, 4:8]) << 4)).astype(np.float32)
    return _f16(b[:, :2]) * q + _f16(b[:, 2:4])


def k_scale_min(scales: np.ndarray):
    """12 packed bytes -> (sc [n, 8], m [n, 8]) 6-bit integers (ggml's get_scale_min_k4)."""
    lo, hi, mix = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([lo & 63, (mix & 0x0F) | ((lo >> 6) << 4)], axis=1)
    m = np.concatenate([hi & 63, (mix >> 4) | ((hi >> 6) << 4)], axis=1)
    return sc, m


def _k_low_nibbles(qs):
    """qs [n, 128] -> [n, 8, 32]: sub-block 2j = low nibbles of qs[32j:32j+32], 2j+1 = their high nibbles."""
    qs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b):
    n = b.shape[0]
    sc, m = k_scale_min(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * m.astype(np.float32)).reshape(n, 8, 1)
    return (d * _k_low_nibbles(b[:, 16:144]).astype(np.float32) - dm).reshape(n, QK_K)


def _q5_k(b):
    n = b.shape[0]
    sc, m = k_scale_min(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * sc.astype(np.float32)).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * m.astype(np.float32)).reshape(n, 8, 1)
    high = (b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
    q = (_k_low_nibbles(b[:, 48:176]) | (high << 4)).astype(np.float32)
    return (d * q - dm).reshape(n, QK_K)


def _q6_k(b):
    n = b.shape[0]
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], b[:, 208:210]
    d = (_f16(d) * scales.view(np.int8).astype(np.float32)).reshape(n, 16, 1)
    low = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    low = (low & 0x0F).reshape(n, 8, 32)
    high = (qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = (low | (high.reshape(n, 8, 32) << 4)).astype(np.int8) - np.int8(32)
    return (d * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, QK_K)


_DEQUANT = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q4_K": _q4_k, "Q5_K": _q5_k,
            "Q6_K": _q6_k}


# ------------------------------------------------------------------------------------------------ quantisation
def _to_f16_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.astype(np.float16)).view(np.uint8).reshape(x.shape[0], 2)


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0, a / np.where(b == 0, 1, b))


def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """float32 values (count a multiple of the block size) -> raw bytes (uint8) of ``type_name``."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if type_name == "F32":
        return x.view(np.uint8).copy()
    if type_name == "F16":
        return x.astype(np.float16).view(np.uint8)
    if type_name == "BF16":
        from .dtypes import f32_to_bf16_bits

        return f32_to_bf16_bits(x).view(np.uint8)
    _, block, _ = TYPES[type_name]
    return _QUANT[type_name](x.reshape(-1, block)).reshape(-1)


def _quant_q8_0(x):
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    d16 = d.astype(np.float16).astype(np.float32)
    q = np.clip(np.round(_safe_div(x, d16)), -127, 127).astype(np.int8)
    return np.concatenate([_to_f16_bytes(d16), q.view(np.uint8)], axis=1)


def _pack_nibbles32(q):
    return (q[:, :16] & 0x0F) | (q[:, 16:] << 4)


def _quant_q4_0(x):
    imax = np.abs(x).argmax(axis=1)[:, None]
    d16 = (np.take_along_axis(x, imax, axis=1) / np.float32(-8)).astype(np.float16).astype(np.float32)
    q = np.clip(np.round(_safe_div(x, d16)) + 8, 0, 15).astype(np.uint8)
    return np.concatenate([_to_f16_bytes(d16), _pack_nibbles32(q)], axis=1)


def _quant_q5_0(x):
    imax = np.abs(x).argmax(axis=1)[:, None]
    d16 = (np.take_along_axis(x, imax, axis=1) / np.float32(-16)).astype(np.float16).astype(np.float32)
    q = np.clip(np.round(_safe_div(x, d16)) + 16, 0, 31).astype(np.uint8)
    qh = np.packbits(q >> 4, axis=1, bitorder="little")
    return np.concatenate([_to_f16_bytes(d16), qh, _pack_nibbles32(q)], axis=1)


def _quant_q5_1(x):
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d16 = ((hi - lo) / np.float32(31)).astype(np.float16).astype(np.float32)
    m16 = lo.astype(np.float16).astype(np.float32)
    q = np.clip(np.round(_safe_div(x - m16, d16)), 0, 31).astype(np.uint8)
    qh = np.packbits(q >> 4, axis=1, bitorder="little")
    return np.concatenate([_to_f16_bytes(d16), _to_f16_bytes(m16), qh, _pack_nibbles32(q)], axis=1)


def _k_scales_mins(x, nmax):
    """x [n, 8, 32] -> (d16 [n,1], dmin16 [n,1], sc [n,8], m [n,8], q [n,8,32]) for x ~ d*sc*q - dmin*m."""
    lo = np.minimum(x.min(axis=2), 0)
    span = (x.max(axis=2) - lo) / np.float32(nmax)
    d16 = (span.max(axis=1, keepdims=True) / np.float32(63)).astype(np.float16).astype(np.float32)
    dmin16 = ((-lo).max(axis=1, keepdims=True) / np.float32(63)).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(_safe_div(span, d16)), 0, 63).astype(np.uint8)
    m = np.clip(np.round(_safe_div(-lo, dmin16)), 0, 63).astype(np.uint8)
    scale = (d16 * sc.astype(np.float32))[:, :, None]
    offset = (dmin16 * m.astype(np.float32))[:, :, None]
    q = np.clip(np.round(_safe_div(x + offset, scale)), 0, nmax).astype(np.uint8)
    return d16, dmin16, sc, m, q


def pack_k_scales(sc, m):
    """Inverse of :func:`k_scale_min`: (sc, m) [n, 8] 6-bit -> 12 bytes."""
    lo = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    hi = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    mix = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo, hi, mix], axis=1).astype(np.uint8)


def _pack_k_low(q):
    """[n, 8, 32] values (low 4 bits used) -> qs [n, 128]."""
    q = q.reshape(-1, 4, 2, 32)
    return ((q[:, :, 0] & 0x0F) | ((q[:, :, 1] & 0x0F) << 4)).reshape(-1, 128)


def _quant_q4_k(x):
    d16, dmin16, sc, m, q = _k_scales_mins(x.reshape(-1, 8, 32), 15)
    return np.concatenate([_to_f16_bytes(d16), _to_f16_bytes(dmin16), pack_k_scales(sc, m), _pack_k_low(q)], axis=1)


def _quant_q5_k(x):
    d16, dmin16, sc, m, q = _k_scales_mins(x.reshape(-1, 8, 32), 31)
    qh = (((q >> 4) & 1) << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1, dtype=np.uint8)
    return np.concatenate([_to_f16_bytes(d16), _to_f16_bytes(dmin16), pack_k_scales(sc, m), qh, _pack_k_low(q)],
                          axis=1)


def _quant_q6_k(x):
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    s = np.abs(sub).max(axis=2) / np.float32(31)
    d16 = (s.max(axis=1, keepdims=True) / np.float32(127)).astype(np.float16).astype(np.float32)
    scales = np.clip(np.round(_safe_div(s, d16)), -128, 127).astype(np.int8)
    eff = (d16 * scales.astype(np.float32))[:, :, None]
    q = (np.clip(np.round(_safe_div(sub, eff)), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)
    # row r = 4h + k of [n, 8, 32]: low nibble from ql[64h + 32(k % 2) + l] (nibble k // 2), 2 high bits at
    # bits 2k of qh[32h + l]
    low = q & 0x0F
    ql = np.empty((n, 2, 64), np.uint8)
    ql[:, :, :32] = low[:, :, 0] | (low[:, :, 2] << 4)
    ql[:, :, 32:] = low[:, :, 1] | (low[:, :, 3] << 4)
    high = (q >> 4) & 3
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), scales.view(np.uint8), _to_f16_bytes(d16)],
                          axis=1)


_QUANT = {"Q8_0": _quant_q8_0, "Q4_0": _quant_q4_0, "Q5_0": _quant_q5_0, "Q5_1": _quant_q5_1,
          "Q4_K": _quant_q4_k, "Q5_K": _quant_q5_k, "Q6_K": _quant_q6_k}


# ------------------------------------------------------------------------------------------------ int8 activations
#: Values per activation scale of the int8-activation GEMM (GGML's Q8_K block).
Q8_ACT_BLOCK = QK_K


def q8_activation_scales(x: np.ndarray) -> np.ndarray:
    """The int8-activation GEMM's scale per token and 256 values (templates/kernels/quant_gemm.cu.j2, qg_q8_scales):
    inv = 127 / amax in float32, then to fp16 rounded toward zero (so |x inv| <= 127), 0 where amax is 0. ``x``
    [..., K] holds fp16 values (K a multiple of 256); returns inv as float32 [..., K / 256]."""
    x = np.asarray(x, np.float32)
    if x.shape[-1] % Q8_ACT_BLOCK:
        raise ValueError(f"int8 activations come in blocks of {Q8_ACT_BLOCK} values, got rows of {x.shape[-1]}")
    amax = np.abs(x.reshape(*x.shape[:-1], -1, Q8_ACT_BLOCK)).max(axis=-1)
    inv = _safe_div(np.float32(127), amax).astype(np.float32)
    with np.errstate(over="ignore"):  # beyond 65504: inf, one step toward zero is 65504
        half = inv.astype(np.float16)  # round to nearest, then one step toward zero where that went up
    up = half.astype(np.float32) > inv
    half[up] = np.nextafter(half[up], np.float16(0))
    return np.minimum(half.astype(np.float32), np.float32(65504))


def q8_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp16 values [..., K] -> (q int8 [..., K], inv float32 [..., K / 256]): q = rint(x inv), ties to even (the
    exact product of two fp16 values, rounded once, as the kernels' hfma2 does)."""
    x = np.asarray(x, np.float32)
    inv = q8_activation_scales(x)
    q = np.rint(x.reshape(*inv.shape, Q8_ACT_BLOCK) * inv[..., None]).reshape(x.shape)
    return q.astype(np.int8), inv


def q8_dequantized(x: np.ndarray) -> np.ndarray:
    """x as the int8-activation GEMM sees it: q / inv per 256 values, float32 (q da with da = 1 / inv in float32,
    the kernels' per-block scale)."""
    q, inv = q8_activations(x)
    da = _safe_div(np.float32(1), inv).astype(np.float32)
    return (q.astype(np.float32).reshape(*inv.shape, Q8_ACT_BLOCK) * da[..., None]).reshape(q.shape)

"""The greedy token without reading the whole lm_head: a 6-bit copy of it screens the rows, and only the rows that
may hold the largest logit are read in full (the megakernel's ``lm_head_screen_phase``,
templates/megakernel/mlp_lm_head.cuh.j2).

Row r of the lm_head, w_r (the packed bf16 / fp16 values), is kept as codes q_r in [-31, 31] with one float32 scale
s_r = max |w_r| / 31. For the staged hidden state x, the screened logit A_r = s_r (q_r · x) and the exact one
E_r = w_r · x, each as a kernel computes them in float32, differ by at most c_r ||x||_2 + 2^-18 |A_r|, where

    c_r = ||w_r - s_r q_r||_2 + GAMMA (||w_r||_2 + s_r ||q_r||_2),   GAMMA = 2 H 2^-24

(Cauchy-Schwarz for the codes' error; GAMMA bounds the float32 rounding of a dot of H terms, summed in any order,
relative to the sum of the terms' magnitudes; 2^-18 |A_r| the rounding of the final scaling and of A_r +- the
margin). So with T = max_r (A_r - m_r), m_r that margin, the largest E_r (lowest index on ties) lies among the rows
with A_r + m_r >= T: every such row's exact logit is computed by the same dot as the whole lm_head's, and the
argmax over them is the argmax over all rows, bit for bit. Any T' <= T (the kernel's blocks take the largest lower
end published when they look, at least their own) keeps more rows and the same argmax. On the 0.8B's random weights a
step keeps ~600 of its 248,320 rows (int8 codes keep ~5, int5 ~56,000); the copy is 3/8 of the lm_head's bytes.

The codes are stored 6 bits each, as q + 32 (1 .. 63), in chunks of 32 (``pack_codes``): a row is its nibble plane
(H / 2 bytes), then its plane of high bit pairs (H / 4 bytes). Chunk c holds elements 32c .. 32c + 31: nibble bytes
16c .. 16c + 15, four little-endian words j, byte k of word j holding element 8j + k in its low nibble and 8j + 4 + k in
its high one; pair bytes 8c .. 8c + 7, two words m, byte k of word m holding in its bit pair f (bits 2f, 2f + 1) the
top bits of element 8j + k (f = 2 (j - 2m)) or 8j + 4 + k (f = 2 (j - 2m) + 1), j = 2m, 2m + 1. So a shift and a mask
put four codes' top bits under four nibbles, one code a byte.

    codes, rows = screen_tables(lm_head_bits, "bf16")      # uint8 [V, 3H/4], float32 [V, 2] = (s_r, c_r)
    token, candidates = screened_argmax(codes, rows, w, x)  # the numpy statement the kernel must match
"""

from __future__ import annotations

import numpy as np

from ..errors import CheckpointError
from ..model.dtypes import bf16_bits_to_f32

#: Relative rounding the kernel allows for A_r's last multiply and for A_r +- m_r (the |A_r| term of the margin).
MARGIN_REL = 2.0 ** -18
ROWS_PER_CHUNK = 8192  # rows converted at a time (host memory)
LEVELS = 31  # codes in [-LEVELS, LEVELS]
CHUNK = 32  # codes a packed chunk; a row's length must be a multiple of 64 (16-byte aligned packed rows)


def packed_row_bytes(hidden: int) -> int:
    """Bytes of a row of ``hidden`` packed codes: 6 bits a code."""
    return hidden * 3 // 4


def pack_codes(q: np.ndarray) -> np.ndarray:
    """Codes q [V, H] in [-31, 31] as the kernel reads them (module docstring): uint8 [V, 3H/4]."""
    V, H = q.shape
    b = (q.astype(np.int16) + 32).astype(np.uint8).reshape(V, H // CHUNK, 4, 2, 4)  # [row, chunk, j, lo/hi, k]
    nib = (b[:, :, :, 0] & 15) | ((b[:, :, :, 1] & 15) << 4)  # [row, chunk, j, k]: byte k of nibble word j
    top = (b >> 4).reshape(V, H // CHUNK, 2, 2, 2, 4)  # [row, chunk, m, j - 2m, lo/hi, k]
    pairs = np.zeros((V, H // CHUNK, 2, 4), np.uint8)
    for jj in range(2):
        for half in range(2):
            pairs |= top[:, :, :, jj, half] << (2 * (2 * jj + half))
    return np.concatenate([nib.reshape(V, H // 2), pairs.reshape(V, H // 4)], axis=1)


def unpack_codes(packed: np.ndarray) -> np.ndarray:
    """``pack_codes``' inverse: int8 [V, H]."""
    V, H = packed.shape[0], packed.shape[1] * 4 // 3  # packed_row_bytes' inverse
    nib = packed[:, : H // 2].reshape(V, H // CHUNK, 4, 4)
    pairs = packed[:, H // 2 :].reshape(V, H // CHUNK, 2, 4)
    b = np.empty((V, H // CHUNK, 4, 2, 4), np.uint8)
    for j in range(4):
        for half in range(2):
            top = (pairs[:, :, j // 2] >> (2 * (2 * (j % 2) + half))) & 3
            b[:, :, j, half] = ((nib[:, :, j] >> (4 * half)) & 15) | (top << 4)
    return (b.reshape(V, H).astype(np.int16) - 32).astype(np.int8)


def gamma(hidden: int) -> float:
    """Bound on a float32 dot product's rounding error of ``hidden`` terms, relative to the sum of its terms'
    magnitudes, whatever the summation order (n u / (1 - n u) <= 2 n u for n u < 1/2, u = 2^-24)."""
    return 2.0 * hidden * 2.0 ** -24


def norm_slack(hidden: int) -> float:
    """Relative slack on ||x||_2 as the kernel computes it: a float32 sum of ``hidden`` squares (relative error at
    most gamma(hidden)), times its approximate reciprocal root (a few ulp), and the products' roundings."""
    return max(2.0 ** -12, 2 * gamma(hidden))


def _values(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return bf16_bits_to_f32(bits).astype(np.float64)
    if dtype == "fp16":
        return bits.view(np.float16).astype(np.float64)
    raise CheckpointError(f"the lm_head screen reads bf16 or fp16 rows, not {dtype}")


def screen_tables(bits: np.ndarray, dtype: str, name: str = "lm_head") -> tuple[np.ndarray, np.ndarray]:
    """The screen of an lm_head given as its packed uint16 bits [V, H] in ``dtype``: packed codes uint8 [V, 3H/4] and
    float32 (s_r, c_r) [V, 2] (module docstring). A non-finite weight is refused, naming ``name``."""
    V, H = bits.shape
    if H % (2 * CHUNK):
        raise CheckpointError(f"{name}: the screen packs rows of a multiple of {2 * CHUNK} weights, not {H}")
    codes = np.empty((V, packed_row_bytes(H)), np.uint8)
    rows = np.empty((V, 2), np.float32)
    g = gamma(H)
    for r0 in range(0, V, ROWS_PER_CHUNK):
        w = _values(bits[r0 : r0 + ROWS_PER_CHUNK], dtype)
        if not np.isfinite(w).all():
            bad = r0 + int(np.argwhere(~np.isfinite(w))[0][0])
            raise CheckpointError(f"{name}: row {bad} holds a non-finite weight")
        s = (np.abs(w).max(axis=1) / LEVELS).astype(np.float32)
        s64 = s.astype(np.float64)[:, None]
        q = np.clip(np.rint(np.divide(w, s64, out=np.zeros_like(w), where=s64 > 0)), -LEVELS, LEVELS)
        err = np.linalg.norm(w - s64 * q, axis=1)  # exact operands: s q is a 24-bit by 6-bit product
        c = (err + g * (np.linalg.norm(w, axis=1) + s64[:, 0] * np.linalg.norm(q, axis=1))) * (1 + 2.0 ** -30)
        c32 = c.astype(np.float32)
        c32 = np.where(c32.astype(np.float64) < c, np.nextafter(c32, np.float32(np.inf)), c32)
        codes[r0 : r0 + len(w)] = pack_codes(q.astype(np.int8))
        rows[r0 : r0 + len(w), 0] = s
        rows[r0 : r0 + len(w), 1] = c32
    return codes, rows


def screened_argmax(codes: np.ndarray, rows: np.ndarray, w: np.ndarray, x: np.ndarray) -> tuple[int, np.ndarray]:
    """The kernel's screen over every row at once (``codes`` packed; float32 like the kernel; ``w`` the exact rows as
    float32, ``x`` the staged hidden state): the greedy token and the candidate rows whose exact logits were computed."""
    x = np.asarray(x, np.float32)
    codes = unpack_codes(codes)
    xnorm = np.float32(np.sqrt(np.sum(x.astype(np.float64) ** 2)) * (1 + norm_slack(x.size)))
    approx = rows[:, 0] * (codes.astype(np.float32) @ x)
    margin = rows[:, 1] * xnorm + np.float32(MARGIN_REL) * np.abs(approx)
    floor = np.max(approx - margin)
    candidates = np.flatnonzero(~(approx + margin < floor))  # NaN: a candidate
    exact = w[candidates].astype(np.float32) @ x
    return int(candidates[np.argmax(exact)]), candidates

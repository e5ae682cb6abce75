"""The greedy token without reading the whole lm_head: an int8 copy of it screens the rows, and only the rows that
may hold the largest logit are read in full (the megakernel's ``lm_head_screen_phase``,
templates/megakernel/mlp_lm_head.cuh.j2).

Row r of the lm_head, w_r (the packed bf16 / fp16 values), is kept as int8 codes q_r with one float32 scale
s_r = max |w_r| / 127. For the staged hidden state x, the screened logit A_r = s_r (q_r · x) and the exact one
E_r = w_r · x, each as a kernel computes them in float32, differ by at most c_r ||x||_2 + 2^-18 |A_r|, where

    c_r = ||w_r - s_r q_r||_2 + GAMMA (||w_r||_2 + s_r ||q_r||_2),   GAMMA = 2 H 2^-24

(Cauchy-Schwarz for the codes' error; GAMMA bounds the float32 rounding of a dot of H terms, summed in any order,
relative to the sum of the terms' magnitudes; 2^-18 |A_r| the rounding of the final scaling and of A_r +- the
margin). So with T = max_r (A_r - m_r), m_r that margin, the largest E_r (lowest index on ties) lies among the rows
with A_r + m_r >= T: every such row's exact logit is computed by the same dot as the whole lm_head's, and the
argmax over them is the argmax over all rows, bit for bit. Any T' <= T (the kernel's blocks take the largest lower
end published when they look, at least their own) keeps more rows and the same argmax. On the 0.8B's random weights
a step keeps a handful of its 248,320 rows; the copy is half the lm_head's bytes.

    codes, rows = screen_tables(lm_head_bits, "bf16")      # int8 [V, H], float32 [V, 2] = (s_r, c_r)
    token, candidates = screened_argmax(codes, rows, w, x)  # the numpy statement the kernel must match
"""

from __future__ import annotations

import numpy as np

from ..errors import CheckpointError
from ..model.dtypes import bf16_bits_to_f32

#: Relative rounding the kernel allows for A_r's last multiply and for A_r +- m_r (the |A_r| term of the margin).
MARGIN_REL = 2.0 ** -18
ROWS_PER_CHUNK = 8192  # rows converted at a time (host memory)


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
    """The screen of an lm_head given as its packed uint16 bits [V, H] in ``dtype``: int8 codes [V, H] and float32
    (s_r, c_r) [V, 2] (module docstring). A non-finite weight is refused, naming ``name``."""
    V, H = bits.shape
    codes = np.empty((V, H), np.int8)
    rows = np.empty((V, 2), np.float32)
    g = gamma(H)
    for r0 in range(0, V, ROWS_PER_CHUNK):
        w = _values(bits[r0 : r0 + ROWS_PER_CHUNK], dtype)
        if not np.isfinite(w).all():
            bad = r0 + int(np.argwhere(~np.isfinite(w))[0][0])
            raise CheckpointError(f"{name}: row {bad} holds a non-finite weight")
        s = (np.abs(w).max(axis=1) / 127.0).astype(np.float32)
        s64 = s.astype(np.float64)[:, None]
        q = np.clip(np.rint(np.divide(w, s64, out=np.zeros_like(w), where=s64 > 0)), -127, 127)
        err = np.linalg.norm(w - s64 * q, axis=1)  # exact operands: s q is a 24-bit by 8-bit product
        c = (err + g * (np.linalg.norm(w, axis=1) + s64[:, 0] * np.linalg.norm(q, axis=1))) * (1 + 2.0 ** -30)
        c32 = c.astype(np.float32)
        c32 = np.where(c32.astype(np.float64) < c, np.nextafter(c32, np.float32(np.inf)), c32)
        codes[r0 : r0 + len(w)] = q.astype(np.int8)
        rows[r0 : r0 + len(w), 0] = s
        rows[r0 : r0 + len(w), 1] = c32
    return codes, rows


def screened_argmax(codes: np.ndarray, rows: np.ndarray, w: np.ndarray, x: np.ndarray) -> tuple[int, np.ndarray]:
    """The kernel's screen over every row at once (float32 like the kernel; ``w`` the exact rows as float32, ``x``
    the staged hidden state): the greedy token and the candidate rows whose exact logits were computed."""
    x = np.asarray(x, np.float32)
    xnorm = np.float32(np.sqrt(np.sum(x.astype(np.float64) ** 2)) * (1 + norm_slack(x.size)))
    approx = rows[:, 0] * (codes.astype(np.float32) @ x)
    margin = rows[:, 1] * xnorm + np.float32(MARGIN_REL) * np.abs(approx)
    floor = np.max(approx - margin)
    candidates = np.flatnonzero(~(approx + margin < floor))  # NaN: a candidate
    exact = w[candidates].astype(np.float32) @ x
    return int(candidates[np.argmax(exact)]), candidates

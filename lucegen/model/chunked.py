"""The chunked (WY / UT) form of the gated delta rule in numpy: the algorithm ``templates/prefill/deltanet.cu.j2``
runs on the GPU, stated so that it can be checked on the CPU against ``reference.gated_delta_rule`` (the recurrent
form, HF ``torch_recurrent_gated_delta_rule``). It follows HF ``torch_chunk_gated_delta_rule`` / flash-linear-
attention ``chunk_gated_delta_rule``.

Per value head, with T padded to a multiple of the chunk C (pad rows: k = v = beta = 0, g = 0, which leave the state
alone), per chunk of rows:
    gc    = cumsum(g)                                   (within the chunk; gc_last = gc[C-1])
    A     = strictly_lower(beta_i (k_i . k_j) exp(gc_i - gc_j))
    Tm    = (I + A)^-1                                  (forward substitution)
    W     = Tm (beta exp(gc) k),  U = Tm (beta v)
    P     = lower_incl_diag((q_i . k_j) exp(gc_i - gc_j))
  then sequentially over chunks, with the state S [dk, dv]:
    V'    = U - W S
    O     = exp(gc) (q S) + P V'
    S     = exp(gc_last) S + (k exp(gc_last - gc))^T V'
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def unit_lower_inverse(a: np.ndarray) -> np.ndarray:
    """(I + A)^-1 for strictly lower-triangular A [C, C], by forward substitution column by column (the kernel's
    order): T[i][j] = -A[i][j] - sum_{j<m<i} A[i][m] T[m][j] for i > j, T[j][j] = 1."""
    c = a.shape[0]
    t = np.eye(c, dtype=a.dtype)
    for i in range(1, c):
        t[i, :i] = -(a[i, :i] @ t[:i, :i])  # rows < i are final; t[:i, :i] is unit lower triangular
    return t


def chunked_gated_delta_rule(q, k, v, g, beta, state, chunk: int):
    """Same contract as ``reference.gated_delta_rule``: q, k [T, H, dk]; v [T, H, dv]; g, beta [T, H]; state
    [H, dk, dv] float32 updated in place. Returns o [T, H, dv] float32."""
    T, H, dk = q.shape
    dv = v.shape[2]
    n = -(-T // chunk)
    tp = n * chunk

    def padded(x):
        out = np.zeros((tp,) + x.shape[1:], F32)
        out[:T] = x
        return out.reshape((n, chunk) + x.shape[1:])

    qc, kc, vc, gcs, bc = (padded(np.asarray(x, F32)) for x in (q, k, v, g, beta))
    out = np.zeros((n, chunk, H, dv), F32)
    tril_strict = np.tril(np.ones((chunk, chunk), bool), -1)
    tril = np.tril(np.ones((chunk, chunk), bool))
    for h in range(H):
        s = state[h].astype(F32)
        for c in range(n):
            qh, kh, vh, bh = qc[c, :, h], kc[c, :, h], vc[c, :, h], bc[c, :, h]
            gc = np.cumsum(gcs[c, :, h]).astype(F32)
            decay = np.exp(np.where(tril, gc[:, None] - gc[None, :], 0)).astype(F32)  # exp(gc_i - gc_j), j <= i
            a = np.where(tril_strict, bh[:, None] * (kh @ kh.T) * decay, 0).astype(F32)
            tm = unit_lower_inverse(a)
            w = tm @ (bh[:, None] * np.exp(gc)[:, None] * kh)
            u = tm @ (bh[:, None] * vh)
            p = np.where(tril, (qh @ kh.T) * decay, 0).astype(F32)
            v_new = u - w @ s
            out[c, :, h] = np.exp(gc)[:, None] * (qh @ s) + p @ v_new
            g_last = gc[-1]
            s = (np.exp(g_last) * s + (kh * np.exp(g_last - gc)[:, None]).T @ v_new).astype(F32)
        state[h] = s
    return out.reshape(tp, H, dv)[:T]

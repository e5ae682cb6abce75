"""The chunked gated delta rule (lucegen/model/chunked.py, the algorithm of templates/prefill/deltanet.cu.j2) equals
the recurrent one (reference.gated_delta_rule) in float32: same outputs and same final state, for any length
(including lengths that are not multiples of the chunk, and T = 1), chunk size and starting state.

Tolerance: both are float32; the chunked form reassociates sums over up to dk * chunk products of O(1) values (q, k
l2-normalised, |beta| <= 1, decays <= 1), so results agree to ~1e-5 relative; we allow 2e-4 * max(1, max |ref|)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.model.chunked import chunked_gated_delta_rule, unit_lower_inverse
from lucegen.model.reference import _gated_delta_rule_numpy, l2norm, sigmoid

F32 = np.float32


def random_inputs(rng, T, H, dk, dv):
    q = l2norm(rng.standard_normal((T, H, dk)).astype(F32)) * F32(dk ** -0.5)
    k = l2norm(rng.standard_normal((T, H, dk)).astype(F32))
    v = rng.standard_normal((T, H, dv)).astype(F32)
    g = (-np.exp(rng.normal(-1, 1, (T, H))) * rng.uniform(0, 2, (T, H))).astype(F32)
    beta = sigmoid(rng.standard_normal((T, H)).astype(F32))
    state = rng.standard_normal((H, dk, dv)).astype(F32)
    return q, k, v, g, beta, state


def test_unit_lower_inverse():
    rng = np.random.default_rng(0)
    a = np.tril(rng.standard_normal((16, 16)), -1).astype(F32) * F32(0.3)
    np.testing.assert_allclose(unit_lower_inverse(a) @ (np.eye(16, dtype=F32) + a), np.eye(16), atol=1e-4)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 200), chunk=st.sampled_from([16, 32, 64]), heads=st.integers(1, 3),
       seed=st.integers(0, 2 ** 31 - 1))
def test_chunked_equals_recurrent(T, chunk, heads, seed):
    rng = np.random.default_rng(seed)
    q, k, v, g, beta, state = random_inputs(rng, T, heads, 16, 24)
    state_ref, state_chunked = state.copy(), state.copy()
    o_ref = _gated_delta_rule_numpy(q, k, v, g, beta, state_ref)
    o = chunked_gated_delta_rule(q, k, v, g, beta, state_chunked, chunk)
    assert o.shape == o_ref.shape and o.dtype == F32
    tol_o = 2e-4 * max(1.0, float(np.abs(o_ref).max()))
    tol_s = 2e-4 * max(1.0, float(np.abs(state_ref).max()))
    assert np.abs(o - o_ref).max() <= tol_o
    assert np.abs(state_chunked - state_ref).max() <= tol_s


def test_chunked_detects_a_sign_error():
    """The comparison is sharp: flipping the decay of one token changes the result far beyond the tolerance."""
    rng = np.random.default_rng(1)
    q, k, v, g, beta, state = random_inputs(rng, 40, 2, 16, 24)
    s1, s2 = state.copy(), state.copy()
    o_ref = _gated_delta_rule_numpy(q, k, v, g, beta, s1)
    g2 = g.copy()
    g2[17] = -g2[17] * 0.5
    o = chunked_gated_delta_rule(q, k, v, g2, beta, s2, 16)
    assert np.abs(o - o_ref).max() > 1e-2

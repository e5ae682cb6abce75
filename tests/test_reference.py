"""Self-consistency of the numpy reference (its agreement with HF is tests/test_hf_parity.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import init_tensor_f32
from lucegen.model.reference import (Reference, _gated_delta_rule_numpy, gated_delta_rule, rms_norm_1p,
                                     apply_rope, rope_inv_freq)


def random_reference(preset: str, seed: int = 0) -> Reference:
    config = ModelConfig.preset(preset)
    return Reference(config, {n: init_tensor_f32(config, n, seed) for n in config.tensor_shapes()})


@pytest.fixture(scope="module", params=["tiny", "tiny-gqa"])
def ref(request):
    return random_reference(request.param)


def test_prefill_equals_token_by_token_decode(ref):
    tokens = np.random.default_rng(0).integers(0, ref.config.vocab_size, 12)
    a, b = ref.new_state(), ref.new_state()
    prefill = ref.forward(tokens, a)
    stepped = np.concatenate([ref.forward([t], b) for t in tokens])
    np.testing.assert_allclose(prefill, stepped, rtol=1e-5, atol=1e-5)
    assert a.position == b.position == 12
    for la, lb in zip(a.layers, b.layers):
        for field in ("k", "v", "conv", "recurrent"):
            if hasattr(la, field):
                np.testing.assert_allclose(getattr(la, field), getattr(lb, field), rtol=1e-4, atol=1e-5)


def test_split_prefill_and_preallocated_state(ref):
    tokens = np.random.default_rng(1).integers(0, ref.config.vocab_size, 20)
    whole = ref.forward(tokens, ref.new_state(max_len=20))
    state = ref.new_state()  # grows its KV cache on demand
    parts = np.concatenate([ref.forward(tokens[:7], state), ref.forward(tokens[7:], state)])
    np.testing.assert_allclose(whole, parts, rtol=1e-5, atol=1e-5)


def test_hidden_layers_are_the_residual_stream(ref):
    tokens = [5, 9, 2]
    last = ref.config.num_layers - 1
    logits, hidden = ref.forward(tokens, ref.new_state(), hidden_layers=(1, last))
    assert set(hidden) == {1, last} and hidden[1].shape == (3, ref.config.hidden_size)
    final = rms_norm_1p(hidden[last], ref.w["norm.weight"], ref.config.rms_norm_eps) @ ref.lm_head.T
    np.testing.assert_allclose(final, logits, rtol=1e-6, atol=1e-6)
    assert np.abs(hidden[1] - hidden[last]).max() > 0


def test_state_copy_is_independent(ref):
    state = ref.new_state()
    ref.forward([1, 2, 3], state)
    snapshot = state.copy()
    x = ref.forward([4], state)
    y = ref.forward([4], snapshot)
    np.testing.assert_array_equal(x, y)


def test_greedy_is_deterministic_and_in_vocab(ref):
    out = ref.greedy([3, 1, 4, 1, 5], 6)
    assert out == ref.greedy([3, 1, 4, 1, 5], 6)
    assert all(0 <= t < ref.config.vocab_size for t in out)


def test_bad_tokens_are_rejected(ref):
    with pytest.raises(ValueError, match="out of range"):
        ref.forward([ref.config.vocab_size], ref.new_state())


@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 5), h=st.integers(1, 3), dk=st.integers(1, 9), dv=st.integers(1, 9),
       seed=st.integers(0, 2**31))
def test_numba_delta_rule_matches_numpy(t, h, dk, dv, seed):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((t, h, dk)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((t, h, dv)).astype(np.float32)
    g = -rng.uniform(0, 3, (t, h)).astype(np.float32)
    beta = rng.uniform(0, 1, (t, h)).astype(np.float32)
    s0 = rng.standard_normal((h, dk, dv)).astype(np.float32)
    s1, s2 = s0.copy(), s0.copy()
    np.testing.assert_allclose(gated_delta_rule(q, k, v, g, beta, s1), _gated_delta_rule_numpy(q, k, v, g, beta, s2),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(s1, s2, rtol=1e-4, atol=1e-5)


def test_delta_rule_writes_value_at_key_with_beta_one():
    # With decay 0 (g = -inf -> exp 0 would erase; use g = 0, S = 0), beta 1 and unit k, S^T k = v afterwards.
    k = np.zeros((1, 1, 4), np.float32)
    k[0, 0, 2] = 1
    v = np.arange(3, dtype=np.float32).reshape(1, 1, 3)
    state = np.zeros((1, 4, 3), np.float32)
    out = gated_delta_rule(k, k, v, np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32), state)
    np.testing.assert_allclose(out[0, 0], v[0, 0])
    np.testing.assert_allclose(state[0, 2], v[0, 0])


def test_rope_preserves_norm_and_leaves_tail_untouched():
    config = ModelConfig.preset("tiny")
    x = np.random.default_rng(0).standard_normal((5, 2, config.head_dim)).astype(np.float32)
    y = apply_rope(x, np.arange(5) * 1000, rope_inv_freq(config))
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(y[..., config.rotary_dim:], x[..., config.rotary_dim:])
    np.testing.assert_allclose(apply_rope(x, np.zeros(5), rope_inv_freq(config)), x)


def test_rounded_gemm_inputs_variant():
    """gemm_inputs="bf16": projection inputs and the KV cache rounded to bf16 (the prefill's arithmetic); close to the
    f32 model, not equal to it, and its KV cache holds bf16-representable values."""
    from lucegen.model.reference import round_to

    exact = random_reference("tiny-gqa")
    rounded = Reference(exact.config, exact.w, gemm_inputs="bf16")
    tokens = np.arange(40) * 7 % exact.config.vocab_size
    s1, s2 = exact.new_state(), rounded.new_state()
    a, b = exact.forward(tokens, s1), rounded.forward(tokens, s2)
    rel = np.abs(a - b).max() / np.abs(a).max()
    assert 0 < rel < 5e-2
    k = next(layer.k for layer in s2.layers if hasattr(layer, "k"))
    assert np.array_equal(k, round_to(k, "bf16"))
    with pytest.raises(ValueError, match="gemm_inputs"):
        Reference(exact.config, exact.w, gemm_inputs="int8")

"""The lm_head screen (lucegen/runtime/lm_screen.py): its bound holds row by row, its argmax is the whole lm_head's
(ties to the lowest index included), bad weights are refused, and the megakernel renders it where it fits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen import codegen
from lucegen.errors import CheckpointError
from lucegen.model.config import ModelConfig
from lucegen.model.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from lucegen.runtime import lm_screen, packing
from lucegen.target import load_target


def _lm_head(rng, rows: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """Random bf16 rows (bits, float32 values), a few rows scaled up and one all zero."""
    w = rng.standard_normal((rows, hidden)).astype(np.float32) * 0.02
    w[rng.integers(0, rows, 3)] *= 40.0
    w[rows // 2] = 0.0
    bits = f32_to_bf16_bits(w).reshape(rows, hidden)
    return bits, bf16_bits_to_f32(bits)


def _hidden(rng, hidden: int) -> np.ndarray:
    """A staged hidden state with a few large channels, as trained models have."""
    x = rng.standard_normal(hidden).astype(np.float32)
    x[rng.integers(0, hidden, 4)] *= 30.0
    return x


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), hidden=st.sampled_from([64, 256, 1024]))
def test_the_margin_holds_for_every_row(seed, hidden):
    rng = np.random.default_rng(seed)
    bits, w = _lm_head(rng, 600, hidden)
    codes, rows = lm_screen.screen_tables(bits, "bf16")
    x = _hidden(rng, hidden)
    # the worst case for row 0: x along its codes' error
    err0 = w[0].astype(np.float64) - rows[0, 0] * codes[0].astype(np.float64)
    for v in (x, (err0 / max(np.linalg.norm(err0), 1e-30) * np.linalg.norm(x)).astype(np.float32)):
        approx = rows[:, 0] * (codes.astype(np.float32) @ v)
        exact = w @ v
        xnorm = np.sqrt(np.sum(v.astype(np.float64) ** 2))
        margin = rows[:, 1].astype(np.float64) * xnorm + lm_screen.MARGIN_REL * np.abs(approx)
        assert np.all(np.abs(exact.astype(np.float64) - approx) <= margin)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_screened_argmax_is_the_whole_lm_heads(seed):
    rng = np.random.default_rng(seed)
    bits, w = _lm_head(rng, 4000, 256)
    codes, rows = lm_screen.screen_tables(bits, "bf16")
    x = _hidden(rng, 256)
    token, candidates = lm_screen.screened_argmax(codes, rows, w, x)
    assert token == int(np.argmax(w @ x))
    assert token in candidates and len(candidates) < 200  # a screen, not the whole matrix


def test_ties_go_to_the_lowest_row():
    rng = np.random.default_rng(5)
    bits, _ = _lm_head(rng, 1000, 128)
    bits[500:] = bits[:500]  # every row has a twin 500 rows on
    w = bf16_bits_to_f32(bits)
    codes, rows = lm_screen.screen_tables(bits, "bf16")
    for _ in range(20):
        x = _hidden(rng, 128)
        token, candidates = lm_screen.screened_argmax(codes, rows, w, x)
        assert token == int(np.argmax(w @ x)) and token < 500 and token + 500 in candidates


def test_fp16_rows_and_their_values():
    rng = np.random.default_rng(2)
    w16 = (rng.standard_normal((300, 64)) * 0.05).astype(np.float16)
    codes, rows = lm_screen.screen_tables(w16.view(np.uint16), "fp16")
    assert codes.dtype == np.int8 and np.abs(codes).max() == 127
    x = _hidden(rng, 64)
    token, _ = lm_screen.screened_argmax(codes, rows, w16.astype(np.float32), x)
    assert token == int(np.argmax(w16.astype(np.float32) @ x))


def test_refuses_a_non_finite_weight():
    bits = f32_to_bf16_bits(np.ones((20, 32), np.float32)).reshape(20, 32)
    bits[13, 3] = 0x7F80  # +inf
    with pytest.raises(CheckpointError, match="lm_head.weight: row 13 holds a non-finite weight"):
        lm_screen.screen_tables(bits, "bf16", "lm_head.weight")


@pytest.mark.parametrize("target, fits", [("sm_90", True), ("sm_86", True), ("gfx1100", True), ("sm_75", False)])
def test_the_megakernel_renders_the_screen_where_it_fits(target, fits):
    """A block's rows' upper ends (and, past the staging buffer, its candidates) must fit the static shared
    memory beside the matvec carve-up; sm_75's 68 blocks leave each 3,652 of the 0.8B's rows."""
    t = load_target(target)
    params = packing.kernel_params(ModelConfig.preset("qwen3.5-0.8b"), t)
    assert params["lm_screen"] is fits
    assert 4 * params["smem_floats"] <= t.smem_per_block
    source = codegen.render(t, "megakernel/decode.cu.j2", mk=params)
    assert ("void lm_head_screen_phase(" in source) is fits

"""The int8-activation rounding of the quantised target's GEMMs (lucegen/model/quant.py q8_activations), and the
Reference that takes it for named weights (reference.py int8_inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.model import quant
from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import init_tensor_f32
from lucegen.model.reference import Reference


def fp16_rows(rng, rows: int, blocks: int, scale: float) -> np.ndarray:
    x = np.clip(rng.standard_normal((rows, 256 * blocks)) * scale, -65504, 65504)
    return x.astype(np.float16).astype(np.float32)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([1e-6, 1e-3, 1.0, 300.0, 2e4]))
def test_q8_rounding_stays_in_range_and_close(seed, scale):
    """inv is an fp16 value at most 127 / amax (rounded toward zero, so |q| <= 127) and within one fp16 step of it
    (unless it saturates at 65504); q = rint(x inv); the rounded values are within half a step 1 / inv of x."""
    rng = np.random.default_rng(seed)
    x = fp16_rows(rng, 3, 2, scale)
    x[1, :256] = 0
    q, inv = quant.q8_activations(x)
    amax = np.abs(x.reshape(3, 2, 256)).max(axis=-1)
    assert (inv.astype(np.float16).astype(np.float32) == inv).all()
    assert (inv[amax == 0] == 0).all()
    live = amax > 0
    exact = np.float64(127) / np.where(live, amax, 1)
    assert (inv[live] <= exact[live]).all()
    with np.errstate(over="ignore"):
        step = np.spacing(inv.astype(np.float16)).astype(np.float64)
    assert ((inv + step)[live] > exact[live]).all() or (inv[live] == 65504).any()
    assert np.abs(q.astype(np.int32)).max() <= 127
    np.testing.assert_array_equal(q, np.rint(x.reshape(3, 2, 256) * inv[..., None]).reshape(x.shape))
    deq = quant.q8_dequantized(x).reshape(3, 2, 256)
    half_step = 0.5 / np.where(live, inv, np.inf)[..., None]  # and q da's rounding: 127 2^-24 steps at most
    assert (np.abs(deq - x.reshape(3, 2, 256)) <= half_step * (1 + 1e-4)).all()


def test_q8_ties_round_to_even_and_rows_must_be_whole_blocks():
    x = np.full((1, 256), 0.25, np.float32)
    x[0, 0] = 63.5  # inv = 2: 0.25 * 2 = 0.5 rounds to 0, 0.75 * 2 = 1.5 to 2
    x[0, 1] = 0.75
    q, inv = quant.q8_activations(x)
    assert inv[0, 0] == 2 and (q[0, 0], q[0, 1], q[0, 2]) == (127, 2, 0)
    with pytest.raises(ValueError, match="blocks of 256"):
        quant.q8_activations(np.zeros((1, 100), np.float32))


def test_reference_rounds_the_named_weights_inputs_alone():
    """int8_inputs changes the logits, not by much (the inputs of the named weights move by at most half an int8 step;
    random weights then amplify it layer by layer), an empty set changes nothing, and it needs fp16 inputs."""
    config = ModelConfig.preset("tiny-q")  # rows of whole 256-value blocks
    weights = {n: init_tensor_f32(config, n, 5) for n in config.tensor_shapes()}
    plain = Reference(config, weights, gemm_inputs="fp16")
    names = {n for n in config.tensor_shapes() if n.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight",
                                                              "out_proj.weight", "o_proj.weight"))}
    int8 = Reference(config, weights, gemm_inputs="fp16", int8_inputs=names)
    none = Reference(config, weights, gemm_inputs="fp16", int8_inputs=())
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    a, b, c = (r.forward(tokens, r.new_state()) for r in (plain, int8, none))
    np.testing.assert_array_equal(a, c)
    cos = (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert np.abs(a - b).max() > 0 and cos.min() > 0.95, cos
    with pytest.raises(ValueError, match="fp16"):
        Reference(config, weights, gemm_inputs="bf16", int8_inputs=names)

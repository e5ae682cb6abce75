"""The whole prefill path on the GPU (embedding → per-layer GEMMs, DeltaNet / attention token mixing → final norm,
lm_head row, argmax) against the numpy Reference, and the hand-off to the decode megakernel.

Two oracles. The prefill feeds its GEMMs in the compute dtype (bf16 on sm_90), like HF's BF16 model: every
projection input is rounded to 8 mantissa bits, where the decode megakernel keeps f32 activations. So the prefill is
held to ``Reference(gemm_inputs=<compute dtype>)`` (the same model with exactly those inputs rounded, reference.py)
and, more loosely, to the plain f32 Reference.

The bounds sit above each oracle's own noise floor, measured by ``experiments/oracle_floor.py`` (CPU): a bf16 rounding
that lands on the other side of a half-way point moves an input by 2^-8, and the layers after it amplify that, so the
rounded oracle run again with every projection input nudged by one f32 ulp (less than any GPU summation order changes)
already differs from itself by (worst of 40+ prompts x 2 nudges; logits max |err| / max |ref|, 1 - cosine, worst state
max |err| / max |ref|):
  tiny       4.2e-3, 2.1e-5, 9.2e-3   (rounded vs f32: 9.1e-3, 9.8e-5, 1.8e-2)
  tiny-gqa   3.1e-2, 4.3e-4, 3.8e-2   (rounded vs f32: 4.4e-2, 7.9e-4, 5.7e-2)
  0.8B       3.5e-2, 6.4e-4, 7.4e-2   (rounded vs f32: 5.3e-2, 1.8e-3, 1.1e-1; T = 1, 64, 333, 520, 1100)
tiny-gqa's single KV head makes its attention layers the most sensitive (the layer-7 KV k at 671 tokens moved 2.6%
under the nudge; the kernels were 2.3% off there). Each bound is about twice its floor (the f32 oracle's: the
rounding's own distance plus the floor); a kernel bug shows up as errors of order one.
Greedy tokens are compared only where the oracle's top-1 margin exceeds twice the measured error.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lucegen.errors import LucegenError
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.reference import Reference

from gpu_models import checkpoint_dir, compare, gpu_device, state_errors  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

#: per oracle: (max |err| / max |ref| of the last-row logits, min cosine, state max |err| / max |ref|)
BOUNDS = {
    "tiny": {"rounded": (2e-2, 0.9999, 2e-2), "f32": (5e-2, 0.9995, 5e-2)},
    "tiny-gqa": {"rounded": (6e-2, 0.999, 8e-2), "f32": (1.5e-1, 0.997, 1.5e-1)},
    "0.8b": {"rounded": (7e-2, 0.998, 1.5e-1), "f32": (1.5e-1, 0.995, 2.5e-1)},
    "tiny-q": {"rounded": (6e-2, 0.999, 8e-2), "f32": (1.5e-1, 0.997, 1.5e-1)},
}
BOUNDS["tiny-q-legacy"] = BOUNDS["tiny-q"]  # the same model in llama.cpp's older Q4_K_M mix
F32_TOL_REL, F32_COS_MIN = BOUNDS["tiny"]["f32"][:2]
TOL_REL, COS_MIN = BOUNDS["tiny"]["rounded"][:2]


@functools.cache
def engine(path: str, max_context: int, segment: int | None = None):
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.runtime.prefill.runner import Prefiller

    ckpt = load_checkpoint(path)
    dec = MegakernelDecoder(ckpt, device=gpu_device(), max_context=max_context)
    refs = (Reference(ckpt.config, ckpt, gemm_inputs=dec.target.compute_dtype), Reference(ckpt.config, ckpt))
    return dec, Prefiller(dec, segment=segment), refs


def check_prefill(path: str, tokens: np.ndarray, *, max_context: int, segment: int | None = None,
                  pre_tokens: np.ndarray | None = None, bounds: dict = BOUNDS["tiny"]) -> dict:
    """Prefill ``tokens`` (after ``pre_tokens``, also prefilled through the kernels) and compare the last-row logits,
    the greedy token and every state with both oracles (module docstring)."""
    dec, pre, (rounded, exact) = engine(path, max_context, segment)
    dec.reset()
    states = [r.new_state(max_context) for r in (rounded, exact)]
    if pre_tokens is not None:
        pre.prefill(pre_tokens)
        for r, state in zip((rounded, exact), states):
            r.forward(pre_tokens, state, logits="none")
    token, logits = pre.prefill(tokens, logits=True)
    assert not np.isnan(logits).any()
    assert token == int(np.argmax(logits)), "the device argmax is the argmax of the logits it wrote"
    got = dec.download_state()
    m = {"T": int(tokens.size)}
    for name, r, state in (("rounded", rounded, states[0]), ("f32", exact, states[1])):
        tol, cos_min, state_tol = bounds[name]
        want = r.forward(tokens, state, logits="last")[0]
        c = compare(logits, want)
        assert got["position"] == state.position == dec.position
        worst = state_errors(got, state)
        m[name] = dict(c, **{f"state_{k}": round(v, 5) for k, (v, _) in worst.items()})
        assert c["rel"] <= tol and c["cos"] >= cos_min, m
        if c["decided"]:
            assert token == int(np.argmax(want)), m
        bad = {k: v for k, v in worst.items() if v[0] > state_tol}
        assert not bad, f"{name} oracle: states off (relative error, layer): {bad}; {m}"
    return m


@pytest.mark.parametrize("preset", ["tiny", "tiny-gqa"])
def test_prefill_matches_reference(preset):
    tokens = np.random.default_rng(3).integers(0, 512, 197).astype(np.int32)
    print(check_prefill(str(checkpoint_dir(preset)), tokens, max_context=4200, bounds=BOUNDS[preset]))


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
# Found by hypothesis on 2026-11-22 against the earlier bounds, which sat below the oracle's own noise floor
# (logit cosine 0.99990 < 0.9999; layer-7 KV k 2.3% off where a one-ulp nudge of the oracle moves it 2.6%).
@example(length=671, seed=8009, preset="tiny-gqa")
@example(length=721, seed=8011, preset="tiny-gqa")
@given(length=st.one_of(st.integers(1, 80), st.integers(81, 4096)), seed=st.integers(0, 2**16),
       preset=st.sampled_from(["tiny", "tiny-gqa"]))
def test_prefill_property(length, seed, preset):
    tokens = np.random.default_rng(seed).integers(0, 512, length).astype(np.int32)
    check_prefill(str(checkpoint_dir(preset)), tokens, max_context=4200, bounds=BOUNDS[preset])


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(first=st.integers(1, 150), second=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_prefill_in_segments_and_after_a_cache(first, second, seed):
    """A 100-token segment limit splits long prompts; a second prompt continues from the first one's state."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 512, first).astype(np.int32)
    b = rng.integers(0, 512, second).astype(np.int32)
    check_prefill(str(checkpoint_dir("tiny-gqa")), b, max_context=512, segment=100, pre_tokens=a,
                  bounds=BOUNDS["tiny-gqa"])


def test_decode_after_prefill_equals_decode_after_token_by_token_prefill():
    """The megakernel continues from the prefill's state as from its own token-by-token prefill: the two differ only
    by the prefill's bf16 GEMM inputs (F32 bounds), and each is close to the oracle of its own arithmetic."""
    dec, pre, (rounded, exact) = engine(str(checkpoint_dir("tiny")), 4200)
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, 512, 150).astype(np.int32)
    cont = rng.integers(0, 512, 32).astype(np.int32)
    dec.reset()
    pre.prefill(prompt)
    a = dec.run(cont, logits=True).logits
    dec.reset()
    dec.prefill(prompt)
    b = dec.run(cont, logits=True).logits
    state = exact.new_state(200)
    exact.forward(prompt, state, logits="none")
    want = exact.forward(cont, state)
    for x, y, tol, cos_min in ((a, b, F32_TOL_REL, F32_COS_MIN), (b, want, TOL_REL, COS_MIN),
                               (a, want, F32_TOL_REL, F32_COS_MIN)):
        for row_x, row_y in zip(x, y):
            c = compare(row_x, row_y)
            assert c["rel"] <= tol and c["cos"] >= cos_min, c


def test_refuses_prompt_longer_than_context():
    dec, pre, _ = engine(str(checkpoint_dir("tiny")), 64)
    dec.reset()
    with pytest.raises(LucegenError, match="exceed the allocated context"):
        pre.prefill(np.zeros(65, np.int32))
    with pytest.raises(LucegenError, match="out of range"):
        pre.prefill(np.array([512], np.int32))


@pytest.mark.skipif(not os.environ.get("LUCEGEN_08B_DIR"), reason="set LUCEGEN_08B_DIR to a 0.8B checkpoint")
@pytest.mark.parametrize("length", [1, 333, 1100])
def test_prefill_08b(length):
    tokens = np.random.default_rng(length).integers(0, 248320, length).astype(np.int32)
    print(check_prefill(os.environ["LUCEGEN_08B_DIR"], tokens, max_context=1200, bounds=BOUNDS["0.8b"]))

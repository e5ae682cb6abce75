"""Sampling on the device (lucegen/model/sampling.py's rule): the megakernel's sampled instance and the quantised
target's rows_sample draw the token the reference draws from the same logits, sampled decoding is reproducible,
greedy decoding is unchanged, and the speculative loop's sampled verify runs on the device's logits.

The reference draw from a row of logits z at the step (position) p is argmax_i(z_i / T + g_i(seed, p)), g the
Gumbel noise of Philox4x32-10 (bit for bit the kernels': tests/test_sampling.py compiles the kernels' Philox for the
CPU). The kernels compute z_i / T + g_i in float32 (logf), the reference in float64: the keys differ by a few float32
ulps, so a token is compared where the reference's top-2 key margin exceeds MARGIN (else either is correct within
rounding); the share of such steps is reported and must be high.
"""

from __future__ import annotations

import numpy as np
import pytest

from lucegen.model.sampling import SamplingParams, gumbel_noise

from test_tree_verify import engine, start  # tests/gpu/test_tree_verify.py

pytestmark = pytest.mark.gpu

MARGIN = 1e-3
HOT = SamplingParams(temperature=0.7, seed=20261128)


def reference_keys(logits: np.ndarray, params: SamplingParams, steps) -> np.ndarray:
    """[rows, vocab] float64: the reference's Gumbel-max keys of each row at its step."""
    z = (np.asarray(logits, np.float32) / np.float32(params.temperature)).astype(np.float64)
    return np.stack([row + gumbel_noise(params.seed, int(step), row.size) for row, step in zip(z, steps)])


def check_draws(tokens: np.ndarray, logits: np.ndarray, params: SamplingParams, steps) -> dict:
    keys = reference_keys(logits, params, steps)
    top2 = np.sort(keys, axis=1)[:, -2:]
    decided = top2[:, 1] - top2[:, 0] > MARGIN * np.maximum(1.0, np.abs(top2[:, 1]))
    want = keys.argmax(axis=1)
    wrong = np.nonzero(decided & (np.asarray(tokens) != want))[0]
    assert wrong.size == 0, f"rows {wrong.tolist()}: device {np.asarray(tokens)[wrong]}, reference {want[wrong]}"
    assert decided.mean() >= 0.9, f"only {decided.mean():.0%} of the draws are decided"
    return {"rows": int(len(tokens)), "decided": float(decided.mean())}


@pytest.mark.parametrize("preset", ["tiny", "tiny-q"])
def test_rows_sample_draws_the_reference_token(preset):
    """rows_sample over random rows of logits (each row split over blocks) at a position in device memory."""
    dec, _, ver = engine(preset)
    V, rng = dec.config.vocab_size, np.random.default_rng(11)
    for S, pos0 in ((1, 0), (3, 77), (ver.slots, 2**20)):
        for trial in range(8):
            logits = (3 * rng.standard_normal((S, V))).astype(np.float32)
            ver.device.upload(logits, ver.logits)
            ver.device.upload(np.array([pos0], np.int32), ver.pos0)
            params = SamplingParams(temperature=float(rng.uniform(0.3, 1.5)), seed=int(rng.integers(2**63)))
            ver._enqueue_sample(S, params)
            ver.stream.synchronize()
            got = ver.device.download(ver.argmax, np.int32, (S,))
            print(preset, S, check_draws(got, logits, params, pos0 + 1 + np.arange(S)))


def test_megakernel_sampled_steps_draw_from_their_own_logits():
    """The sampled instance: every step's token (teacher-forced prefill steps too) is the reference's draw from
    the logits that step computed, at the position the token takes."""
    dec, _, _ = engine("tiny")
    dec.reset()
    prompt = np.random.default_rng(3).integers(0, dec.config.vocab_size, 24).astype(np.int32)
    first = dec.prefill(prompt, logits=True, sampling=HOT)
    print(check_draws(first.tokens, first.logits, HOT, 1 + np.arange(prompt.size)))
    start_pos = dec.position
    rest = dec.run([dec.next_token], 40, logits=True, sampling=HOT)
    print(check_draws(rest.tokens, rest.logits, HOT, start_pos + 1 + np.arange(40)))


def test_sampled_decoding_is_reproducible_and_greedy_is_unchanged():
    dec, _, _ = engine("tiny")
    prompt = np.arange(5, 37, dtype=np.int32)

    def run(sampling):
        dec.reset()
        dec.prefill(prompt, sampling=sampling)
        return dec.generate(48, chunk=16, sampling=sampling)

    greedy = run(None)
    sampled = run(HOT)
    assert run(HOT) == sampled, "a seed fixes the tokens"
    assert run(SamplingParams(temperature=0.7, seed=HOT.seed + 1)) != sampled
    assert sampled != greedy
    assert run(None) == greedy == run(SamplingParams(temperature=0.0, seed=5)), "greedy keeps the greedy instance"


def test_megakernel_host_drawn_filters_follow_the_reference():
    """top-k / top-p steps are drawn on the host from each step's logits: top_k = 1 is greedy whatever the
    temperature."""
    dec, _, _ = engine("tiny")
    prompt = np.arange(9, 30, dtype=np.int32)
    dec.reset()
    dec.prefill(prompt)
    greedy = dec.generate(20)
    dec.reset()
    dec.prefill(prompt, sampling=SamplingParams(temperature=1.3, top_k=1, seed=4))
    assert dec.generate(20, sampling=SamplingParams(temperature=1.3, top_k=1, seed=4)) == greedy


@pytest.mark.parametrize("preset", ["tiny-q", "tiny"])
def test_one_slot_sampled_decode_is_the_host_draw(preset):
    """TreeVerifier.decode with sampling (rows_sample, every step queued on the device) emits what the host draws
    from the same one-slot passes' logits (TreeVerifier.greedy with sampling): the passes are the same bits, and
    the float32 / float64 keys differ only within MARGIN, which a near tie of Gumbel-perturbed keys reaches with
    probability ~1e-5 a step."""
    dec, _, ver = engine(preset)
    prompt = list(range(3, 40))
    start(preset, prompt)
    on_device = ver.decode(32, sampling=HOT)
    start(preset, prompt)
    on_host = ver.greedy(32, sampling=HOT)
    assert on_device == on_host
    start(preset, prompt)
    greedy = ver.decode(32)  # after the sampled graphs: the greedy ones
    start(preset, prompt)
    assert ver.greedy(32) == greedy


@pytest.mark.parametrize("preset", ["tiny-q", "tiny"])
def test_speculative_sampling_on_device_logits(preset):
    """The sampled speculative loop over the device's verify logits: with top_k = 1 every draw is the target's
    argmax, so an oracle draft of the greedy continuation is accepted whole and the output is the greedy one; with
    an empty tree (budget 0) it is plain sampling through one-slot passes, token for token."""
    from lucegen.runtime.dflash import OracleDrafter, SpecDecoder

    dec, _, ver = engine(preset)
    prompt = list(range(11, 50))
    first = start(preset, prompt)
    greedy = ver.greedy(40)
    first_sampled = start(preset, prompt)
    assert first_sampled == first
    spec = SpecDecoder(ver, OracleDrafter(greedy, dec.config.vocab_size, depth=6, k=2))
    assert spec.generate(40, sampling=SamplingParams(temperature=1.0, top_k=1, seed=9)) == greedy
    assert spec.stats.acceptance_length > 4
    start(preset, prompt)
    plain = ver.greedy(24, sampling=HOT)
    start(preset, prompt)
    assert SpecDecoder(ver, OracleDrafter(greedy, dec.config.vocab_size), budget=0).generate(24, sampling=HOT) == plain

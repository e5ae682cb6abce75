"""The reference sampler: Philox4x32-10 against Random123's known answers, each filter's rule, the draw's inverse CDF,
parameter validation, and the distribution of many draws."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lucegen.errors import LucegenError
from lucegen.model.sampling import (ACCEPT_STREAM, NOISE_STREAM, SamplingParams, apply_penalties, draw, gumbel_noise,
                                    kept_weights, philox4x32, philox4x32_lanes, philox_uniform, probabilities, sample)

# Random123's tests/kat_vectors, the "philox4x32 10" lines: counter words, key words, output words
PHILOX_KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_philox_known_answers(counter, key, expected):
    assert philox4x32(counter, key) == expected


def test_philox_uniform_is_a_function_of_seed_step_lane_stream():
    u = philox_uniform(7, 3, 0)
    assert u == philox_uniform(7, 3, 0)
    assert 0 < u < 1 and (u * 2**24) % 2 == 1  # (k + 0.5) 2**-23: exact in float32, never 0 or 1
    draws = {philox_uniform(s, t, lane, stream) for s in (0, 1, 2**40) for t in (0, 1, 2**33) for lane in (0, 1)
             for stream in (NOISE_STREAM, ACCEPT_STREAM)}
    assert len(draws) == 36
    # the seed's high word is the key's second word, the step's high word the counter's second word
    assert philox_uniform(2**32 + 5, 2**32 + 9, 3, 1) == ((philox4x32((9, 1, 3, 1), (5, 1))[0] >> 9) + 0.5) / 2**23


def test_vectorised_philox_is_the_scalar_one():
    lanes = np.array([0, 1, 2, 1000, 2**32 - 1], np.uint64)
    words = philox4x32_lanes((17, 3), lanes, 0, (0xDEADBEEF, 12))
    assert words.tolist() == [philox4x32((17, 3, int(lane), 0), (0xDEADBEEF, 12))[0] for lane in lanes]
    u = ((int(words[1]) >> 9) + 0.5) / 2**23
    assert gumbel_noise(0xDEADBEEF + (12 << 32), 17 + (3 << 32), 2)[1] == -math.log(-math.log(u))


def test_uniforms_are_uniform():
    u = np.array([philox_uniform(11, step) for step in range(20000)])
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    chi2 = ((counts - 1000) ** 2 / 1000).sum()
    assert chi2 < 43.8  # chi-square, 19 degrees of freedom, p = 0.001


@pytest.mark.parametrize("field,value", [("temperature", -0.1), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
                                         ("min_p", 1.0), ("min_p", -0.1), ("seed", -1), ("seed", 2**64),
                                         ("temperature", float("nan")), ("top_k", 2.5),
                                         ("repetition_penalty", 0.0), ("temperature", "hot")])
def test_validate_names_the_field_and_value(field, value):
    with pytest.raises(LucegenError, match=f"{field}={value!r}"):
        SamplingParams(**{field: value}).validate()


def test_valid_params_pass():
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=2**64 - 1)
    assert params.validate() is params


def test_greedy_is_argmax_lowest_index_on_ties():
    logits = np.array([1.0, 3.0, 3.0, -2.0], np.float32)
    assert all(sample(logits, SamplingParams(), step) == 1 for step in range(5))


def test_top_k_keeps_ties_at_the_boundary():
    z = np.array([0.0, 5.0, 4.0, 4.0, 1.0], np.float32)
    w = kept_weights(z, SamplingParams(temperature=1.0, top_k=2))
    assert (w > 0).tolist() == [False, True, True, True, False]
    w = kept_weights(z, SamplingParams(temperature=1.0, top_k=1))
    assert (w > 0).tolist() == [False, True, False, False, False]


def test_top_p_keeps_the_smallest_prefix_by_value():
    p = np.array([0.1, 0.5, 0.25, 0.15])
    z = np.log(p).astype(np.float32)
    keep = lambda top_p: (kept_weights(z, SamplingParams(temperature=1.0, top_p=top_p)) > 0).tolist()  # noqa: E731
    assert keep(0.5) == [False, True, False, False]         # mass above 0.5 is 0: only the mode
    assert keep(0.51) == [False, True, True, False]
    assert keep(0.76) == [False, True, True, True]
    assert keep(0.89) == [False, True, True, True]
    assert keep(0.91) == [True, True, True, True]
    tied = np.log(np.array([0.4, 0.4, 0.2])).astype(np.float32)
    assert (kept_weights(tied, SamplingParams(temperature=1.0, top_p=0.1)) > 0).tolist() == [True, True, False]


def test_min_p_is_relative_to_the_mode():
    z = np.log(np.array([0.5, 0.3, 0.04, 0.16])).astype(np.float32)
    keep = kept_weights(z, SamplingParams(temperature=1.0, min_p=0.1)) > 0
    assert keep.tolist() == [True, True, False, True]


def test_filters_compose_in_order():
    z = np.log(np.array([0.05, 0.4, 0.3, 0.2, 0.05])).astype(np.float32)
    # top-k 3 keeps {1, 2, 3}; renormalised (0.444, 0.333, 0.222); top-p 0.7 keeps {1, 2}; min-p 0.8 keeps {1}
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.7)
    assert (kept_weights(z, params) > 0).tolist() == [False, True, True, False, False]
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.7, min_p=0.8)
    assert (kept_weights(z, params) > 0).tolist() == [False, True, False, False, False]


def test_temperature_sharpens():
    z = np.array([0.0, 1.0], np.float32)
    p_hot, p_cold = probabilities(z, SamplingParams(temperature=2.0)), probabilities(z, SamplingParams(temperature=0.5))
    assert math.isclose(p_hot[1] / p_hot[0], math.exp(0.5)) and math.isclose(p_cold[1] / p_cold[0], math.exp(2.0))


def test_draw_is_the_gumbel_argmax_over_kept_tokens():
    w = np.array([0.0, 1.0, 0.0, 2.0, 1.0])
    for step in range(200):
        g = gumbel_noise(5, step, 5)
        assert draw(w, 5, step) == int(np.argmax(np.where(w > 0, np.log(np.maximum(w, 1e-300)) + g, -np.inf)))
    assert {draw(w, 5, step) for step in range(200)} == {1, 3, 4}


def test_penalties():
    z = np.array([2.0, -2.0, 1.0, 0.5], np.float32)
    out = apply_penalties(z, SamplingParams(repetition_penalty=2.0), [0, 1, 1])
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]
    out = apply_penalties(z, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), [0, 1, 1])
    assert out.tolist() == [2.0 - 0.75, -2.0 - 1.0, 1.0, 0.5]
    with pytest.raises(LucegenError, match="history token 9"):
        apply_penalties(z, SamplingParams(presence_penalty=1.0), [9])


def test_sample_is_reproducible_and_follows_the_distribution():
    z = np.log(np.array([0.1, 0.2, 0.3, 0.4])).astype(np.float32)
    params = SamplingParams(temperature=1.0, seed=1234)
    tokens = [sample(z, params, step) for step in range(8000)]
    assert tokens[7] == draw(np.array([0.1, 0.2, 0.3, 0.4]), 1234, 7)
    assert tokens[:50] == [sample(z, params, step) for step in range(50)]
    counts = np.bincount(tokens, minlength=4)
    expected = 8000 * np.array([0.1, 0.2, 0.3, 0.4])
    assert ((counts - expected) ** 2 / expected).sum() < 16.27  # chi-square, 3 degrees of freedom, p = 0.001
    other_seed = [sample(z, SamplingParams(temperature=1.0, seed=1235), step) for step in range(50)]
    assert other_seed != tokens[:50]


def test_bad_logits():
    with pytest.raises(LucegenError, match="one non-empty row"):
        sample(np.zeros((2, 3)), SamplingParams(temperature=1.0), 0)
    with pytest.raises(LucegenError, match="NaN"):
        sample(np.array([0.0, np.nan]), SamplingParams(temperature=1.0), 0)
    with pytest.raises(LucegenError, match="-inf"):
        sample(np.array([-np.inf, -np.inf]), SamplingParams(temperature=1.0), 0)


def test_the_kernels_philox_and_noise_are_the_reference(tmp_path):
    """templates/common/philox.cuh.j2, compiled for the host by a C++ compiler (its device qualifiers defined away):
    Philox's first word equals philox4x32's bit for bit and the Gumbel noise gumbel_noise's to float precision."""
    import shutil
    import subprocess

    from lucegen import codegen
    from lucegen.target import load_target

    compiler = shutil.which("g++") or shutil.which("clang++") or shutil.which("clang++-19")
    if compiler is None:
        pytest.skip("no host C++ compiler (g++ or clang++) to run the kernels' Philox on the CPU")
    source = codegen.render_string(load_target("sm_90"), '{% include "common/philox.cuh.j2" %}')
    cases = [(0, 0, 0), (7, 3, 5), (2**64 - 1, 2**40 + 3, 248_319), (0xDEADBEEF12345678, 17, 1000)]
    main = "\n".join(f'  show({seed}ull, {step}ull, {token}u);' for seed, step, token in cases)
    program = tmp_path / "philox.cpp"
    program.write_text("#include <math.h>\n#include <stdio.h>\n#define __device__\n"
                       "#define __forceinline__ inline\n" + source +
                       "\nvoid show(unsigned long long seed, unsigned long long step, unsigned token) {\n"
                       "  printf(\"%u %.9g\\n\", lg_philox_word0((unsigned)step, (unsigned)(step >> 32), token, 0u,"
                       " (unsigned)seed, (unsigned)(seed >> 32)), lg_gumbel_noise(seed, step, token));\n}\n"
                       "int main() {\n" + main + "\n}\n")
    subprocess.run([compiler, "-O1", "-o", str(tmp_path / "philox"), str(program)], check=True)
    lines = subprocess.run([str(tmp_path / "philox")], check=True, capture_output=True, text=True).stdout.split("\n")
    for (seed, step, token), line in zip(cases, lines):
        word, noise = line.split()
        key = (seed & 0xFFFFFFFF, seed >> 32)
        assert int(word) == philox4x32((step & 0xFFFFFFFF, step >> 32, token, NOISE_STREAM), key)[0]
        assert float(noise) == pytest.approx(gumbel_noise(seed, step, token + 1)[token], rel=1e-6, abs=1e-6)

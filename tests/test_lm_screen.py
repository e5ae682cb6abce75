"""The lm_head screen (lucegen/model/lm_screen.py): its bound holds row by row, its argmax is the whole lm_head's
(ties to the lowest index included), bad weights are refused, and the megakernel renders it where it fits."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen import codegen
from lucegen.errors import CheckpointError
from lucegen.families.megakernel import kernel_params
from lucegen.model import lm_screen
from lucegen.model.config import ModelConfig
from lucegen.model.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
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
    packed, rows = lm_screen.screen_tables(bits, "bf16")
    codes = lm_screen.unpack_codes(packed)
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
    assert codes.dtype == np.uint8 and codes.shape == (300, 48)
    assert np.abs(lm_screen.unpack_codes(codes)).max() == lm_screen.LEVELS
    x = _hidden(rng, 64)
    token, _ = lm_screen.screened_argmax(codes, rows, w16.astype(np.float32), x)
    assert token == int(np.argmax(w16.astype(np.float32) @ x))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 9), chunks=st.integers(1, 6))
def test_codes_pack_six_bits_each_and_back(seed, rows, chunks):
    q = np.random.default_rng(seed).integers(-lm_screen.LEVELS, lm_screen.LEVELS + 1, (rows, 64 * chunks))
    packed = lm_screen.pack_codes(q.astype(np.int8))
    assert packed.dtype == np.uint8 and packed.shape == (rows, 48 * chunks)
    np.testing.assert_array_equal(lm_screen.unpack_codes(packed), q)


def test_codes_layout_is_the_kernels(tmp_path):
    """The kernel's reading of a chunk (templates/megakernel/code6.j2: the code6_unpack macro, which
    RowFormat<code6_t>::dot renders inline), rendered into a host function and compiled by a C++ compiler: for random
    rows packed by pack_codes, byte k of nibble word j's two unpacked words, minus 32, is element 8j + k and 8j + 4 + k
    of its chunk."""
    compiler = shutil.which("g++") or shutil.which("clang++") or shutil.which("clang++-19")
    if compiler is None:
        pytest.skip("no host C++ compiler (g++ or clang++) to run the kernel's code unpacking on the CPU")
    source = codegen.render_string(load_target("sm_90"), """{% from "megakernel/code6.j2" import code6_unpack %}
static void code6_unpack(unsigned nib, unsigned u, int j, unsigned& lo_out, unsigned& hi_out) {
  {{ code6_unpack("nib", "u", "j", "  ") }}
  lo_out = lo;
  hi_out = hi;
}""")
    program = tmp_path / "code6.cpp"
    program.write_text("#include <stdio.h>\n#include <string.h>\n" + source + """
int main() {  // stdin: packed rows of H codes (3H/4 bytes each); stdout: the unpacked codes, a byte each
  int H;
  if (scanf("%d", &H) != 1 || getchar() != '\\n') return 1;
  static unsigned char row[3 << 14], out[1 << 16];
  while (fread(row, 1, H / 4 * 3, stdin) == (size_t)(H / 4 * 3)) {
    for (int c = 0; c < H / 32; ++c)
      for (int j = 0; j < 4; ++j) {
        unsigned nib, u, lo, hi;
        memcpy(&nib, row + 16 * c + 4 * j, 4);
        memcpy(&u, row + H / 2 + 8 * c + 4 * (j >> 1), 4);
        code6_unpack(nib, u, j, lo, hi);
        for (int k = 0; k < 4; ++k) {
          out[32 * c + 8 * j + k] = (unsigned char)(lo >> 8 * k);
          out[32 * c + 8 * j + 4 + k] = (unsigned char)(hi >> 8 * k);
        }
      }
    fwrite(out, 1, H, stdout);
  }
  return 0;
}
""")
    subprocess.run([compiler, "-O1", "-o", str(tmp_path / "code6"), str(program)], check=True)
    rng = np.random.default_rng(3)
    for H in (64, 128, 1024):
        q = rng.integers(-lm_screen.LEVELS, lm_screen.LEVELS + 1, (50, H)).astype(np.int8)
        q[0] = -lm_screen.LEVELS  # every bit pattern's extremes: codes + 32 of 1 and 63
        q[1] = lm_screen.LEVELS
        packed = lm_screen.pack_codes(q)
        run = subprocess.run([str(tmp_path / "code6")], input=f"{H}\n".encode() + packed.tobytes(), check=True,
                             capture_output=True)
        unpacked = np.frombuffer(run.stdout, np.uint8).reshape(q.shape).astype(np.int16) - 32
        np.testing.assert_array_equal(unpacked, q)


def test_refuses_a_row_length_it_cannot_pack():
    bits = f32_to_bf16_bits(np.ones((4, 96), np.float32)).reshape(4, 96)
    with pytest.raises(CheckpointError, match="lm_head: the screen packs rows of a multiple of 64 weights, not 96"):
        lm_screen.screen_tables(bits, "bf16")


def test_refuses_a_non_finite_weight():
    bits = f32_to_bf16_bits(np.ones((20, 64), np.float32)).reshape(20, 64)
    bits[13, 3] = 0x7F80  # +inf
    with pytest.raises(CheckpointError, match="lm_head.weight: row 13 holds a non-finite weight"):
        lm_screen.screen_tables(bits, "bf16", "lm_head.weight")


@pytest.mark.parametrize("target, fits", [("sm_90", True), ("sm_86", True), ("gfx1100", True), ("sm_75", False)])
def test_the_megakernel_renders_the_screen_where_it_fits(target, fits):
    """A block's rows' upper ends (and, past the staging buffer, its candidates) must fit the static shared
    memory beside the matvec carve-up; sm_75's 68 blocks leave each 3,652 of the 0.8B's rows."""
    t = load_target(target)
    params = kernel_params(ModelConfig.preset("qwen3.5-0.8b"), t)
    assert params["lm_screen"] is fits
    assert 4 * params["smem_floats"] <= t.smem_per_block
    source = codegen.render(t, "megakernel/decode.cu.j2", mk=params)
    assert ("void lm_head_screen_phase(" in source) is fits
    # the unpacking that test_codes_layout_is_the_kernels runs on the host, rendered inline in RowFormat<code6_t>::dot
    unpack = codegen.render_string(t, '{% from "megakernel/code6.j2" import code6_unpack %}'
                                      '{{ code6_unpack("nib[j]", "u", "j", "      ") }}')
    assert "const unsigned u = pairs[j >> 1];\n      " + unpack + "\n" in source

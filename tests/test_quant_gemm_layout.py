"""The quantised GEMM's weight layout (lucegen/runtime/quant_tiles.py): tile_pack is a byte permutation that
tile_unpack inverts, every lane chunk holds the bytes the template's fragments read, and the work plan depends on
the matrix alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.errors import LucegenError
from lucegen.families.quant_gemm import GEMM_TYPES
from lucegen.model import quant
from lucegen.model.quant import TYPES
from lucegen.runtime.quant_gemm import plan_parts
from lucegen.runtime.quant_tiles import _tile_map, tile_bytes, tile_pack, tile_unpack


@settings(max_examples=30, deadline=None)
@given(qtype=st.sampled_from(GEMM_TYPES), rows=st.integers(1, 40), blocks=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1))
def test_pack_unpack_round_trip(qtype, rows, blocks, seed):
    _, values, size = TYPES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, rows * blocks * size, dtype=np.uint8)
    packed = tile_pack(raw, qtype, rows, blocks * values)
    assert packed.size == tile_bytes(qtype, rows, blocks * values)
    np.testing.assert_array_equal(tile_unpack(packed, qtype, rows, blocks * values), raw)
    # byte i of every tile-block is byte _tile_map[i] of its 16 rows' block (the pack moves words, the map bytes)
    padded = np.zeros((-(-rows // 16) * 16, blocks, size), np.uint8)
    padded[:rows] = raw.reshape(rows, blocks, size)
    per_block = padded.reshape(-1, 16, blocks, size).transpose(0, 2, 1, 3).reshape(-1, blocks, 16 * size)
    np.testing.assert_array_equal(packed, per_block[:, :, _tile_map(qtype)].reshape(-1))


def test_q4_k_lane_chunk_holds_its_fragment_bytes():
    """Lane l = 4 g + t, chunk p: words (row g, j = 0), (row g, j = 1), (row g + 8, j = 0), (row g + 8, j = 1), word
    (row, j) = qs bytes 32 p + 16 j + 4 t .. + 3 of that row (qs starts at byte 16 of a Q4_K block)."""
    m = _tile_map("Q4_K")
    for p in range(4):
        for lane in range(32):
            g, t = divmod(lane, 4)
            for w, (row, j) in enumerate([(g, 0), (g, 1), (g + 8, 0), (g + 8, 1)]):
                src = m[256 + 512 * p + 16 * lane + 4 * w : 256 + 512 * p + 16 * lane + 4 * w + 4]
                np.testing.assert_array_equal(src, row * 144 + 16 + 32 * p + 16 * j + 4 * t + np.arange(4))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
def test_int8_lane_chunk_holds_values_8t_to_8t_plus_7(qtype):
    """The int8-activation layout: lane l = 4 g + t, chunk p, words (row g, j = 0), (row g, j = 1), (row g + 8, ..),
    word (row, j) = qs bytes 32 p + 8 t + 4 j .. + 3 of that row, so that the lane's words 0 and 1 (the m16n8k32 A
    fragment's k slots 4t .. and 16 + 4t ..) are values 8t .. 8t + 7 of sub-blocks 2p, 2p + 1, its activations one
    16-byte load; Q5_K's chunk of fifth bits alike (qh bytes 8 t + 4 j ..). Q8_0 has no int8 layout."""
    size, qs, chunks = (144, 16, 256) if qtype == "Q4_K" else (176, 48, 768)
    m = _tile_map(qtype, int8=True)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for w, (row, j) in enumerate([(g, 0), (g, 1), (g + 8, 0), (g + 8, 1)]):
            for p in range(4):
                src = m[chunks + 512 * p + 16 * lane + 4 * w : chunks + 512 * p + 16 * lane + 4 * w + 4]
                np.testing.assert_array_equal(src, row * size + qs + 32 * p + 8 * t + 4 * j + np.arange(4))
            if qtype == "Q5_K":
                src = m[256 + 16 * lane + 4 * w : 256 + 16 * lane + 4 * w + 4]
                np.testing.assert_array_equal(src, row * size + 16 + 8 * t + 4 * j + np.arange(4))
    raw = np.random.default_rng(0).integers(0, 256, 20 * 2 * size, dtype=np.uint8)
    np.testing.assert_array_equal(tile_unpack(tile_pack(raw, qtype, 20, 512, int8=True), qtype, 20, 512, int8=True),
                                  raw)
    with pytest.raises(LucegenError, match="int8"):
        _tile_map("Q8_0", int8=True)


def _signed_bytes(lo: int, hi: int) -> int:
    """QgQ6K::signed_bytes: bytes lo % 16 + 16 (hi % 4) - 32, two's complement, four a word."""
    return (lo & 0x0F0F0F0F) | ((((hi & 0x03030303) + 0x0E0E0E0E) << 4) & 0xF0F0F0F0)


def test_q6_k_int8_fragments_are_the_values_minus_32():
    """Q6_K's int8 layout through the kernel's rule (QgQ6K::fragment_q8: values 32 s .. of span s = 4 h + u from ql
    chunk 2 h + u % 2 shifted 4 (u // 2), qh chunk h shifted 2 u): lane 4 g + t's word (row, j) of span s holds the
    signed bytes q - 32 of values 32 s + 8 t + 4 j .. + 3, as quant.py dequantises them (with unit scales)."""
    rows, size = 16, 210
    raw = np.random.default_rng(3).integers(0, 256, rows * size, dtype=np.uint8)
    raw.reshape(rows, size)[:, 192:208] = 1  # unit scales
    raw.reshape(rows, size)[:, 208:210] = np.frombuffer(np.float16(1).tobytes(), np.uint8)
    values = quant.dequantize(raw, "Q6_K", rows * 256).reshape(rows, 256).astype(np.int64)
    tb = tile_pack(raw, "Q6_K", rows, 256, int8=True)
    words = tb.view("<u4")
    for lane in range(32):
        g, t = divmod(lane, 4)
        for s in range(8):
            h, u = s >> 2, s & 3
            for w, (row, j) in enumerate([(g, 0), (g, 1), (g + 8, 0), (g + 8, 1)]):
                ql = int(words[(288 + 512 * (2 * h + (u & 1)) + 16 * lane + 4 * w) // 4])
                qh = int(words[(2336 + 512 * h + 16 * lane + 4 * w) // 4])
                word = _signed_bytes(ql >> (4 * (u >> 1)), qh >> (2 * u))
                got = np.frombuffer(np.uint32(word).tobytes(), np.int8).astype(np.int64)
                k = 32 * s + 8 * t + 4 * j
                np.testing.assert_array_equal(got, values[row, k : k + 4], err_msg=f"lane {lane} span {s} word {w}")


def test_q6_k_value_of_every_fragment_slot():
    """Every Q6_K value reached through the kernel's fragment rule (sub-block s = 8 h + 2 u + i, lane t, byte e) is
    value 16 s + 4 t + e of the row: its low nibble from ql[64 h + (jj % 64)] >> 4 (jj // 64) and high bits from
    qh[32 h + jj % 32] >> 2 (jj // 32), jj = 32 u + 16 i + 4 t + e (quant.py _q6_k)."""
    m = _tile_map("Q6_K")
    for s in range(16):
        h, u, i = s >> 3, (s >> 1) & 3, s & 1
        for t in range(4):
            for e in range(4):
                jj = 32 * u + 16 * i + 4 * t + e
                lane = t  # row 0 (g = 0)
                ql = m[288 + 512 * (2 * h + i) + 16 * lane + 4 * (u & 1) + e]
                qh = m[2336 + 512 * h + 16 * lane + 4 * i + e]
                assert ql == 64 * h + jj % 64 and (u >> 1) == jj // 64
                assert qh == 128 + 32 * h + jj % 32 and u == jj // 32
                assert 128 * h + jj == 16 * s + 4 * t + e


def test_bad_matrices_are_refused():
    with pytest.raises(LucegenError, match="Q4_0"):
        tile_pack(np.zeros(18, np.uint8), "Q4_0", 1, 32)
    with pytest.raises(LucegenError, match="whole blocks"):
        tile_pack(np.zeros(144, np.uint8), "Q4_K", 1, 200)
    with pytest.raises(LucegenError, match="bytes"):
        tile_pack(np.zeros(100, np.uint8), "Q4_K", 1, 256)


def test_plan_depends_on_the_matrix_only():
    assert plan_parts(15520, 132) == 1  # the 27B lm_head: one warp per tile
    assert plan_parts(320, 132) == 4  # a 5120-row residual: K split over 4 warps, two tiles a block
    assert plan_parts(40, 132) == 8  # a small matrix: K split over the block's 8 warps
    assert plan_parts(1030, 132) == 2  # the 27B DeltaNet in-projection
    assert plan_parts(1088, 132, most=4, blocks_per_cu=2) == 2  # the gate/up pair (its tiles counted once)
    assert all(plan_parts(t, 132) in (1, 2, 4, 8) for t in range(1, 5000, 37))


@pytest.mark.parametrize("name", ["sm_86", "sm_90", "sm_120", "gfx1100"])
def test_programmatic_launch_follows_the_descriptor(name):
    """griddepcontrol is emitted exactly where the descriptor claims programmatic dependent launch (sm_90+); the
    descriptor refuses the claim elsewhere (tests/test_target.py)."""
    from lucegen import codegen
    from lucegen.target import load_target

    target = load_target(name)
    source = codegen.render_family(target, codegen.family("quant_gemm"))
    assert ("griddepcontrol.wait" in source) == target.features.programmatic_launch
    assert target.features.programmatic_launch == (name in ("sm_90", "sm_120"))


def test_kernels_that_wait_first_launch_programmatically_where_the_chip_can():
    """A function looked up as one that waits for its predecessor first (Module.function's programmatic) launches
    programmatically by default where the descriptor has the feature, and plainly elsewhere, where asking for it
    is refused; the other functions of the module launch plainly."""
    from lucegen.errors import DeviceError
    from lucegen.runtime.device import ByValue, address
    from lucegen.runtime.host_device import HostDevice
    from lucegen.runtime.quant_gemm import QuantGemm
    from lucegen.target import load_target

    for name, can in (("sm_90", True), ("sm_86", False)):
        target = load_target(name).quantised_target()
        qg = QuantGemm(HostDevice(target), target, 5120, 1e-6)
        assert {fn.programmatic for fn in qg.functions.values()} == {can}, name
        assert qg.amax_fn is None or not qg.amax_fn.programmatic
        if not can:
            fn = qg.functions["quant_gemm_m1_rows_f32"]
            zeros = {p.name: ByValue(bytes(p.nbytes)) if p.kind == "struct" else address(0) if p.kind == "pointer"
                     else 0 for p in fn.signature.params}
            with pytest.raises(DeviceError, match="programmatic"):
                fn.launch(1, 256, programmatic=True, **zeros)


def test_grid_of_the_27b_launches():
    """Blocks across the output (the residual's RMSNorm partial sums per row) and columns per block, as the launcher
    computes them for the 27B's matrices on the H100's descriptor."""
    import types

    from lucegen.runtime.quant_gemm import QuantGemm
    from lucegen.target import load_target
    from lucegen.runtime.host_device import HostDevice

    qg = QuantGemm(HostDevice(load_target("sm_90")), load_target("sm_90"), 5120, 1e-6)
    shapes = {"down": (320, False, False, 160, 32), "in-projection": (1030, False, False, 258, 64),
              "gate/up": (2176, True, False, 544, 32), "lm_head": (15520, False, False, 1940, 128),
              # int8 activations: blocks of Q8_WARPS = 4 warps, one tile a block (a pair: one of each matrix)
              "down int8": (320, False, True, 320, 16), "in-projection int8": (1030, False, True, 1030, 16),
              "gate/up int8": (2176, True, True, 1088, 16)}
    for name, (tiles, pair, int8, blocks, columns) in shapes.items():
        W = types.SimpleNamespace(tiles=tiles, pair=pair, int8=int8)
        assert (qg.grid_width(W), qg.block_columns(W)) == (blocks, columns), name
        # a residual's RMSNorm partial sums: one per row tile whatever its blocks, then the rows' totals
        assert (qg.ss_parts(W), qg.ss_scratch_parts(W)) == (tiles, tiles + 1)
    # one group of int8 tokens: 3 or 4 resident blocks a compute unit, whichever finishes its whole waves first
    # (sm_90's [tuning.quant_gemm] int8_wave_time): 4 for the in-projection's 1030 blocks (2 waves of 528, not 3 of
    # 396) and for 528 (1 of 528)
    quantised = load_target("sm_90").quantised_target()
    qg = QuantGemm(HostDevice(quantised), quantised, 5120, 1e-6)
    # a group holding Q6_K takes the twins nt<N>q6 (their type switch holds it); one row the one-token twins m1q..
    for tiles, pair, kernel in ((320, False, "nt1q"), (1030, False, "nt1q_r4"), (2176, True, "nt1q"),
                                (528, False, "nt1q_r4"), (792, False, "nt1q"), (896, False, "nt1q_r4")):
        for held, suffix in ((["Q4_K", "Q5_K"], ""), (["Q4_K", "Q6_K"], "6")):
            W = types.SimpleNamespace(tiles=tiles, pair=pair, int8=True, K=5120, types=held)
            twin = kernel.replace("q", f"q{suffix}")
            assert [qg.kernel(W, M, 0, 5120)[0] for M in (1, 8)] == [twin.replace("nt1", "m1"), twin], (tiles, held)
            assert qg.kernel(W, 9, 0, 5120)[0] == f"nt2q{suffix}"
            qg.use_one_row = False
            assert qg.kernel(W, 1, 0, 5120)[0] == twin
            qg.use_one_row = True


def test_a_launch_spreads_its_rows_evenly_over_the_fewest_row_groups():
    """M rows run as row_groups(M) groups (the grid's first dimension, a column block's groups side by side) of
    token_groups(M) groups of 8 tokens (the kernel's NT): the fewest groups of at most NT_MAX, each group short of a
    full one by less than 8 rows a group, so 33 rows take nt3 twice (24 + 9), not nt4 twice (32 + 1)."""
    from lucegen.families.quant_gemm import NT_MAX
    from lucegen.runtime.quant_gemm import row_groups, token_groups

    assert [(row_groups(M), token_groups(M)) for M in (1, 8, 9, 23, 32, 33, 49, 65, 128, 520)] == [
        (1, 1), (1, 1), (1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 3), (4, 4), (17, 4)]
    for M in range(1, 2000):
        groups, nt = row_groups(M), token_groups(M)
        assert 1 <= nt <= NT_MAX and groups == -(-M // (8 * NT_MAX)), M
        padding = groups * 8 * nt - M
        assert 0 <= padding < 8 * nt and padding < 8 * groups, M  # the last group holds rows; under 8 padded a group


def test_densest_row_tiles_come_first():
    """A group's row tiles (its launches' blocks, which start in tile order) are ordered by bytes per value, densest
    first, so its slowest blocks start in the first wave; its output columns stay in segment order. A gate/up pair
    keeps gate, up."""
    from lucegen.runtime.host_device import HostDevice
    from lucegen.runtime.quant_gemm import SEGMENT_DTYPE, QuantMatrix
    from lucegen.target import load_target

    device = HostDevice(load_target("sm_90"))
    K = 256
    rng = np.random.default_rng(0)

    def raw(qtype, rows):
        return rng.integers(0, 256, rows * K // TYPES[qtype][1] * TYPES[qtype][2], dtype=np.uint8)

    segments = [("Q4_K", raw("Q4_K", 40), 40, 0), ("Q6_K", raw("Q6_K", 20), 20, 0), ("Q5_K", raw("Q5_K", 16), 16, 0)]
    W = QuantMatrix(device, segments, K)
    table = np.frombuffer(W.table.raw, SEGMENT_DTYPE)[:3]
    assert list(table["tile0"]) == [3, 0, 2]  # Q6_K's 2 tiles, Q5_K's 1, then Q4_K's 3
    assert list(table["col0"]) == [0, 40, 60] and list(table["rows"]) == [40, 20, 16] and W.tiles == 6
    pair = QuantMatrix(device, [("Q4_K", raw("Q4_K", 32), 32, 0), ("Q6_K", raw("Q6_K", 32), 32, 0)], K, pair=True)
    assert list(np.frombuffer(pair.table.raw, SEGMENT_DTYPE)[:2]["tile0"]) == [0, 2]


def test_a_residual_leaves_its_row_totals_to_the_next_launch():
    """QuantGemm.residual(totals_by_reader=True) at 23 rows launches without its last block's tail (no ss_count) and
    returns the hand-over (RowTotals), and the launch it is passed to makes the rows' totals: a prequantised reader's
    quantiser in one more column of blocks, any other launch in a quantiser launch of the totals alone (K = 0) before
    it. At one row, or without totals_by_reader, the residual keeps its tail, hands nothing over and no quantiser
    makes totals."""
    from lucegen.runtime.host_device import HostDevice
    from lucegen.runtime.quant_gemm import QuantGemm
    from lucegen.target import load_target

    target = load_target("sm_90").quantised_target()
    dev = HostDevice(target)
    qg = QuantGemm(dev, target, 5120, 1e-6)
    rng = np.random.default_rng(1)
    K, N, M = 256, 5120, 23

    def matrix(rows, k, int8=True):
        raw = rng.integers(0, 256, rows * k // 256 * TYPES["Q4_K"][2], dtype=np.uint8)
        return qg.matrix([("Q4_K", raw, rows, 0)], k, int8=int8)

    down, reader, float_reader = matrix(N, K), matrix(64, N), matrix(64, N, int8=False)
    parts = qg.ss_parts(down)
    buf = {n: dev.alloc(b) for n, b in (("a", M * N * 2), ("am", M * N // 8), ("x", M * N * 4), ("w", N * 4),
                                         ("xn", M * N * 2), ("ss", (parts + 1) * M * 4), ("out", M * 64 * 4))}
    ss, ss_parts = qg.ss_for_readers(buf["ss"].ptr, parts, M, M)
    tail_counter = "ss_count"  # the residual's counter, where its last block makes the totals

    def launches(rows, by_reader, W):
        del dev.launches[:]
        due = qg.residual(buf["a"].ptr, K, down, None, rows, N, K, buf["x"].ptr, N, buf["w"].ptr, buf["xn"].ptr, N,
                          buf["ss"].ptr, M, a_amax=buf["am"].ptr, amax_out=buf["am"].ptr, totals_by_reader=by_reader)
        assert (due is not None) == (by_reader and rows > 1)
        r_ss, r_parts = qg.ss_for_readers(buf["ss"].ptr, parts, M, rows)
        qg.rows_f32(buf["xn"].ptr, N, W, None, rows, 64, N, r_ss, r_parts, M, buf["out"].ptr, 64,
                    a_amax=buf["am"].ptr, totals=due)
        return [(name, grid, dict(zip((p.name for p in fn.signature.params), args)))
                for name, grid, _, _, fn, args in dev.launches]

    def totals_job(args):  # quant_gemm_q8_rows' (ss, parts, stride, rows)
        return tuple(int(args[n].ptr) if hasattr(args[n], "ptr") else int(args[n])
                     for n in ("ss", "ss_parts", "ss_stride", "rows"))

    # deferred to a prequantised reader: no tail; its quantiser (K / 256 + 1 columns of blocks) totals the parts
    seq = launches(M, True, reader)
    assert [n for n, _, _ in seq] == ["quant_gemm_q8_rows", "quant_gemm_nt3qp_residual", "quant_gemm_q8_rows",
                                      "quant_gemm_nt3qp_rows_f32"]
    assert int(seq[1][2][tail_counter]) == 0
    assert seq[2][1] == (N // 256 + 1, 3) and totals_job(seq[2][2]) == (buf["ss"].ptr, parts, M, M)
    assert ss == buf["ss"].ptr + 4 * parts * M and ss_parts == 1
    # deferred, but the next launch quantises as it loads: the totals alone first
    seq = launches(M, True, float_reader)
    assert [n for n, _, _ in seq][1:] == ["quant_gemm_nt3qp_residual", "quant_gemm_q8_rows", "quant_gemm_nt3_rows_f32"]
    assert seq[2][1] == (1, 3) and int(seq[2][2]["K"]) == 0 and totals_job(seq[2][2]) == (buf["ss"].ptr, parts, M, M)
    # not deferred: the residual's tail, and a quantiser without totals
    seq = launches(M, False, reader)
    assert int(seq[1][2][tail_counter]) != 0
    assert seq[2][1] == (N // 256, 3) and totals_job(seq[2][2]) == (0, 0, 0, 0)
    # one row: the readers total the parts themselves; nothing deferred
    seq = launches(1, True, reader)
    assert [n for n, _, _ in seq] == ["quant_gemm_m1q_residual", "quant_gemm_m1q_rows_f32"]
    assert int(seq[0][2][tail_counter]) == 0

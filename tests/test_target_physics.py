"""Descriptors that describe no chip are refused at load, before any compile, naming the file and the field."""

from __future__ import annotations

import copy
import re
import time
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lucegen.cli import main
from lucegen.errors import DescriptorError
from lucegen.target import PHYSICAL_RANGES, TARGETS_DIR, list_targets, target_from_dict

RAW = {name: tomllib.loads((TARGETS_DIR / f"{name}.toml").read_text()) for name in list_targets()}


def refused(raw, chip: str) -> DescriptorError:
    with pytest.raises(DescriptorError) as e:
        target_from_dict(raw, f"{chip}.toml")
    assert e.value.path == f"{chip}.toml"
    return e.value


def setting(raw, field, value):
    table = raw
    *parents, leaf = field.split(".")
    for p in parents:
        table = table[p]
    table[leaf] = value


# the values the issue found accepted
@pytest.mark.parametrize("chip, field, value", [
    ("sm_90", "compute_units", 1000001), ("sm_90", "memory_bytes", 3), ("gfx1100", "prefill.max_tokens", 10**10),
    ("sm_86", "matmul.peak_tflops", 1e300), ("sm_90", "smem_per_cu", 10**9), ("sm_89", "regs_per_cu", 10**9),
    ("sm_120", "max_threads_per_cu", 10**8), ("sm_90", "ddtree.tensor_core_attention_keys", 3),
    ("sm_90", "ddtree.tensor_core_attention_keys", 96), ("sm_90", "ddtree.tensor_core_attention_keys", 32),
    ("gfx1151", "l2_bytes", 5), ("sm_121", "mem_bandwidth_gbs", 3.0e6), ("sm_75", "regs_per_thread_max", 256),
    ("sm_90", "prefill.max_tokens", 8100),
])
def test_values_no_chip_has(chip, field, value):
    raw = copy.deepcopy(RAW[chip])
    setting(raw, field, value)
    assert refused(raw, chip).field == field


@settings(max_examples=200, deadline=None)
@given(chip=st.sampled_from(sorted(RAW)), field=st.sampled_from(sorted(PHYSICAL_RANGES)), data=st.data())
def test_every_range_has_two_ends(chip, field, data):
    low, high, _ = PHYSICAL_RANGES[field]
    if field == "simds_per_cu":
        return  # its own rule (a divisor of the CU's waves) refuses first; checked below
    kind = type(low)
    below = data.draw(st.integers(1, int(low) - 1) if kind is int and low > 1 else st.just(None))
    above = data.draw(st.integers(int(high) + 1, 10 * int(high)) if kind is int else
                      st.floats(high * 1.01, 1e300, allow_nan=False, allow_infinity=False))
    for value in (below, above):
        if value is None:
            continue
        raw = copy.deepcopy(RAW[chip])
        setting(raw, field, value)
        err = refused(raw, chip)
        assert err.field, err


def test_wave64_on_rdna_is_refused_before_any_compile(tmp_path, capsys, monkeypatch):
    """gfx1100 compiles as wave32: warp_size 64 (with the thread counts made consistent with it) is one line from
    `lucegen build`, at once, with nothing compiled or written."""
    monkeypatch.setenv("LUCEGEN_CACHE_DIR", str(tmp_path / "cache"))
    text = (TARGETS_DIR / "gfx1100.toml").read_text()
    bad = tmp_path / "gfx1100.toml"
    bad.write_text(re.sub(r"(?m)^warp_size = 32", "warp_size = 64", text))
    start = time.monotonic()
    assert main(["build", "--target", str(bad)]) == 2
    assert time.monotonic() - start < 5
    err = capsys.readouterr().err
    assert err == (f"lucegen: error: {bad}: warp_size: gfx1100 runs 32-lane wavefronts in lucegen's builds (gfx9 has "
                   f"wave64 only; gfx10-12 compile as wave32, no -mwavefrontsize64), got 64\n")
    assert not (tmp_path / "cache").exists()


def test_a_wave64_chip_must_say_so():
    raw = copy.deepcopy(RAW["gfx1100"])
    raw.update(name="gfx942", arch="gfx942", warp_size=32)
    err = refused(raw, "gfx942")
    assert err.field == "warp_size" and "gfx942 runs 64-lane wavefronts" in err.reason


def test_every_shipped_descriptor_is_inside_the_ranges():
    for chip, raw in RAW.items():
        target_from_dict(copy.deepcopy(raw), f"{chip}.toml")

"""Any NVIDIA GPU gets a descriptor (lucegen/runtime/device_facts.py), with the driver's report faked: an exact
descriptor where one matches (nearest in memory among equal SM counts), else the same arch's nearest in size with the
driver's facts in place, said in one line; `lucegen new-target NAME --from-device` writes the same descriptor."""

from __future__ import annotations

import logging
import tomllib

import pytest

from lucegen.errors import DeviceError
from lucegen.runtime import device_facts
from lucegen.runtime.device_facts import DeviceFacts, descriptor_text, pick_target
from lucegen.target import load_target

GB = 2**30


def facts(arch, sms, name, memory, l2=6 * 2**20, mem_khz=9_501_000, bus=320, **kw) -> DeviceFacts:
    values = dict(smem_per_block_optin=101376, smem_per_cu=102400, regs_per_cu=65536, max_threads_per_cu=1536,
                  clock_khz=1_710_000)
    values.update(kw)
    return DeviceFacts(arch=arch, sms=sms, name=name, memory_bytes=memory, l2_bytes=l2, memory_clock_khz=mem_khz,
                       bus_width_bits=bus, **values)


RTX_3080 = facts("sm_86", 68, "NVIDIA GeForce RTX 3080", 10 * GB, l2=5 * 2**20)


@pytest.mark.parametrize("device, want", [
    (facts("sm_90", 132, "NVIDIA H100 80GB HBM3", 80 * GB), "sm_90"),
    (facts("sm_90", 132, "NVIDIA H200", 141 * 10**9), "h200"),
    (facts("sm_90", 114, "NVIDIA H100 PCIe", 80 * GB), "h100-pcie"),
    (facts("sm_80", 108, "NVIDIA A100-SXM4-80GB", 80 * GB), "sm_80"),
    (facts("sm_80", 108, "NVIDIA A100-SXM4-40GB", 40 * GB), "sm_80"),
])
def test_an_exact_descriptor_wins(device, want, caplog):
    with caplog.at_level(logging.WARNING, "lucegen"):
        assert pick_target(device).name == want
    assert not caplog.records


def test_no_exact_match_takes_the_nearest_with_the_drivers_facts(caplog):
    with caplog.at_level(logging.WARNING, "lucegen"):
        t = pick_target(RTX_3080)
    base = load_target("sm_86")
    assert t.name == "sm_86-68sm" and t.arch == "sm_86" and "RTX 3080" in t.description
    assert t.compute_units == 68 and t.megakernel.blocks == 68
    assert t.memory_bytes == 10 * GB and t.l2_bytes == 5 * 2**20
    assert t.mem_bandwidth_gbs == pytest.approx(2 * 9501e6 * 40 / 1e9, abs=0.1)  # 760 GB/s: GDDR6X, 320-bit
    assert t.matmul.peak_tflops == pytest.approx(round(base.matmul.peak_tflops * 68 / 82, 1))
    assert (t.matmul, t.prefill, t.features) == (dataclass_replace(base.matmul, peak_tflops=t.matmul.peak_tflops),
                                                 base.prefill, base.features)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "sm_86 with 68 SMs" in lines[0] and "new-target NAME --from-device" in lines[0]


def dataclass_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_nearest_in_size_and_no_memory_clock():
    small_hopper = facts("sm_90", 120, "Hopper 120", 96 * GB, l2=60 * 2**20, mem_khz=0, smem_per_block_optin=232448,
                         smem_per_cu=233472, max_threads_per_cu=2048)
    t = pick_target(small_hopper)
    assert t.name == "h100-pcie-120sm"  # 114 SMs is nearer 120 than 132
    assert t.mem_bandwidth_gbs == load_target("h100-pcie").mem_bandwidth_gbs  # no clock reported: the base's
    assert t.tuning == load_target("h100-pcie").tuning


def test_an_arch_without_descriptors_is_refused():
    with pytest.raises(DeviceError, match=r"no descriptor for sm_87 \(Orin\).*sm_86.*new-target NAME --like"):
        pick_target(facts("sm_87", 16, "Orin", 32 * GB))


def test_descriptor_text_keeps_the_base_file_and_its_comments():
    text = descriptor_text(load_target("sm_86"), RTX_3080, "rtx3080")
    data = tomllib.loads(text)
    assert data["name"] == "rtx3080" and data["compute_units"] == 68 and data["matmul"]["tile_k"] == 32
    assert "# tuning choice" in text and "driver: 2 x 9501 MHz x 320-bit bus" in text


def test_new_target_from_device(tmp_path, monkeypatch, capsys):
    from lucegen.cli import main

    from lucegen.runtime import device as device_module

    monkeypatch.setattr(device_module, "read_facts", lambda: RTX_3080)
    assert main(["new-target", "rtx3080", "--from-device", "--dir", str(tmp_path)]) == 0
    t = load_target(tmp_path / "rtx3080.toml")
    assert t.name == "rtx3080" and t.compute_units == 68 and t.memory_bytes == 10 * GB
    capsys.readouterr()
    try:  # a usage error: argparse's exit 2 (or main's return of it)
        code = main(["new-target", "again", "--from-device", "--like", "sm_86"])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_device_open_uses_the_fallback(monkeypatch):
    """Device.open without --target: the descriptor pick_target gives (the driver faked up to the context)."""
    from lucegen.runtime import device as device_module

    class Opened(Exception):
        pass

    monkeypatch.setattr(device_module, "detect", lambda: ("sm_86", 68, RTX_3080.name))
    monkeypatch.setattr(device_module, "read_facts", lambda: RTX_3080)

    def stop(*args):
        raise Opened

    monkeypatch.setattr(device_module, "_driver", stop)
    chosen = []
    monkeypatch.setattr(device_module, "pick_target", lambda f: chosen.append(pick_target(f)) or chosen[-1])
    with pytest.raises(Opened):
        device_module.Device.open()
    assert chosen[0].name == "sm_86-68sm"

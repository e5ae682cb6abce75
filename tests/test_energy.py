"""Energy (lucegen/runtime/energy.py): NVML's total-energy counter read through a fake ``pynvml``, the meter's
arithmetic and its silence where NVML or the counter is missing; the GPU engines' timings on the host-only device
(``energy_j``, the closing line of ``lucegen run``) and bench decode's energy fields."""

from __future__ import annotations

import sys
import types

import pytest

import lucegen
from lucegen.api import Timings
from lucegen.runtime.energy import EnergyMeter, energy_j, load_nvml
from lucegen.runtime.host_device import HostDevice
from lucegen.target import load_target

from host_replies import open_host_devices  # tests/host_replies.py

BUS_ID = "0000:3b:00.0"
STEP_MJ = 1500  # what the fake counter advances by at each reading


class FakeNVMLError(Exception):
    pass


def fake_nvml(*, gpus=(BUS_ID,), counter: bool = True, init_fails: bool = False) -> types.ModuleType:
    """A ``pynvml`` stand-in: ``gpus`` by PCI bus id, each an energy counter that advances STEP_MJ per reading
    (``counter=False``: NVML's NotSupported); ``calls`` records inits and shutdowns, ``reads`` counts readings."""
    m = types.ModuleType("pynvml")
    m.calls, m.readings, m.open, m.reads = [], {bus: 10_000 * (i + 1) for i, bus in enumerate(gpus)}, 0, 0

    def init():
        m.calls.append("init")
        if init_fails:
            raise FakeNVMLError("NVML Shared Library Not Found")
        m.open += 1

    def shutdown():
        m.calls.append("shutdown")
        m.open -= 1

    def by_bus(bus):
        if bus not in m.readings:
            raise FakeNVMLError("Not Found")
        return bus

    def total_energy(handle):
        if not counter:
            raise FakeNVMLError("Not Supported")
        m.reads += 1
        m.readings[handle] += STEP_MJ
        return m.readings[handle]

    m.nvmlInit, m.nvmlShutdown = init, shutdown
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: list(gpus)[i]
    m.nvmlDeviceGetHandleByPciBusId = by_bus
    m.nvmlDeviceGetTotalEnergyConsumption = total_energy
    return m


# ------------------------------------------------------------------------------------------------ the meter
def test_meter_reads_the_counter_of_its_gpu():
    nvml = fake_nvml(gpus=("0000:01:00.0", BUS_ID))
    nvml.nvmlInit()
    meter = EnergyMeter(BUS_ID, nvml)
    assert meter.available
    e0 = meter.read_mj()
    e1 = meter.read_mj()
    assert (e0, e1) == (20_000 + STEP_MJ, 20_000 + 2 * STEP_MJ)  # the second GPU's counter, not the first's
    assert energy_j(e0, e1) == STEP_MJ / 1e3
    meter.close()
    assert nvml.open == 0 and meter.read_mj() is None


def test_energy_is_none_for_a_missing_or_reset_reading():
    assert energy_j(None, 5.0) is None and energy_j(5.0, None) is None
    assert energy_j(9000.0, 1000.0) is None  # the counter went back (a driver reload)
    assert energy_j(1000.0, 1000.0) == 0.0


def test_meter_without_a_bus_id_takes_nvmls_only_gpu():
    one = fake_nvml()
    one.nvmlInit()
    assert EnergyMeter(None, one).read_mj() == 10_000 + STEP_MJ
    two = fake_nvml(gpus=("0000:01:00.0", BUS_ID))
    two.nvmlInit()
    meter = EnergyMeter(None, two)  # which of two GPUs is unknown: no reading rather than the wrong one's
    assert not meter.available and meter.read_mj() is None and two.open == 0


@pytest.mark.parametrize("nvml", [
    None,  # pynvml not installed
    fake_nvml(init_fails=True),  # no NVIDIA driver
])
def test_an_unavailable_nvml_reads_none(monkeypatch, nvml):
    monkeypatch.setitem(sys.modules, "pynvml", nvml)  # None in sys.modules: the import fails
    assert load_nvml() is None
    meter = EnergyMeter(BUS_ID)
    assert not meter.available and meter.read_mj() is None
    meter.close()


def test_a_gpu_without_the_counter_or_unknown_to_nvml_reads_none():
    nvml = fake_nvml(counter=False)
    nvml.nvmlInit()
    assert EnergyMeter(BUS_ID, nvml).read_mj() is None
    other = fake_nvml()
    other.nvmlInit()
    assert EnergyMeter("0000:99:00.0", other).read_mj() is None and other.open == 0


def test_a_device_that_is_no_gpu_has_no_meter(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    host = HostDevice(load_target("sm_90"))
    assert not EnergyMeter.for_device(host).available  # the host-only device has no PCI bus id
    gpu = types.SimpleNamespace(pci_bus_id=lambda: BUS_ID)
    assert EnergyMeter.for_device(gpu).read_mj() == 10_000 + STEP_MJ

    def broken():
        raise lucegen.errors.DeviceError("cuDeviceGetPCIBusId failed")

    assert not EnergyMeter.for_device(types.SimpleNamespace(pci_bus_id=broken)).available


# ------------------------------------------------------------------------------------------------ timings
def timings(energy):
    return Timings(prompt_tokens=4, generated_tokens=30, ttft_s=0.01, prefill_tok_s=400.0, decode_s=0.1,
                   decode_tok_s=290.0, energy_j=energy)


def test_timings_line_shows_energy_when_known():
    assert timings(1.5).format().endswith("decode 290.0 tok/s, energy 1.5 J (20.0 tok/J)")
    assert timings(1.5).tok_per_j == 20.0
    assert timings(0.0).format().endswith("energy 0.0 J") and timings(0.0).tok_per_j is None
    line = timings(None).format()
    assert "energy" not in line and "tok/J" not in line and timings(None).tok_per_j is None


def test_the_cpu_engine_measures_no_energy(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    with lucegen.LLM(tiny / "st", device="cpu") as llm:
        assert llm.generate("hi", max_tokens=3).timings.energy_j is None


# ------------------------------------------------------------------------------------------------ GPU engines
@pytest.fixture
def host(monkeypatch):
    """Device.open gives the host-only device of a descriptor (no PCI bus id: no GPU, no energy meter)."""
    return open_host_devices(monkeypatch)


@pytest.fixture
def bus_id(monkeypatch):
    """The host-only device with a PCI bus id, as a GPU has: its engines read the (fake) NVML's counter."""
    monkeypatch.setattr(HostDevice, "pci_bus_id", lambda self: BUS_ID, raising=False)


def test_llm_timings_carry_the_energy_of_a_generation(tiny, host, bus_id, monkeypatch):
    nvml = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with lucegen.LLM(tiny / "st", device="gpu", max_context=64) as llm:
        done = llm.generate("def f(x):", max_tokens=6, stop_token_ids=[])
        assert done.timings.energy_j == STEP_MJ / 1e3  # one reading before the prompt, one after the last token
        assert nvml.reads == 2  # no NVML work per token
        last = list(llm.stream("def f(x):", max_tokens=4, stop_token_ids=[]))[-1]
        assert last.timings.energy_j == STEP_MJ / 1e3
    assert nvml.open == 0  # closing the LLM releases NVML
    assert host[-1].allocated == 0


def test_llm_on_the_host_device_measures_no_energy(tiny, host, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    with lucegen.LLM(tiny / "st", device="gpu", max_context=64) as llm:  # no PCI bus id: not a GPU
        assert llm.generate("def f(x):", max_tokens=4, stop_token_ids=[]).timings.energy_j is None


@pytest.mark.parametrize("nvml, shown", [(fake_nvml(), True), (None, False)])
def test_cli_run_closing_line_shows_energy_when_known(tiny, host, bus_id, monkeypatch, capsys, nvml, shown):
    from lucegen.cli import main

    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert main(["run", "--model", str(tiny / "st"), "--device", "gpu", "--prompt", "def f(x):", "--max-tokens",
                 "6"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "TTFT" in last
    if shown:
        generated = int(last.split(" generated")[0].rsplit(" ", 1)[-1])
        assert f"energy 1.5 J ({generated / 1.5:.1f} tok/J)]" in last
    else:
        assert "energy" not in last and "tok/J" not in last


def test_bench_decode_writes_its_energy_fields(tiny, host, bus_id, monkeypatch):
    from lucegen.bench.decode import bench_megakernel, format_table

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    r = bench_megakernel(tiny / "st", prompt_tokens=4, gen_tokens=8, repeats=2, target="sm_90")
    assert r["energy_j"] == STEP_MJ / 1e3
    assert r["tok_per_j"] == 8 * 2 / r["energy_j"] and r["avg_power_w"] > 0
    assert "tok/J (NVML)" in format_table(r) and f"{r['tok_per_j']:.1f}" in format_table(r)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    r = bench_megakernel(tiny / "st", prompt_tokens=4, gen_tokens=8, repeats=1, target="sm_90")
    assert r["energy_j"] is None and r["tok_per_j"] is None
    assert "n/a (NVML unavailable)" in format_table(r)

"""The energy a GPU used, from NVML's total-energy counter (millijoules since the driver loaded), read through
``pynvml`` (the ``nvidia-ml-py`` package).

    meter = EnergyMeter.for_device(device)     # the GPU ``device`` runs on (by PCI bus id)
    e0 = meter.read_mj()
    ...                                        # the work, finished on the device
    joules = energy_j(e0, meter.read_mj())     # None where NVML or the counter is unavailable
    meter.close()

Energy is optional: without ``pynvml``, without an NVIDIA driver, on a GPU whose NVML has no energy counter
(pre-Volta, some virtual GPUs) or on a device that is not a GPU (the host-only device, the CPU engine), every
reading is None and nothing raises. A reading is one NVML call (microseconds), so a meter around each generation
costs nothing measurable.
"""

from __future__ import annotations

import importlib
import logging

log = logging.getLogger("lucegen")


def load_nvml():
    """The ``pynvml`` module, initialised; None when it is not installed or NVML cannot start (no driver)."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: energy is optional
        log.debug("NVML unavailable: %s", exc)
        return None
    return nvml


class EnergyMeter:
    """NVML's total-energy counter of one GPU: ``bus_id`` (a PCI bus id such as "0000:3b:00.0"), or NVML's only GPU
    when None and it sees exactly one. ``nvml``: an initialised ``pynvml`` module, which :meth:`close` shuts down
    (default: :func:`load_nvml`'s); a meter without one reads None."""

    def __init__(self, bus_id: str | None = None, nvml=None):
        self._nvml = nvml if nvml is not None else load_nvml()
        self._handle = None
        if self._nvml is None:
            return
        try:
            if bus_id is not None:
                self._handle = self._nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
            elif self._nvml.nvmlDeviceGetCount() == 1:
                self._handle = self._nvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:
            log.debug("NVML has no handle for GPU %s: %s", bus_id, exc)
        if self._handle is None:
            self.close()

    @classmethod
    def for_device(cls, device, nvml=None) -> EnergyMeter:
        """The meter of the GPU ``device`` (lucegen.runtime.device.Device) runs on; an unavailable one for a device
        that is no GPU (it has no ``pci_bus_id``)."""
        bus_id = getattr(device, "pci_bus_id", None)
        if bus_id is None:
            return cls.unavailable()
        try:
            bus = bus_id()
        except Exception as exc:
            log.debug("no PCI bus id for %s: %s", getattr(device, "name", device), exc)
            return cls.unavailable()
        return cls(bus, nvml)

    @classmethod
    def unavailable(cls) -> EnergyMeter:
        """A meter that reads None."""
        meter = cls.__new__(cls)
        meter._nvml = meter._handle = None
        return meter

    @property
    def available(self) -> bool:
        return self._handle is not None

    def read_mj(self) -> float | None:
        """The counter now (millijoules), or None."""
        if self._handle is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception as exc:  # NVMLError_NotSupported on GPUs without the counter
            log.debug("NVML energy counter unavailable: %s", exc)
            return None

    def close(self) -> None:
        """Release NVML (each meter holds one nvmlInit)."""
        nvml, self._nvml, self._handle = self._nvml, None, None
        if nvml is not None:
            try:
                nvml.nvmlShutdown()
            except Exception:
                pass


def energy_j(start_mj: float | None, end_mj: float | None) -> float | None:
    """Joules between two readings; None when either is missing or the counter went back (a driver reload)."""
    if start_mj is None or end_mj is None or end_mj < start_mj:
        return None
    return (end_mj - start_mj) / 1e3

"""What the host-only device (lucegen/runtime/host_device.py) answers to downloads in the tests that run the GPU
engines on it, and a ``Device.open`` that gives such devices."""

from __future__ import annotations

import numpy as np

from lucegen.runtime import device as device_module
from lucegen.runtime.host_device import HostDevice
from lucegen.target import load_target

STAND_IN_TOKEN = 5  # the argmax the host device's downloads decode to


def stand_in(buffer, dtype, shape):
    """argmax keys of token 5 (key = ~token in the low word), int32 rows 0, 1, 2, ..., int32 token runs of 5,
    zeros otherwise (uniform logits)."""
    if np.dtype(dtype) == np.uint64:
        return np.full(shape, 0xFFFFFFFF - STAND_IN_TOKEN, np.uint64)
    if np.dtype(dtype) == np.int32 and np.ndim(np.empty(shape)) == 2:
        return np.tile(np.arange(shape[1], dtype=np.int32), (shape[0], 1))
    if np.dtype(dtype) == np.int32:
        return np.full(shape, STAND_IN_TOKEN, np.int32)
    return np.zeros(shape, dtype)


def open_host_devices(monkeypatch) -> list:
    """Make ``Device.open`` give a host-only device of the descriptor (default sm_90) answering with
    :func:`stand_in`; returns the list the opened devices are appended to."""
    devices = []

    def open_host(cls, target=None):
        dev = HostDevice(load_target(target or "sm_90"))
        dev.reply = stand_in
        devices.append(dev)
        return dev

    monkeypatch.setattr(device_module.Device, "open", classmethod(open_host))
    return devices

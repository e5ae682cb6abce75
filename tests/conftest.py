"""Shared test setup: ``gpu`` tests skip cleanly when no NVIDIA GPU is visible, and the tests see the packaged
chip descriptors alone."""

from __future__ import annotations

import functools
import os

import pytest

# No user descriptor directory (lucegen/descriptor_paths.py): a developer's own descriptors would otherwise join every
# test parametrised over list_targets(). Tests of the user directories set the variable themselves.
os.environ["LUCEGEN_TARGETS_PATH"] = ""


@functools.cache
def gpu_available() -> bool:
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

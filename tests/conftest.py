"""Shared test setup: ``gpu`` tests skip cleanly when no NVIDIA GPU is visible; AMD compiles skip without clang-19
(``require_compiler``), naming the package to install."""

from __future__ import annotations

import functools

import pytest


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


@pytest.fixture
def require_compiler():
    """``require_compiler(target)``: skip the test when ``target`` is an AMD chip and clang-19 is not installed (the
    reason names the Debian package); NVIDIA targets compile with NVRTC, a Python dependency, and never skip."""
    from lucegen.compile import hip

    def check(target) -> None:
        if target.is_amd and hip.find_clang() is None:
            pytest.skip(hip.MISSING_CLANG)

    return check

"""What the GPU tests share: random-weight test checkpoints written once per preset and seed, the one device, and
the kernel families loaded on it."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import write_hf_checkpoint


@functools.cache
def checkpoint_dir(preset: str, seed: int = 0) -> Path:
    """A random-weight checkpoint of ``preset`` (under $LUCEGEN_TEST_MODELS or the temp directory)."""
    root = Path(os.environ.get("LUCEGEN_TEST_MODELS", tempfile.gettempdir())) / "lucegen-mk-models"
    out = root / f"{preset}-{seed}"
    if not (out / "config.json").exists():
        write_hf_checkpoint(ModelConfig.preset(preset), out, seed=seed, progress=False)
    return out


@functools.cache
def gpu_device():
    """The opened device, shared by every GPU test of the session."""
    from lucegen.runtime.device import Device

    return Device.open()


@functools.cache
def family_module(name: str):
    """(device, module): kernel family ``name`` built for the shared device's target and loaded on it."""
    from lucegen import codegen

    device = gpu_device()
    return device, device.load(codegen.build(device.target, name))

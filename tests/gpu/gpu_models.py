"""What the GPU tests share: random-weight test checkpoints written once per preset and seed, the one device, and
the kernel families loaded on it."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import numpy as np

from lucegen.model.config import ModelConfig
from lucegen.model.init_weights import write_hf_checkpoint


def _models() -> Path:
    """Where test checkpoints live: $LUCEGEN_TEST_MODELS (or the temp directory) / lucegen-mk-models."""
    return Path(os.environ.get("LUCEGEN_TEST_MODELS", tempfile.gettempdir())) / "lucegen-mk-models"


def _written(preset: str, seed: int, write) -> Path:
    """Directory ``<preset>-<seed>`` of the test models, written by ``write(out)`` unless it already holds a model
    (``config.json`` is written last)."""
    out = _models() / f"{preset}-{seed}"
    if not (out / "config.json").exists():
        write(out)
    return out


def _written_file(name: str, write) -> Path:
    """File ``name`` of the test models, written by ``write(out)`` unless it exists (the writers write a temp file
    and rename it)."""
    out = _models() / name
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        write(out)
    return out


@functools.cache
def checkpoint_dir(preset: str, seed: int = 0) -> Path:
    """A random-weight checkpoint of ``preset``."""
    return _written(preset, seed,
                    lambda out: write_hf_checkpoint(ModelConfig.preset(preset), out, seed=seed, progress=False))


@functools.cache
def draft_dir(preset: str, seed: int = 0) -> Path:
    """A random-weight DFlash draft of ``preset`` (lucegen/model/dflash.py PRESETS)."""
    from lucegen.model.dflash import DFlashConfig
    from lucegen.model.init_dflash import write_dflash_checkpoint

    return _written(preset, seed,
                    lambda out: write_dflash_checkpoint(DFlashConfig.preset(preset), out, seed=seed, progress=False))


@functools.cache
def draft_gguf(preset: str, quant: str = "q8_0", seed: int = 0) -> Path:
    """A random-weight DFlash draft of ``preset`` as a GGUF (lucegen/model/init_dflash.py), matrices in ``quant``."""
    from lucegen.model.dflash import DFlashConfig
    from lucegen.model.init_dflash import write_dflash_gguf

    return _written_file(f"{preset}-{quant}-{seed}.gguf", lambda out: write_dflash_gguf(
        DFlashConfig.preset(preset), out, quant=quant, seed=seed, progress=False))


# byte offsets of each GGML type's f16 scales inside a block
F16_FIELDS = {"Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def ggml_blocks(rng, qtype: str, rows: int, k: int, source: str, value_scale: tuple[float, float],
                scale_std: float) -> np.ndarray:
    """rows x k values of GGML type ``qtype`` as raw bytes [rows, k / block * bytes]: "quantized" (quant.quantize of
    normal values times U(value_scale)) or "random" (every bit pattern of the quants and 6-bit scales; the f16
    scales normal with ``scale_std`` and finite, since a NaN scale's payload is not portable)."""
    from lucegen.model import quant

    if source == "quantized":
        x = (rng.standard_normal((rows, k)) * rng.uniform(*value_scale)).astype(np.float32)
        return quant.quantize(x, qtype).reshape(rows, -1)
    _, block, size = quant.TYPES[qtype]
    raw = rng.integers(0, 256, size=(rows * k // block, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        scale = (rng.standard_normal(raw.shape[0]) * scale_std).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


@functools.cache
def gguf_file(preset: str, quant: str = "q4_k_m", seed: int = 0) -> Path:
    """A random-weight GGUF of ``preset`` in the ``quant`` mix (needs the gguf package to write)."""
    from lucegen.model.init_gguf import write_gguf_checkpoint

    return _written_file(f"{preset}-{quant}-{seed}.gguf", lambda out: write_gguf_checkpoint(
        ModelConfig.preset(preset), out, quant=quant, seed=seed, progress=False))


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


def state_errors(got: dict, state, kv_format=None) -> dict:
    """Per state kind, the worst layer's max |device - reference| / max |reference| (and which layer). With a
    quantised ``kv_format`` (lucegen/model/kv_cache.py) a K/V value may sit one code away from the reference's (the
    two quantise nearly equal inputs on either side of a rounding boundary): there the error counted is what exceeds
    one code of the value's block (KvFormat.code_step)."""
    from lucegen.model import kv_cache

    worst = {}
    for i, (g, r) in enumerate(zip(got["layers"], state.layers)):
        pairs = (("conv", g["conv"], r.conv), ("recurrent", g["recurrent"], r.recurrent)) if "conv" in g else \
            (("k", g["k"], r.k), ("v", g["v"], r.v))
        for name, a, b in pairs:
            assert a.shape == b.shape, (i, name, a.shape, b.shape)
            err = np.abs(a - b)
            if name in ("k", "v") and kv_format is not None and kv_format.quantised and b.size:
                step = kv_format.code_step(kv_cache.quantise(kv_format, b)[1])
                err = np.maximum(err - np.repeat(step, kv_cache.BLOCK, axis=-1), 0.0)
            rel = float(err.max() / max(np.abs(b).max(), 1e-30))
            if rel >= worst.get(name, (0.0, -1))[0]:
                worst[name] = (rel, i)
    return worst


def compare(logits: np.ndarray, want: np.ndarray) -> dict:
    err = np.abs(logits - want)
    srt = np.sort(want)
    return {"rel": float(err.max()) / float(np.abs(want).max()),
            "cos": float(logits @ want / (np.linalg.norm(logits) * np.linalg.norm(want))),
            "decided": bool(srt[-1] - srt[-2] > 2 * float(err.max()))}

"""Reading a ModelOpt NVFP4 HF directory (docs/nvfp4.md): the quantised Linear layers' ``weight`` (packed E2M1),
``weight_scale`` (E4M3 per 16 values) and ``weight_scale_2`` (FP32) become one tensor under the layer's internal
name, dequantised by :mod:`lucegen.model.nvfp4` when asked for (``f32``/``bf16``); its ``dtype`` is "NVFP4". The
``input_scale`` tensors (activation scales for W4A4 kernels) are accepted and not used: lucegen's engines keep
activations in float. The other tensors (embedding, norms, the layers ModelOpt leaves out) read as in any HF
directory. Scales that are NaN, negative, zero or not finite are refused at load, naming the tensor."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import CheckpointError, LucegenError
from . import nvfp4
from .checkpoint_base import SafetensorsCheckpoint, refuse_missing, walk_shards
from .config import ModelConfig
from .safetensors_io import SafetensorsFile

#: ModelOpt's names for NVFP4 weights: with NVFP4 activations (W4A4, input_scale per layer) or weight-only
QUANT_ALGOS = ("NVFP4", "W4A16_NVFP4")
HF_QUANT_CONFIG = "hf_quant_config.json"
SCALE_SUFFIXES = (".weight_scale_2", ".weight_scale", ".input_scale")  # longest first


def quant_algo(directory: Path, config_json: dict) -> str | None:
    """The ModelOpt ``quant_algo`` (upper case, as vLLM normalises it) of a HF directory (config.json's quantization_config with quant_method
    "modelopt", else hf_quant_config.json's ``quantization``), None for an unquantised or non-ModelOpt one."""
    qc = config_json.get("quantization_config") if isinstance(config_json, dict) else None
    if isinstance(qc, dict) and qc.get("quant_method") == "modelopt":
        return str(qc.get("quant_algo")).upper()
    path = directory / HF_QUANT_CONFIG
    if path.is_file():
        try:
            quantization = json.loads(path.read_text())["quantization"]
            return str(quantization["quant_algo"]).upper()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}: no quantization.quant_algo ({exc})") from None
    return None


def is_nvfp4(checkpoint) -> bool:
    return isinstance(checkpoint, Nvfp4Checkpoint)


def refuse_on_gpu(checkpoint) -> None:
    """The GPU engines read BF16/FP16 or GGUF weights: an NVFP4 checkpoint is refused before any device work."""
    if is_nvfp4(checkpoint):
        raise LucegenError(f"{checkpoint.path}: NVFP4 weights run on the CPU engine only for now (--device cpu)")


class Nvfp4Checkpoint(SafetensorsCheckpoint):
    """A safetensors checkpoint whose names in ``quantised`` are NVFP4: internal name -> (weight,
    weight_scale, weight_scale_2), each as (SafetensorsFile, stored name)."""

    def __init__(self, path, config, files, where, quantised: dict[str, tuple]):
        super().__init__(path, config, files, where)
        self.quantised = quantised

    def shape(self, name):
        if name in self.quantised:
            return self.config.tensor_shapes()[name]
        return super().shape(name)

    def dtype(self, name):
        return "NVFP4" if name in self.quantised else super().dtype(name)

    def nvfp4_parts(self, name) -> tuple[np.ndarray, np.ndarray, np.float32]:
        """(packed weight, E4M3 block scale bytes, FP32 global scale) of a quantised tensor."""
        (wf, weight), (sf, scale), (gf, scale_2) = self.quantised[name]
        return wf.raw(weight), sf.raw(scale), np.float32(gf.raw(scale_2).reshape(-1)[0])

    def f32(self, name):
        if name in self.quantised:
            return nvfp4.dequantize(*self.nvfp4_parts(name))
        return super().f32(name)


def load_nvfp4_directory(directory: Path, config: ModelConfig, internal) -> Nvfp4Checkpoint:
    """The checkpoint in ``directory`` (``internal(stored, path)`` names a stored tensor as the HF reader does): the
    shards walked as any HF directory's (checkpoint_base.walk_shards), the packed U8 weights and their scales kept
    aside, then each packed weight checked against its scales."""
    packed: dict[str, tuple[str, str]] = {}  # internal name -> (file, stored weight) of the U8 weights
    scales: dict[str, tuple[SafetensorsFile, str]] = {}  # stored scale name -> (file, name)

    def claim(fname, sf, stored, info) -> bool:
        if stored.endswith(SCALE_SUFFIXES):
            scales[stored] = (sf, stored)
            return True
        if info.dtype != "U8":
            return False
        name = internal(stored, sf.path)
        if name is None or name not in expected:
            return False
        rows, cols = expected[name] if len(expected[name]) == 2 else (0, 1)
        if info.shape != (rows, cols // 2) or cols % nvfp4.BLOCK:
            raise CheckpointError(f"{sf.path}: tensor {stored!r}: packed NVFP4 shape {list(info.shape)}, "
                                  f"config.json implies {list(expected[name])} ([rows, cols/2] packed)")
        packed[name] = (fname, stored)
        return True

    expected = config.tensor_shapes()
    opened, _, where = walk_shards(directory, config, internal, claim)
    quantised = {}
    for name, (fname, weight) in packed.items():
        module = weight[: -len(".weight")]
        _check_scales(directory, module, expected[name], scales)
        quantised[name] = ((opened[fname], weight), scales.pop(module + ".weight_scale"),
                           scales.pop(module + ".weight_scale_2"))
        scales.pop(module + ".input_scale", None)
        where[name] = (fname, weight)
    for stored, (sf, _) in scales.items():
        if internal(stored.rsplit(".", 1)[0] + ".weight", sf.path) is not None:
            raise CheckpointError(f"{sf.path}: tensor {stored!r} scales no packed NVFP4 weight")
    refuse_missing(directory, expected, where, "tensor")
    return Nvfp4Checkpoint(directory, config, opened, {n: where[n] for n in expected}, quantised)


def _check_scales(directory, module, shape, scales) -> None:
    rows, cols = shape
    for suffix, dtype, want in ((".weight_scale", "F8_E4M3", (rows, cols // nvfp4.BLOCK)),
                                (".weight_scale_2", "F32", None)):
        stored = module + suffix
        if stored not in scales:
            raise CheckpointError(f"{directory}: NVFP4 tensor {module + '.weight'!r} has no {stored!r}")
        sf, _ = scales[stored]
        info = sf.tensors[stored]
        if info.dtype != dtype or (want is not None and info.shape != want) or (want is None and info.numel != 1):
            raise CheckpointError(f"{sf.path}: tensor {stored!r}: {info.dtype} {list(info.shape)}, expected "
                                  f"{dtype} {list(want) if want else 'with one element'}")
        values = sf.raw(stored)
        if suffix == ".weight_scale":
            bad = (values == 0) | (values >= 0x7F)  # zero, NaN (0x7F, 0xFF) or negative
        else:
            bad = ~np.isfinite(values) | (values <= 0)
        if np.any(bad):
            raise CheckpointError(f"{sf.path}: tensor {stored!r}: {int(np.count_nonzero(bad))} scale(s) that are "
                                  f"zero, negative, NaN or infinite")

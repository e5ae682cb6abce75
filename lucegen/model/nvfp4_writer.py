"""Writing a ModelOpt-layout NVFP4 HF directory from a BF16/FP16 one (``lucegen quantize --format nvfp4``).

Quantised (round to nearest, :mod:`lucegen.model.nvfp4`): the Linear layers of the decoder blocks, i.e. attention
q/k/v/o, DeltaNet in_proj_qkv / in_proj_z / out_proj and the MLP's gate/up/down. Kept as stored: the embedding, the
lm_head (ModelOpt's default config disables its quantiser), every norm, the DeltaNet conv1d, A_log and dt_bias (not
Linear layers), and, by lucegen's choice (ModelOpt's default would quantise them), DeltaNet's in_proj_a / in_proj_b:
[heads, hidden] matrices (a few KB) whose outputs feed the decay and the beta gate, listed in ``exclude_modules``
like the lm_head. A quantised layer gets ``weight``,
``weight_scale`` and ``weight_scale_2``, and the quant_algo is ModelOpt's weight-only ``W4A16_NVFP4``: ``NVFP4``
proper (W4A4) also carries an ``input_scale`` per layer, an activation scale calibrated on data, which this writer
does not run (lucegen's engines keep activations in float). The weight tensors are the same in both.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

from .. import __version__
from ..atomic import atomic_write
from ..errors import CheckpointError
from . import nvfp4
from .checkpoint import load_checkpoint
from .checkpoint_base import INDEX_NAME, SafetensorsCheckpoint
from .config import ModelConfig
from .nvfp4_checkpoint import HF_QUANT_CONFIG, is_nvfp4
from .safetensors_io import write_safetensors

QUANTISED = re.compile(r"layers\.\d+\.(self_attn\.[qkvo]_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
                       r"|mlp\.(gate|up|down)_proj)\.weight")
#: weight-only NVFP4: the activations stay in float, so no input_scale (ModelOpt's "NVFP4" is W4A4 and has one)
QUANT_ALGO = "W4A16_NVFP4"
EXCLUDE_MODULES = ["lm_head", "*linear_attn.in_proj_a", "*linear_attn.in_proj_b"]
SHARD_BYTES = 4 * 1024**3
OWN_FILES = ("config.json", HF_QUANT_CONFIG, INDEX_NAME)


def quantised_names(config: ModelConfig) -> list[str]:
    return [n for n, s in config.tensor_shapes().items()
            if QUANTISED.fullmatch(n) and len(s) == 2 and s[1] % nvfp4.BLOCK == 0]


def quantization_configs() -> tuple[dict, dict]:
    """(hf_quant_config.json, config.json's quantization_config), as ModelOpt's export writes them."""
    producer = {"name": "lucegen", "version": __version__}
    hf_quant = {"producer": producer,
                "quantization": {"quant_algo": QUANT_ALGO, "kv_cache_quant_algo": None,
                                 "group_size": nvfp4.BLOCK, "exclude_modules": EXCLUDE_MODULES}}
    weights = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": nvfp4.BLOCK}
    in_config = {"quant_method": "modelopt", "quant_algo": QUANT_ALGO, "producer": producer,
                 "config_groups": {"group_0": {"weights": weights, "targets": ["Linear"]}},
                 "ignore": EXCLUDE_MODULES}
    return hf_quant, in_config


def source_checkpoint(model: Path) -> SafetensorsCheckpoint:
    """The BF16/FP16 HF checkpoint to quantise: a GGUF, a draft or an NVFP4 checkpoint is one error."""
    if not Path(model).is_dir():
        raise CheckpointError(f"{model}: quantize reads a HF safetensors directory (config.json + *.safetensors)")
    ck = load_checkpoint(model)
    if is_nvfp4(ck):
        raise CheckpointError(f"{model}: already an NVFP4 checkpoint")
    if not isinstance(ck, SafetensorsCheckpoint) or not isinstance(ck.config, ModelConfig):
        raise CheckpointError(f"{model}: not a Qwen3.5 model checkpoint (a DFlash draft?)")
    for name in quantised_names(ck.config):
        if ck.dtype(name) not in ("BF16", "F16", "F32"):
            raise CheckpointError(f"{model}: tensor {ck.where[name][1]!r} is {ck.dtype(name)}, not a float type")
    return ck


def write_nvfp4_checkpoint(ck: SafetensorsCheckpoint, out: Path) -> int:
    """Write ``ck`` quantised into the (empty) directory ``out``; returns how many matrices were quantised."""
    quantised = set(quantised_names(ck.config))
    specs, produce = [], {}
    for name in ck.config.tensor_shapes():
        stored = ck.where[name][1]
        if name in quantised:
            module = stored[: -len(".weight")]
            rows, cols = ck.shape(name)
            parts = _lazy_quantise(ck, name)
            specs += [(stored, "U8", (rows, cols // 2)),
                      (module + ".weight_scale", "F8_E4M3", (rows, cols // nvfp4.BLOCK)),
                      (module + ".weight_scale_2", "F32", ())]
            produce[stored] = lambda parts=parts: parts()[0]
            produce[module + ".weight_scale"] = lambda parts=parts: parts()[1]
            produce[module + ".weight_scale_2"] = lambda parts=parts: np.array(parts()[2], np.float32)
        else:
            specs.append((stored, ck.dtype(name), ck.shape(name)))
            produce[stored] = lambda name=name: ck.raw(name)
    shards = _shards(specs)
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for shard, fname in zip(shards, files):
        write_safetensors(out / fname, shard, lambda stored: produce[stored](), metadata={"format": "pt"})
    if len(files) > 1:
        index = {"metadata": {"total_size": sum(_nbytes(s) for s in specs)},
                 "weight_map": {spec[0]: f for shard, f in zip(shards, files) for spec in shard}}
        atomic_write(out / INDEX_NAME, json.dumps(index, indent=2) + "\n")
    for entry in ck.path.iterdir():  # tokenizer, generation config, chat template: as they are
        if entry.is_file() and entry.suffix != ".safetensors" and entry.name not in OWN_FILES:
            shutil.copy2(entry, out / entry.name)
    hf_quant, in_config = quantization_configs()
    config_json = json.loads((ck.path / "config.json").read_text())
    config_json["quantization_config"] = in_config
    atomic_write(out / HF_QUANT_CONFIG, json.dumps(hf_quant, indent=2) + "\n")
    atomic_write(out / "config.json", json.dumps(config_json, indent=2) + "\n")  # last: the directory is complete
    return len(quantised)


def _lazy_quantise(ck, name):
    """A function returning ``nvfp4.quantize(ck.f32(name))``, computed on the first call and kept until the third
    part has been taken (the three tensors are written one after the other)."""
    cache: dict = {}

    def parts():
        if "value" not in cache:
            cache["value"], cache["taken"] = nvfp4.quantize(ck.f32(name)), 0
        value = cache["value"]
        cache["taken"] += 1
        if cache["taken"] == 3:
            cache.clear()
        return value

    return parts


def _nbytes(spec) -> int:
    _, dtype, shape = spec
    return int(np.prod(shape, dtype=np.int64)) * (4 if dtype == "F32" else 2 if dtype in ("BF16", "F16") else 1)


def _shards(specs: list) -> list[list]:
    shards, used = [[]], 0
    for spec in specs:
        if shards[-1] and used + _nbytes(spec) > SHARD_BYTES:
            shards.append([])
            used = 0
        shards[-1].append(spec)
        used += _nbytes(spec)
    return shards

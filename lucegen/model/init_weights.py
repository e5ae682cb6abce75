"""Random-weight checkpoints with the real shapes and the model family's initialisation statistics.

Every tensor is drawn from its own generator seeded by (seed, crc32(name)), so a tensor's values do not depend on the
output format or on the order of writing: the safetensors and GGUF files written with the same seed hold the same
weights (up to the GGUF quantisation). Statistics (HF ``Qwen3_5PreTrainedModel._init_weights`` unless noted):

- every Linear and the embedding: N(0, initializer_range = 0.02)
- conv1d: torch's default Conv1d init, kaiming-uniform(a=sqrt(5)) = U(-1/sqrt(K), 1/sqrt(K)) (HF would draw
  N(0, 0.02), which leaves the DeltaNet inputs near zero)
- dt_bias: ones; A_log: log U(0.01, 16)
- the (1 + w) RMSNorms: HF zeros, drawn here as N(0, 0.05) so that a test cannot pass on all-zero weights
- the gated RMSNorm of DeltaNet (weight used directly): HF ones, drawn here as 1 + N(0, 0.05)
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import zlib
from functools import cache
from pathlib import Path

import numpy as np

from ..atomic import atomic_write
from ..errors import CheckpointError
from .config import ModelConfig
from .dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from .init_tokenizer import write_tokenizer
from .safetensors_io import write_safetensors

NORM_SPREAD = 0.05
SHARD_BYTES = 4 * 1024**3  # HF-style shards of at most ~4 GB
ONE_FILE_BYTES = 5 * 1024**3  # below this, a single model.safetensors


def tensor_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


@cache
def _normal_table() -> np.ndarray:
    """bf16 bits of the 65536 quantiles Phi^-1((i + 0.5) / 65536): a uniform uint16 index gives a N(0, 1) draw
    (discretised at 2^-16 in probability, far finer than bf16 itself)."""
    inv = statistics.NormalDist().inv_cdf
    z = np.array([inv((i + 0.5) / 65536) for i in range(65536)], dtype=np.float64)
    return z


@cache
def _scaled_table(std: float) -> np.ndarray:
    return f32_to_bf16_bits((_normal_table() * std).astype(np.float32))


def _lookup(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    return _lookup_numba(table, index) if _lookup_numba is not None else table[index]


try:
    import numba

    @numba.njit(parallel=True, cache=True)
    def _lookup_numba(table, index):
        out = np.empty(index.size, np.uint16)
        for i in numba.prange(index.size):
            out[i] = table[index[i]]
        return out
except ImportError:  # pragma: no cover
    _lookup_numba = None


def normal_bf16(rng: np.random.Generator, shape, std: float) -> np.ndarray:
    """N(0, std^2) draws as bf16 bits (fast path for the big matrices)."""
    n = int(np.prod(shape, dtype=np.int64))
    index = np.frombuffer(rng.bytes(2 * n), dtype=np.uint16)
    return _lookup(_scaled_table(float(std)), index).reshape(shape)


def init_tensor(config: ModelConfig, name: str, seed: int) -> np.ndarray:
    """The initial value of tensor ``name`` (internal name) as bf16 bits, shape from the config."""
    shape = config.tensor_shapes()[name]
    rng = tensor_rng(seed, name)
    leaf = name.rsplit(".", 2)
    if name.endswith("linear_attn.dt_bias"):
        values = np.ones(shape, np.float32)
    elif name.endswith("linear_attn.A_log"):
        values = np.log(rng.uniform(0.01, 16.0, size=shape)).astype(np.float32)
    elif name.endswith("linear_attn.conv1d.weight"):
        bound = 1.0 / np.sqrt(shape[1] * shape[2])  # kaiming-uniform(a=sqrt(5)) of a depthwise conv: fan_in = K
        values = rng.uniform(-bound, bound, size=shape).astype(np.float32)
    elif name.endswith("linear_attn.norm.weight"):
        values = (1.0 + NORM_SPREAD * rng.standard_normal(shape)).astype(np.float32)
    elif name.endswith("norm.weight"):  # input/post_attention layernorm, final norm, q_norm, k_norm: (1 + w)
        values = (NORM_SPREAD * rng.standard_normal(shape)).astype(np.float32)
    elif len(shape) == 2 and leaf[-1] == "weight":  # every Linear and the embedding
        return normal_bf16(rng, shape, config.initializer_range)
    else:
        raise CheckpointError(f"init-weights: no initialiser for tensor {name!r}")
    return f32_to_bf16_bits(values)


def init_tensor_f32(config: ModelConfig, name: str, seed: int) -> np.ndarray:
    return bf16_bits_to_f32(init_tensor(config, name, seed))


# ------------------------------------------------------------------------------------------------ progress
class Progress:
    """A byte-count progress bar on stderr: a redrawn bar on a TTY, otherwise a line every 10 %."""

    def __init__(self, total: int, label: str, stream=None):
        self.total, self.label, self.done = max(total, 1), label, 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()
        self.last_decile = -1

    def __call__(self, nbytes: int) -> None:
        self.done += nbytes
        frac = min(self.done / self.total, 1.0)
        if self.tty:
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}% {self.done / 1e9:7.2f} GB")
            self.stream.flush()
        elif int(frac * 10) > self.last_decile:
            self.last_decile = int(frac * 10)
            self.stream.write(f"{self.label}: {frac * 100:.0f}%\n")

    def finish(self) -> float:
        elapsed = time.perf_counter() - self.start
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()
        return elapsed


# ------------------------------------------------------------------------------------------------ writers
def hf_name(name: str) -> str:
    """Internal name -> the name in a text-only Qwen3_5ForCausalLM checkpoint."""
    return name if name == "lm_head.weight" else "model." + name


def checkpoint_config(config: ModelConfig) -> ModelConfig:
    """The config written beside random weights: eos is the generated tokenizer's <|endoftext|>."""
    import dataclasses

    from .tokenizer import EOS_ID

    return dataclasses.replace(config, eos_token_id=EOS_ID)


def write_json_atomic(path: Path, data) -> None:
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def write_hf_checkpoint(config: ModelConfig, out: Path, seed: int = 0, progress: bool = True) -> float:
    """Write config.json, model.safetensors (or shards + index), tokenizer.json, tokenizer_config.json.
    Returns seconds spent."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = checkpoint_config(config)
    shapes = config.tensor_shapes()
    sizes = {n: 2 * int(np.prod(s, dtype=np.int64)) for n, s in shapes.items()}
    total = sum(sizes.values())
    shards: list[list[str]] = [[]]
    used = 0
    for name in shapes:
        if total > ONE_FILE_BYTES and shards[-1] and used + sizes[name] > SHARD_BYTES:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += sizes[name]
    if len(shards) == 1:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    bar = Progress(total, f"writing {out / files[0] if len(files) == 1 else out}") if progress else None
    (out / "config.json").unlink(missing_ok=True)  # until the new weights are complete, the directory is no model
    write_tokenizer(out, config.vocab_size)
    for names, fname in zip(shards, files):
        write_safetensors(out / fname, [(hf_name(n), "BF16", shapes[n]) for n in names],
                          lambda stored: init_tensor(config, stored.removeprefix("model."), seed),
                          metadata={"format": "pt"}, on_bytes=bar)
    if len(files) > 1:
        index = {"metadata": {"total_size": total},
                 "weight_map": {hf_name(n): f for names, f in zip(shards, files) for n in names}}
        write_json_atomic(out / "model.safetensors.index.json", index)
    else:
        (out / "model.safetensors.index.json").unlink(missing_ok=True)
    for stale in out.glob("model*.safetensors"):  # shards of an earlier, differently sharded write
        if stale.name not in files:
            stale.unlink()
    write_json_atomic(out / "config.json", config.to_hf_config())  # last: a directory with config.json is complete
    return bar.finish() if bar else 0.0

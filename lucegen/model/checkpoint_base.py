"""The :class:`Checkpoint` interface every checkpoint reader returns, and the safetensors checkpoint (a directory of
shards, with or without their index) that the HF and DFlash readers build on. :mod:`lucegen.model.checkpoint` opens
any checkpoint path."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from .config import ModelConfig
from .dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from .safetensors_io import SafetensorsFile, check_half_dtypes

WEIGHT_DTYPES = ("BF16", "F16", "F32")
INDEX_NAME = "model.safetensors.index.json"


class Checkpoint(ABC):
    """Weights under internal names. ``f32(name)`` float32 array; ``bf16(name)`` uint16 bf16 bits (exact for BF16
    checkpoints, rounded to nearest even otherwise); ``names()``; ``shape(name)``; ``dtype(name)`` (the stored type:
    'BF16', 'F32', 'Q4_K', ...)."""

    config: ModelConfig
    path: Path

    @abstractmethod
    def names(self) -> list[str]:
        ...

    @abstractmethod
    def shape(self, name: str) -> tuple[int, ...]:
        ...

    @abstractmethod
    def dtype(self, name: str) -> str:
        ...

    @abstractmethod
    def f32(self, name: str) -> np.ndarray:
        ...

    def bf16(self, name: str) -> np.ndarray:
        return f32_to_bf16_bits(self.f32(name))

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def _unknown(self, name: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: no tensor {name!r} in this checkpoint")


class SafetensorsCheckpoint(Checkpoint):
    """A HF directory: internal name -> (file, name in the file)."""

    def __init__(self, path: Path, config: ModelConfig, files: dict[str, SafetensorsFile],
                 where: dict[str, tuple[str, str]]):
        self.path, self.config, self.files, self.where = path, config, files, where

    def names(self) -> list[str]:
        return list(self.where)

    def _info(self, name):
        try:
            file, stored = self.where[name]
        except KeyError:
            raise self._unknown(name) from None
        return self.files[file], stored

    def shape(self, name):
        f, stored = self._info(name)
        return f.tensors[stored].shape

    def dtype(self, name):
        f, stored = self._info(name)
        return f.tensors[stored].dtype

    def raw(self, name) -> np.ndarray:
        f, stored = self._info(name)
        return f.raw(stored)

    def f32(self, name):
        f, stored = self._info(name)
        data, dtype = f.raw(stored), f.tensors[stored].dtype
        if dtype == "BF16":
            return bf16_bits_to_f32(data)
        return np.array(data, dtype=np.float32)

    def bf16(self, name):
        f, stored = self._info(name)
        if f.tensors[stored].dtype == "BF16":
            return np.array(f.raw(stored))
        return f32_to_bf16_bits(self.f32(name))


def _shard_files(directory: Path) -> tuple[list[Path], dict[str, str] | None]:
    index = directory / INDEX_NAME
    if index.exists():
        try:
            data = json.loads(index.read_text())
            weight_map = data["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError("weight_map is not an object of file names")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: invalid index: {exc}") from None
        files = []
        for name in dict.fromkeys(weight_map.values()):
            shard = directory / name
            if Path(name).name != name or not shard.is_file():
                raise CheckpointError(f"{index}: weight_map names shard {name!r}, which is not in {directory}")
            files.append(shard)
        return files, weight_map
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors files and no {INDEX_NAME}")
    return files, None


def record_tensor(path, fname: str, stored: str, name: str, info, expected: dict, where: dict) -> None:
    """Check one stored tensor of a shard (not seen before, a weight dtype, the shape the config implies) and record
    where it lives: ``where[name] = (fname, stored)``."""
    if name in where:
        raise CheckpointError(f"{path}: tensor {stored!r} duplicates {where[name][1]!r} in {where[name][0]}")
    if info.dtype not in WEIGHT_DTYPES:
        raise CheckpointError(f"{path}: tensor {stored!r}: dtype {info.dtype} (expected one of "
                              f"{', '.join(WEIGHT_DTYPES)})")
    if info.shape != expected[name]:
        raise CheckpointError(f"{path}: tensor {stored!r}: shape {list(info.shape)}, config.json implies "
                              f"{list(expected[name])}")
    where[name] = (fname, stored)


def walk_shards(directory: Path, config, internal, claim=None) -> tuple[dict, dict, dict]:
    """Open ``directory``'s safetensors shards (and their index, if any) and record each stored tensor of
    ``config.tensor_shapes()``: ``internal(stored, path)`` names it (None: skip it; it raises for one that does not
    belong); ``claim(fname, shard, stored, info)``, when given, sees each tensor first and returns True for one it
    keeps itself (a format's extra tensors). Every shard and index entry is checked against the other, and every
    recorded tensor for dtype and shape. Returns (opened shards by file name, expected shapes, where each internal
    name lives: (file, stored))."""
    files, weight_map = _shard_files(directory)
    opened = {f.name: SafetensorsFile(f) for f in files}
    expected = config.tensor_shapes()
    where: dict[str, tuple[str, str]] = {}
    for fname, sf in opened.items():
        for stored, info in sf.tensors.items():
            if weight_map is not None and weight_map.get(stored) != fname:
                if stored in weight_map:  # the index places it in another shard: a duplicate
                    raise CheckpointError(f"{sf.path}: tensor {stored!r}: the index says it lives in "
                                          f"{weight_map[stored]!r}")
                raise CheckpointError(f"{sf.path}: tensor {stored!r} is not listed in {INDEX_NAME}")
            if claim is not None and claim(fname, sf, stored, info):
                continue
            name = internal(stored, sf.path)
            if name is not None:
                record_tensor(sf.path, fname, stored, name, info, expected, where)
    if weight_map is not None:
        for stored, fname in weight_map.items():
            if stored not in opened[fname].tensors:
                raise CheckpointError(f"{directory / fname}: tensor {stored!r} listed in {INDEX_NAME} is missing")
    check_half_dtypes((opened[f].path, stored, opened[f].tensors[stored].dtype) for f, stored in where.values())
    return opened, expected, where


def refuse_missing(directory: Path, expected: dict, where: dict, what: str) -> None:
    """One line naming the first of ``expected``'s tensors that ``where`` lacks (``what``: how to call them)."""
    missing = [n for n in expected if n not in where]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"{directory}: missing {what} {missing[0]!r}{more}")


def read_safetensors_directory(directory: Path, config, internal, what: str) -> SafetensorsCheckpoint:
    """The checkpoint in ``directory``'s safetensors shards with the tensors of ``config.tensor_shapes()``
    (:func:`walk_shards`); ``what`` names the tensors in the error for a missing one."""
    opened, expected, where = walk_shards(directory, config, internal)
    refuse_missing(directory, expected, where, what)
    return SafetensorsCheckpoint(directory, config, opened, {n: where[n] for n in expected})

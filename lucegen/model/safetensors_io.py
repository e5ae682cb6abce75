"""Reading and writing ``.safetensors`` files without trusting them.

Format: 8-byte little-endian header length N, N bytes of JSON ``{name: {dtype, shape, data_offsets: [begin, end]},
"__metadata__": {str: str}}``, then the data region; offsets are relative to the start of the data region. Every
inconsistency (truncation, a header that lies about offsets, overlapping tensors, a size that does not match
dtype x shape) is one :class:`CheckpointError` naming the file and the tensor. Data is memory-mapped.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..atomic import atomic_open
from ..errors import CheckpointError

# safetensors dtype name -> numpy dtype used to hold the raw elements (BF16 as its uint16 bits)
DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"), "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1"),
}
MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets inside the data region
    end: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class SafetensorsFile:
    """One ``.safetensors`` file: validated header, memory-mapped data (opened on first access)."""

    def __init__(self, path):
        self.path = Path(path)
        self.tensors, self.metadata, self.data_start = read_header(self.path)
        self._map = None

    def names(self) -> list[str]:
        return list(self.tensors)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's elements as stored (BF16 as uint16 bits), a read-only view into the mapped file."""
        info = self.tensors[name]
        if self._map is None:
            size = self.path.stat().st_size
            if size <= self.data_start:  # nothing to map (all tensors empty)
                self._map = np.zeros(0, np.uint8)
            else:
                self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        data = self._map[self.data_start + info.begin : self.data_start + info.end]
        return data.view(DTYPES[info.dtype]).reshape(info.shape)


def read_header(path) -> tuple[dict[str, TensorInfo], dict, int]:
    """Parse and check a safetensors header. Returns (tensors by name, __metadata__, start of the data region)."""
    path = Path(path)

    def bad(reason, tensor=None):
        where = f"{path}: tensor {tensor!r}: " if tensor is not None else f"{path}: "
        return CheckpointError(where + reason)

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"truncated: {size} bytes, not even the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER:
                raise bad(f"header length {n} exceeds the {MAX_HEADER}-byte limit (not a safetensors file?)")
            if 8 + n > size:
                raise bad(f"truncated: header says {n} bytes of JSON but the file has {size - 8} after the length")
            text = f.read(n)
    except OSError as exc:
        raise bad(f"cannot read: {exc.strerror or exc}") from None
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise bad(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise bad(f"header is a JSON {type(header).__name__}, expected an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise bad("__metadata__ is not an object")
    data_size = size - 8 - n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if not isinstance(entry, dict):
            raise bad("entry is not an object", name)
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise bad(f"unknown dtype {dtype!r}", name)
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise bad(f"shape {shape!r} is not a list of non-negative integers", name)
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise bad(f"data_offsets {offsets!r} is not [begin, end]", name)
        begin, end = offsets
        info = TensorInfo(name, dtype, tuple(shape), begin, end)
        if not 0 <= begin <= end:
            raise bad(f"data_offsets [{begin}, {end}] are not ordered", name)
        if end > data_size:
            raise bad(f"data_offsets end {end} lies past the end of the data ({data_size} bytes; truncated file?)",
                      name)
        if end - begin != info.numel * DTYPES[dtype].itemsize:
            raise bad(f"data_offsets span {end - begin} bytes but {dtype} {list(shape)} needs "
                      f"{info.numel * DTYPES[dtype].itemsize}", name)
        tensors[name] = info
    previous = None
    for info in sorted(tensors.values(), key=lambda i: (i.begin, i.end)):
        if info.begin == info.end:
            continue
        if previous is not None and info.begin < previous.end:
            raise bad(f"data overlaps tensor {previous.name!r}", info.name)
        # the tensors tile the data region (as the safetensors library requires): a gap means a tensor whose dtype
        # or shape was changed to a smaller one
        covered = previous.end if previous is not None else 0
        if info.begin > covered:
            raise bad(f"data starts at {info.begin}, leaving {info.begin - covered} unused bytes before it "
                      f"(a dtype or shape that does not match the data?)", info.name)
        previous = info
    covered = previous.end if previous is not None else 0
    if data_size > covered:
        raise bad(f"{data_size - covered} bytes of data after the last tensor's end {covered} (a dtype or shape that "
                  f"does not match the data?)")
    return tensors, metadata, 8 + n


def check_half_dtypes(tensors: Iterable[tuple[Path, str, str]]) -> None:
    """The 16-bit float tensors of one checkpoint share one type: a BF16 tensor among F16 ones (or the reverse) is a
    relabelled dtype, which no byte count can reveal. ``tensors``: (file, stored name, dtype)."""
    first = None
    for path, stored, dtype in tensors:
        if dtype not in ("BF16", "F16"):
            continue
        if first is None:
            first = (path, stored, dtype)
        elif dtype != first[2]:
            raise CheckpointError(f"{path}: tensor {stored!r}: dtype {dtype}, but tensor {first[1]!r} in "
                                  f"{first[0].name} is {first[2]}: one checkpoint's 16-bit tensors share one type")


# ------------------------------------------------------------------------------------------------ writing
def write_safetensors(path, specs: Iterable[tuple[str, str, tuple[int, ...]]],
                      produce: Callable[[str], np.ndarray], metadata: dict | None = None,
                      on_bytes: Callable[[int], None] | None = None) -> None:
    """Write a safetensors file tensor by tensor: ``specs`` lists (name, dtype, shape) in file order; ``produce(name)``
    returns that tensor's elements (BF16 as uint16 bits) only when it is written, so memory holds one tensor.
    Atomic: written to a temp file, fsynced, renamed."""
    path = Path(path)
    specs = list(specs)
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, dtype, shape in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # align the data region to 8 bytes like the safetensors library
    with atomic_open(path) as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, dtype, shape in specs:
            array = np.asarray(produce(name))
            array = array if array.flags.c_contiguous else np.ascontiguousarray(array)  # keeps a 0-d scalar 0-d
            if array.shape != tuple(shape) or array.dtype.itemsize != DTYPES[dtype].itemsize:
                raise ValueError(f"{name}: produced {array.dtype} {array.shape}, declared {dtype} {shape}")
            f.write(memoryview(array.astype(DTYPES[dtype], copy=False).reshape(-1)).cast("B"))
            if on_bytes:
                on_bytes(array.nbytes)

"""The quantised GEMM's weight layout (templates/kernels/quant_gemm/block_types.cuh.j2): ``tile_pack`` permutes a
matrix's GGML bytes into tile-blocks (16 rows x one block each), so that lane 4 g + t of a warp reads its m16n8k16
fragments of rows g and g + 8 as 16-byte chunks (see the template's notes), or, for a group on int8 activations, its
m16n8k32 fragments of values 8t .. 8t + 7 of each 32; ``tile_unpack`` inverts it. The bytes are not changed, only
moved. Host-side numpy alone: the launcher (lucegen/runtime/quant_gemm.py) uploads what this packs.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import LucegenError
from ..families.quant_gemm import GEMM_TYPES, INT8_TYPES
from ..model.quant import TYPES

#: Rows of a row tile (a tile-block's rows; the MMAs' 16).
TILE_ROWS = 16


@functools.cache
def _tile_map(type_name: str, int8: bool = False) -> np.ndarray:
    """Byte i of a tile-block comes from byte ``map[i] % BYTES`` of row ``map[i] // BYTES``'s block (the template's
    Qg<type>::load reads it back in this order). ``int8``: the int8-activation kernels' order of the values of each
    32, lane t's words j = 0, 1 holding values 8 t + 4 j .. (the float kernels': 16 j + 4 t .. of a K-quant
    sub-block; Q6_K's sub-blocks of 16 then sit on lanes t < 2 and t >= 2, and lane 4 g + t holds scales
    4 t .. 4 t + 3 of rows g and g + 8 alone)."""
    size = TYPES[type_name][2]
    out = np.full(TILE_ROWS * size, -1, np.int64)

    def put(dst: int, row: int, src: int, n: int = 1) -> None:
        out[dst : dst + n] = row * size + src + np.arange(n)

    def chunk(base: int, src_of) -> None:
        """A 512-byte chunk: lane l = 4 g + t gets words src_of(t, w) of rows g (words 0, 1) and g + 8 (2, 3)."""
        for lane in range(32):
            g, t = divmod(lane, 4)
            for w in range(4):
                put(base + 16 * lane + 4 * w, g + 8 * (w // 2), src_of(t, w % 2), 4)

    if int8 and type_name not in INT8_TYPES:
        raise LucegenError(f"no int8-activation tile layout for GGML type {type_name}")
    if type_name in ("Q4_K", "Q5_K"):
        for r in range(TILE_ROWS):
            put(16 * r, r, 0, 16)  # d, dmin, 12 bytes of scales
        qs = 16

        def value(t: int, j: int) -> int:  # the lane's word j: values l .. l + 3 of a sub-block
            return 8 * t + 4 * j if int8 else 16 * j + 4 * t
        if type_name == "Q5_K":
            chunk(256, lambda t, j: 16 + value(t, j))  # qh bytes l ..
            qs = 48
        for p in range(4):  # sub-blocks 2p, 2p + 1: qs bytes 32 p + l ..
            chunk(256 + (512 if type_name == "Q5_K" else 0) + 512 * p, lambda t, j, p=p: qs + 32 * p + value(t, j))
    elif type_name == "Q6_K":
        for r in range(TILE_ROWS):
            if int8:  # lane 4 g + t: scales 4 t .. 4 t + 3 of row g, then of row g + 8; d of rows g, g + 8 a g
                g, h = r % 8, 4 * (r // 8)
                for t in range(4):
                    put(8 * (4 * g + t) + h, r, 192 + 4 * t, 4)
                put(256 + 4 * g + h // 2, r, 208, 2)
            else:
                put(16 * r, r, 192, 16)  # int8 scales
                put(256 + 2 * r, r, 208, 2)  # d
        for h in range(2):
            if int8:  # lane t's values 8 t .. 8 t + 7 of each 32: ql bytes 64 h + 32 i + 8 t + 4 j, qh 32 h + 8 t + 4 j
                for i in range(2):
                    chunk(288 + 512 * (2 * h + i), lambda t, j, h=h, i=i: 64 * h + 32 * i + 8 * t + 4 * j)
                chunk(2336 + 512 * h, lambda t, j, h=h: 128 + 32 * h + 8 * t + 4 * j)
            else:
                for i in range(2):  # ql words: u even (bytes 64 h + 16 i + 4 t ..), u odd (+ 32)
                    chunk(288 + 512 * (2 * h + i), lambda t, w, h=h, i=i: 64 * h + 32 * w + 16 * i + 4 * t)
                chunk(2336 + 512 * h, lambda t, i, h=h: 128 + 32 * h + 16 * i + 4 * t)  # qh words: i = 0, 1
    elif type_name == "Q8_0":
        for r in range(TILE_ROWS):
            put(2 * r, r, 0, 2)
        chunk(32, lambda t, j: 2 + 16 * j + 4 * t)
    else:
        raise LucegenError(f"no tile layout for GGML type {type_name}")
    assert (np.sort(out) == np.arange(out.size)).all(), type_name  # a permutation
    return out


@functools.cache
def _tile_words(type_name: str, int8: bool = False) -> tuple[np.dtype, np.ndarray]:
    """:func:`_tile_map` in the widest words it moves whole (every run of it starts and ends on such a word): the word
    type, and the word index map. A gather of words is many times faster than one of bytes."""
    byte_map = _tile_map(type_name, int8)
    for width, dtype in ((8, np.uint64), (4, np.uint32), (2, np.uint16)):
        runs = byte_map.reshape(-1, width)
        if TYPES[type_name][2] % width == 0 and (runs - runs[:, :1] == np.arange(width)).all() \
                and (runs[:, 0] % width == 0).all():
            return np.dtype(dtype), runs[:, 0] // width
    return np.dtype(np.uint8), byte_map


def tile_bytes(type_name: str, rows: int, cols: int) -> int:
    _, values, size = TYPES[type_name]
    return math.ceil(rows / TILE_ROWS) * (cols // values) * TILE_ROWS * size


@functools.cache
def _tile_gather(type_name: str, blocks: int, int8: bool = False) -> tuple[np.dtype, np.ndarray]:
    """Where each word of a row tile's tile-blocks comes from: (word type, index) such that tile-block b's words are
    ``words[index[b W : (b + 1) W]]`` of the tile's 16 GGML rows as one run of words (rows of ``blocks`` blocks)."""
    word, word_map = _tile_words(type_name, int8)
    size = TYPES[type_name][2]
    start = word_map * word.itemsize  # the first byte of each word: row * size + offset in the row's block
    row, offset = start // size, start % size
    index = row[None, :] * blocks * size + np.arange(blocks)[:, None] * size + offset[None, :]
    return word, (index // word.itemsize).reshape(-1)


def tile_pack(raw: np.ndarray, type_name: str, rows: int, cols: int, int8: bool = False) -> np.ndarray:
    """GGML bytes of a [rows, cols] matrix (row-major blocks) -> tile-blocks [row tile][block][16 * BYTES] (rows
    padded to a multiple of 16 with zero blocks, which dequantise to 0): one gather of words per matrix. ``int8``:
    the int8-activation kernels' layout (:func:`_tile_map`)."""
    if type_name not in GEMM_TYPES:
        raise LucegenError(f"the quantised GEMM reads {', '.join(GEMM_TYPES)} blocks, not {type_name}")
    _, values, size = TYPES[type_name]
    if cols % values:
        raise LucegenError(f"{type_name} rows of {cols} values are not whole blocks of {values}")
    nb, tiles = cols // values, math.ceil(rows / TILE_ROWS)
    raw = np.ascontiguousarray(raw, np.uint8).reshape(-1)
    if raw.size != rows * nb * size:
        raise LucegenError(f"{type_name} [{rows}, {cols}]: {raw.size} bytes, expected {rows * nb * size}")
    if rows % TILE_ROWS:
        padded = np.zeros(tiles * TILE_ROWS * nb * size, np.uint8)
        padded[: raw.size] = raw
        raw = padded
    word, index = _tile_gather(type_name, nb, int8)
    return np.take(raw.view(word).reshape(tiles, -1), index, axis=1).view(np.uint8).reshape(-1)


def tile_unpack(packed: np.ndarray, type_name: str, rows: int, cols: int, int8: bool = False) -> np.ndarray:
    """Inverse of :func:`tile_pack`: the GGML bytes of the [rows, cols] matrix."""
    _, values, size = TYPES[type_name]
    nb, tiles = cols // values, math.ceil(rows / TILE_ROWS)
    word, index = _tile_gather(type_name, nb, int8)
    out = np.empty(tiles * TILE_ROWS * nb * size, np.uint8)
    out.view(word).reshape(tiles, -1)[:, index] = np.ascontiguousarray(packed, np.uint8).view(word).reshape(tiles, -1)
    return out[: rows * nb * size]

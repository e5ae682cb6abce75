"""A descriptor's tuning choices: the ``[tuning.<family>]`` tables, their defaults and their checks.

Hardware facts (compute units, shared memory, features) are the descriptor's top-level fields; the values here are
choices measured on one chip (which kernel variants a family renders, pipeline depths, block shapes, occupancy
models). A chip states what was measured on it, with a comment saying what, in its TOML:

    [tuning.quant_gemm]
    ring_types = ["Q6_K"]      # lm_head 408 -> 358 us at one row (H100)

Every key is optional: a key the file leaves out takes :data:`DEFAULTS`, the conservative choices of a chip nobody
has measured (optional kernel variants off, the shallowest pipelines, the tree kernels' common block), defined here
and nowhere else; ``lucegen show`` marks which values are defaults. Kernel design constants (a template's fixed
layout, its block types, its warps) are not here: they stay beside the family that renders them.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any

from .errors import DescriptorError

# What the checks know of the families' kernels (this module sits below lucegen/families/, which it cannot import;
# tests/test_tuning.py holds them equal to the families' own constants):
#: Groups of 8 tokens a quant_gemm block takes (its kernels nt1 .. nt4: quant_gemm NT_MAX).
_QUANT_GEMM_NT = range(1, 5)
#: Block types whose one-row launches may stream their weights through the ring (the 256-value K-quants: K_QUANTS).
_RING_TYPES = ("Q4_K", "Q5_K", "Q6_K")
#: Warps per block of the int8-activation kernels (quant_gemm Q8_WARPS).
_INT8_WARPS = 4
#: tree_attention_packed's key streams a warp (tree_verify ATTENTION_PACK).
_ATTENTION_PACK = 4


@dataclass(frozen=True)
class QuantGemmTuning:
    """lucegen/families/quant_gemm.py: which kernel variants the family renders and how the launcher picks them."""

    staged_nt: tuple[int, ...]  # groups of 8 tokens whose kernels also come staged (nt<N>s; needs cp.async)
    stage_min_reuse: int  # stage a launch where its blocks' row tiles x token groups reach this
    ring_types: tuple[str, ...]  # block types whose one-row groups stream weights through per-warp rings (m1r)
    ring_stages: int  # slots of a warp's weight ring
    wgmma_nt: tuple[int, ...]  # groups of 8 tokens whose kernels also come as warpgroup MMAs (nt<N>w; needs wgmma)
    wgmma_stages: int  # rounds of a wgmma launch in shared memory
    wgmma_buffers: int  # sub-blocks of wgmma products in flight per warp
    prequantised_nt: tuple[int, ...]  # groups of 8 tokens whose int8 kernels also come prequantised (nt<N>qp)
    prequantised_rows: int  # rows of a launch, at most, that the prequantised kernels take (their workspace)
    #: the one-group int8 kernel's other residencies (resident blocks per compute unit) and a full wave's time at
    #: each, relative to one at the int8 kernels' own residency (lucegen/families/quant_gemm.py Q8_BLOCKS_PER_CU)
    int8_wave_time: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class TreeVerifyTuning:
    """lucegen/families/tree_verify.py: the verify kernels' block shapes and splits."""

    rule_threads: int  # threads per block of tree_delta_rule (TV_RULE_NT)
    rule_round: int  # tree_delta_rule's slots a round (TV_RULE_ROUND)
    attention_streams: int  # tree_attention's key streams a block, a warp each (TV_AT_STREAMS)
    mma_waves: int  # tree_attention_mma's grid, at most this many waves of the chip


@dataclass(frozen=True)
class Tuning:
    """A descriptor's [tuning] tables, resolved: every family's values, and which of them are defaults."""

    quant_gemm: QuantGemmTuning
    tree_verify: TreeVerifyTuning
    #: "<table>.<key>" of every value that came from DEFAULTS, not from the descriptor
    defaults: tuple[str, ...] = dataclasses.field(default=(), metadata={"derived": True})


#: The tuning of a chip nobody measured, the one place these defaults live. Each is the choice that bets nothing on
#: the chip: no optional kernel variant (every variant computes the same bits as the plain kernel it replaces, so
#: leaving it out only forgoes a speed-up), the shallowest pipeline that still overlaps, the tree kernels' common
#: block. Where a value only matters with a variant that is off, it is the plain kernel's equivalent.
DEFAULTS: dict[str, dict[str, Any]] = {
    "quant_gemm": {
        "staged_nt": [],            # no staged twins: every launch reads its activations itself
        "stage_min_reuse": 8,       # (read with staged_nt) stage where a block reads each activation row 8 times
        "ring_types": [],           # no ring kernel (m1r): one-row launches load weights into registers
        "ring_stages": 2,           # (read with ring_types) one slot computing, one filling
        "wgmma_nt": [],             # no warpgroup-MMA twins
        "wgmma_stages": 2,          # (read with wgmma_nt) one round computing, one arriving
        "wgmma_buffers": 1,         # (read with wgmma_nt) the fewest registers
        "prequantised_nt": [],      # no prequantised twins: int8 launches quantise their activations as they load
        "prequantised_rows": 32,    # (read with prequantised_nt) one row group: the smallest workspace
        "int8_wave_time": {},       # the one-group int8 kernel at its own residency alone: no wave-time model
    },
    "tree_verify": {
        "rule_threads": 256,        # the tree kernels' common block (TV_NT), not sized to the chip's compute units
        "rule_round": 1,            # each slot's output sums at once, no round to overlap them with the next step
        "attention_streams": 8,     # a block of the common 256 threads, a warp a key stream
        "mma_waves": 2,             # two waves of blocks; longer ranges loop in a block
    },
}

_TABLES = {"quant_gemm": QuantGemmTuning, "tree_verify": TreeVerifyTuning}


def parse_tuning(data: Any, path) -> Tuning:
    """The ``[tuning]`` table of a descriptor (None: absent), every key it leaves out from DEFAULTS, type-checked
    (the chip-dependent checks are :func:`check_tuning`'s)."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise DescriptorError(path, "tuning", f"expected a table, got {type(data).__name__}")
    for table in data:
        if table not in _TABLES:
            raise DescriptorError(path, f"tuning.{table}", f"unknown table (known: {', '.join(_TABLES)})")
    tables, defaults = {}, []
    for table, cls in _TABLES.items():
        given = data.get(table, {})
        if not isinstance(given, dict):
            raise DescriptorError(path, f"tuning.{table}", f"expected a table, got {type(given).__name__}")
        hints = typing.get_type_hints(cls)
        for key in given:
            if key not in hints:
                raise DescriptorError(path, f"tuning.{table}.{key}",
                                      f"unknown key (known: {', '.join(sorted(hints))})")
        values = {}
        for key, hint in hints.items():
            if key not in given:
                defaults.append(f"{table}.{key}")
            value = given[key] if key in given else DEFAULTS[table][key]
            values[key] = _parse_value(hint, value, path, f"tuning.{table}.{key}")
        tables[table] = cls(**values)
    return Tuning(**tables, defaults=tuple(defaults))


def _parse_value(hint, value: Any, path, name: str) -> Any:
    def fail(reason: str):
        raise DescriptorError(path, name, reason)

    def integer(v) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            fail(f"expected an integer, got {v!r}")
        if v <= 0:
            fail(f"must be positive, got {v}")
        return v

    if hint is int:
        return integer(value)
    if hint == tuple[int, ...]:
        if not isinstance(value, list):
            fail(f"expected an array of integers, got {value!r}")
        values = tuple(integer(v) for v in value)
        if list(values) != sorted(set(values)):
            fail(f"must be increasing, without repeats: {list(values)}")
        return values
    if hint == tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            fail(f"expected an array of strings, got {value!r}")
        if len(set(value)) != len(value):
            fail(f"lists a value twice: {value!r}")
        return tuple(value)
    if hint == tuple[tuple[int, float], ...]:  # a table of integer keys: { 4 = 1.19 }
        if not isinstance(value, dict):
            fail(f"expected a table of residency = relative time, got {value!r}")
        pairs = []
        for key, time in value.items():
            if not key.isdigit() or int(key) < 1:
                fail(f"key {key!r} is not a positive integer (resident blocks per compute unit)")
            if isinstance(time, bool) or not isinstance(time, (int, float)) or not 0 < time < math.inf:
                fail(f"{key} = {time!r}: expected a positive finite number")
            pairs.append((int(key), float(time)))
        return tuple(sorted(pairs))
    raise AssertionError(f"unhandled tuning type {hint!r}")  # a bug in this module, not in the descriptor


def _power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def check_tuning(t, path) -> None:
    """The tuning values that are impossible on the chip of Target ``t`` (or for the kernels at all): one
    DescriptorError naming the field."""
    def fail(field: str, reason: str):
        raise DescriptorError(path, f"tuning.{field}", reason)

    qg = t.tuning.quant_gemm
    for key in ("staged_nt", "wgmma_nt"):
        for nt in getattr(qg, key):
            if nt not in _QUANT_GEMM_NT:
                fail(f"quant_gemm.{key}", f"{nt} is not a kernel's groups of 8 tokens (1 to {_QUANT_GEMM_NT[-1]})")
    for nt in qg.prequantised_nt:
        if nt not in _QUANT_GEMM_NT[1:]:  # one group: nt1q / m1q, which quantise as they load
            fail("quant_gemm.prequantised_nt", f"{nt} is not 2 to {_QUANT_GEMM_NT[-1]} groups of 8 tokens")
    for name in qg.ring_types:
        if name not in _RING_TYPES:
            fail("quant_gemm.ring_types", f"{name!r} is not one of {', '.join(_RING_TYPES)}")
    if not 2 <= qg.ring_stages <= 8:
        fail("quant_gemm.ring_stages", f"{qg.ring_stages} is not 2 to 8 slots (one computing, one filling, ...)")
    if not 2 <= qg.wgmma_stages <= 4:
        fail("quant_gemm.wgmma_stages", f"{qg.wgmma_stages} is not 2 to 4 rounds")
    if qg.wgmma_buffers not in (1, 2):
        fail("quant_gemm.wgmma_buffers", f"{qg.wgmma_buffers} is not 1 or 2")
    rows = 8 * _QUANT_GEMM_NT[-1]
    if qg.prequantised_rows % rows or qg.prequantised_rows > 4096:
        fail("quant_gemm.prequantised_rows", f"{qg.prequantised_rows} is not a multiple of {rows} (a row group) up "
             f"to 4096")
    for residency, _ in qg.int8_wave_time:
        if residency * _INT8_WARPS * t.warp_size > t.max_threads_per_cu:
            fail("quant_gemm.int8_wave_time", f"{residency} blocks of {_INT8_WARPS} warps exceed max_threads_per_cu "
                 f"{t.max_threads_per_cu}")

    tv = t.tuning.tree_verify
    if tv.rule_threads % t.warp_size or tv.rule_threads > t.max_threads_per_block:
        fail("tree_verify.rule_threads", f"{tv.rule_threads} is not a multiple of warp_size {t.warp_size} up to "
             f"max_threads_per_block {t.max_threads_per_block}")
    if tv.rule_round > 32:
        fail("tree_verify.rule_round", f"{tv.rule_round} is over 32 slots")
    if tv.attention_streams * t.warp_size > t.max_threads_per_block:
        fail("tree_verify.attention_streams", f"{tv.attention_streams} warps exceed max_threads_per_block "
             f"{t.max_threads_per_block}")
    if not _power_of_two(tv.attention_streams) or tv.attention_streams < _ATTENTION_PACK:
        fail("tree_verify.attention_streams", f"{tv.attention_streams} is not a power of two of at least "
             f"{_ATTENTION_PACK} (tree_attention_packed puts {_ATTENTION_PACK} on a warp)")
    if tv.mma_waves > 64:
        fail("tree_verify.mma_waves", f"{tv.mma_waves} is over 64 waves")


def tuning_table(tuning: Tuning) -> dict[str, dict[str, Any]]:
    """The resolved tuning as TOML-shaped tables (int8_wave_time as its { residency = time } table)."""
    out = {}
    for table in _TABLES:
        values = dataclasses.asdict(getattr(tuning, table))
        if table == "quant_gemm":
            values["int8_wave_time"] = {str(r): time for r, time in values["int8_wave_time"]}
        out[table] = values
    return out

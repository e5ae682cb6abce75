"""Chip descriptors: ``targets/<name>.toml`` → a validated, frozen :class:`Target`.

A descriptor holds published hardware facts about one chip (plus a few commented tuning choices; the kernel
families' measured tuning is its optional ``[tuning.<family>]`` tables, lucegen/tuning.py). Every field is
required (but the optional per-epilogue GEMM tables, ``[matmul.swiglu]`` / ``[matmul.rows_f32]``), every key must be known, every value must have the right type and be possible on that chip; anything else
is a :class:`DescriptorError` naming the file, the field and the reason. Derived values (``megakernel.blocks``,
the compute capability) are computed here, never written in the file.

The schema is the dataclasses below: a field's annotation is its TOML type, a nested dataclass is a TOML table.
Templates see a target only through :meth:`Target.template_params`.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import TARGETS_DIR, descriptor_paths
from .errors import DescriptorError
from .tuning import Tuning, check_tuning, parse_tuning

VENDORS = ("nvidia", "amd")
#: Element types a descriptor may list, with the C type a template uses for each and its size in bytes.
DTYPES = {"fp16": ("fp16_t", 2), "bf16": ("bf16_t", 2), "fp8": ("fp8_t", 1), "nvfp4": ("nvfp4_t", 0.5)}
#: Activation/compute types (what kernels keep activations in and accumulate around).
COMPUTE_DTYPES = ("bf16", "fp16")
#: Bytes per global-memory vector access (uint4 / 128-bit loads) on every supported chip.
VECTOR_BYTES = 16


@dataclass(frozen=True)
class Features:
    """What the hardware supports (a descriptor may leave a supported feature off, never claim a missing one)."""

    bf16: bool
    fp8: bool
    nvfp4: bool
    cp_async: bool
    tma: bool
    wgmma: bool
    cooperative_launch: bool
    programmatic_launch: bool  # programmatic dependent launch (griddepcontrol; CUDA 12, sm_90+)


@dataclass(frozen=True)
class Megakernel:
    """The persistent decode kernel's launch shape. ``blocks`` is derived: compute_units × blocks_per_cu."""

    blocks_per_cu: int
    threads: int
    blocks: int = dataclasses.field(default=0, metadata={"derived": True})


@dataclass(frozen=True)
class GemmTiling:
    """An epilogue's own GEMM instance (``[matmul.swiglu]``, ``[matmul.rows_f32]``): the [matmul] fields it replaces,
    all of them (the residual GEMM keeps [matmul]'s: its tile_n sets the RMSNorm partial sums' column parts)."""

    tile_m: int
    tile_n: int
    tile_k: int
    warps: int
    stages: int
    schedule: str


#: Epilogues that may run on their own GEMM instance (a [matmul.<epilogue>] table).
TILED_EPILOGUES = ("rows_f32", "swiglu")


@dataclass(frozen=True)
class Matmul:
    """Tiles, software-pipeline depth and matrix instruction of the prefill GEMMs (and flash attention).
    ``peak_tflops`` is the chip's published dense matrix throughput in compute_dtype (benchmarks report against it)."""

    tile_m: int
    tile_n: int
    tile_k: int
    warps: int
    stages: int
    instruction: str
    peak_tflops: float
    cluster_m: int  # thread-block cluster along M sharing each W tile by TMA multicast (1: no cluster)
    schedule: str  # how the consumer warpgroups share tiles (GEMM_SCHEDULES)
    rows_f32: GemmTiling | None = dataclasses.field(default=None, metadata={"optional": True})
    swiglu: GemmTiling | None = dataclasses.field(default=None, metadata={"optional": True})

    def tilings(self) -> dict[str, GemmTiling]:
        """The epilogues with their own GEMM instance, and its tiling."""
        return {ep: getattr(self, ep) for ep in TILED_EPILOGUES if getattr(self, ep) is not None}


#: How the TMA-fed wgmma GEMM's two consumer warpgroups share the output tiles: "cooperative" (both multiply one
#: tile_m = 128-row tile, then both run its epilogue) or "pingpong" (each owns its own tile_m = 64-row tile and the
#: two take turns at the tensor cores, so one's epilogue overlaps the other's mainloop).
GEMM_SCHEDULES = ("cooperative", "pingpong")

#: Matrix instructions a template can emit, with the oldest NVIDIA SM that has each (None: any chip).
MATRIX_INSTRUCTIONS = {"mma_m16n8k16": 80, "mma_m16n8k8": 75, "wgmma_m64nNk16": 90, "simt": None}


@dataclass(frozen=True)
class Prefill:
    """Prefill kernels: DeltaNet chunk length, flash-attention tiles, and the tokens one prefill segment holds."""

    deltanet_chunk: int
    attention_block_q: int
    attention_block_kv: int
    max_tokens: int


@dataclass(frozen=True)
class DDTree:
    """Speculative-decoding tree budget (nodes verified per step), and the key count from which the verify's attention
    takes a slot on tensor cores (``tensor_core_attention_keys``; absent: never, the FMA body for every slot;
    lucegen/families/tree_verify.py attention_tiling says where the tensor-core body exists at all)."""

    budget: int
    tensor_core_attention_keys: int = dataclasses.field(default=0, metadata={"optional": True})


@dataclass(frozen=True)
class Quant:
    """The quantised GGUF target (DFlash / DDTree, lucegen/runtime/quant_target.py): ``compute_dtype`` is its
    activation type, which may differ from the descriptor's (the megakernel's). In fp16 the K-quants' GEMM fragments
    carry the sub-block scales (templates/kernels/quant_gemm.cu.j2, QG_FOLD). ``int8_activations``: the matrix groups
    of K-quant blocks alone (Q4_K, Q5_K, Q6_K) take their activations quantised to int8 per 256 values (as GGML's
    Q8_K) and multiply on the integer tensor cores (mma m16n8k32 s8: sm_80+, fp16 activations quantised as they
    load)."""

    compute_dtype: str
    int8_activations: bool = dataclasses.field(default=False, metadata={"optional": True})


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    vendor: str
    arch: str
    compute_units: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_cu: int
    smem_per_block: int
    smem_per_block_optin: int
    smem_per_cu: int
    regs_per_cu: int
    regs_per_thread_max: int
    mem_bandwidth_gbs: float
    l2_bytes: int
    memory_bytes: int  # device memory the GPU can allocate (unified-memory chips: its share)
    compute_dtype: str
    dtypes: tuple[str, ...]
    kv_cache_type: str
    features: Features
    megakernel: Megakernel
    matmul: Matmul
    prefill: Prefill
    ddtree: DDTree
    quant: Quant | None = dataclasses.field(default=None, metadata={"optional": True})
    #: AMD: SIMDs per CU, which share the CU's registers (clang budgets VGPRs per SIMD: waves per EU); required there
    simds_per_cu: int = dataclasses.field(default=0, metadata={"optional": True})
    #: the [tuning.<family>] tables, every key the file leaves out from lucegen/tuning.py DEFAULTS (parse_tuning)
    tuning: Tuning = dataclasses.field(default=None, metadata={"optional": True})
    path: str = dataclasses.field(default="", metadata={"derived": True})
    #: "" for the descriptor as written; "quant" for quantised_target()'s (its renders: generated/<name>/quant/)
    variant: str = dataclasses.field(default="", metadata={"derived": True})

    # ---- derived -------------------------------------------------------------------------------------------
    @property
    def is_nvidia(self) -> bool:
        return self.vendor == "nvidia"

    @property
    def is_amd(self) -> bool:
        return self.vendor == "amd"

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """(major, minor) for NVIDIA targets (sm_90 → (9, 0), sm_121 → (12, 1)); None for AMD."""
        return _sm_capability(self.arch) if self.is_nvidia else None

    @property
    def source_suffix(self) -> str:
        return ".cu" if self.is_nvidia else ".hip"

    @property
    def quant_compute_dtype(self) -> str:
        """The quantised target's activation type: [quant] compute_dtype, else compute_dtype."""
        return self.quant.compute_dtype if self.quant is not None else self.compute_dtype

    def quantised_target(self) -> "Target":
        """The descriptor the quantised target renders its kernels with: compute_dtype (and the float KV cache type,
        which prefill attention reads in the compute type) set to [quant] compute_dtype. Itself where they agree."""
        dtype = self.quant_compute_dtype
        if dtype == self.compute_dtype:
            return self
        return dataclasses.replace(self, compute_dtype=dtype, kv_cache_type=dtype, variant="quant")

    def template_params(self) -> dict[str, Any]:
        """Everything a template may know about the chip. Templates get nothing else from the target."""
        ctypes = {name: DTYPES[name][0] for name in self.dtypes}
        elem_bytes = {name: DTYPES[name][1] for name in self.dtypes}
        return {
            "target": self.name,
            "vendor": self.vendor,
            "arch": self.arch,
            "is_nvidia": self.is_nvidia,
            "is_amd": self.is_amd,
            "compute_units": self.compute_units,
            "warp_size": self.warp_size,
            "log2_warp_size": self.warp_size.bit_length() - 1,
            "max_threads_per_block": self.max_threads_per_block,
            "smem_per_block": self.smem_per_block,
            "smem_per_block_optin": self.smem_per_block_optin,
            "compute_dtype": self.compute_dtype,
            "compute_ctype": DTYPES[self.compute_dtype][0],
            "dtypes": list(self.dtypes),
            "ctypes": ctypes,
            "elem_bytes": elem_bytes,
            "vector_bytes": VECTOR_BYTES,
            # elements of a 2-byte type in one 16-byte vector access
            "vector_width": VECTOR_BYTES // 2,
            "features": dataclasses.asdict(self.features),
            "megakernel": dataclasses.asdict(self.megakernel),
            "matmul": dataclasses.asdict(self.matmul),
            "prefill": dataclasses.asdict(self.prefill),
            "ddtree_budget": self.ddtree.budget,
            "kv_cache_type": self.kv_cache_type,
            "kv_cache_ctype": DTYPES[self.kv_cache_type][0],  # a float type: validate() allows no other
        }

    def to_dict(self) -> dict[str, Any]:
        """The resolved descriptor including derived values (what ``lucegen show`` prints)."""
        out = dataclasses.asdict(self)
        out["dtypes"] = list(self.dtypes)
        return out


# ---- hardware capability rules ---------------------------------------------------------------------------------
# NVIDIA: minimum SM version (major*10+minor) for each feature; wgmma exists on sm_90 only (sm_90a instructions;
# Blackwell replaced it with tcgen05). AMD: none of the NVIDIA-only features; bf16 from gfx11 (RDNA3 WMMA) and
# CDNA2+; fp8 on RDNA4 (gfx12) and CDNA3 (gfx94x).
_NVIDIA_FEATURE_MIN_SM = {"bf16": 80, "fp8": 89, "nvfp4": 100, "cp_async": 80, "tma": 90, "cooperative_launch": 60,
                          "programmatic_launch": 90}
_NVIDIA_MIN_SM = 75


def _sm_capability(arch: str) -> tuple[int, int]:
    digits = arch[3:]
    return int(digits[:-1]), int(digits[-1])


def _sm_number(arch: str) -> int:
    major, minor = _sm_capability(arch)
    return major * 10 + minor


def _feature_possible(vendor: str, arch: str, feature: str) -> bool:
    if vendor == "nvidia":
        sm = _sm_number(arch)
        if feature == "wgmma":
            return sm == 90
        return sm >= _NVIDIA_FEATURE_MIN_SM[feature]
    family = arch[3:-2]  # gfx1100 → "11", gfx942 → "9"
    if feature == "bf16":
        return family in ("11", "12") or arch in ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")
    if feature == "fp8":
        return family == "12" or arch in ("gfx940", "gfx941", "gfx942", "gfx950")
    if feature == "cooperative_launch":
        return True
    return False  # nvfp4, cp_async, tma, wgmma


# ---- loading ---------------------------------------------------------------------------------------------------
def list_targets() -> list[str]:
    """Names of the packaged and the user's descriptors (lucegen/descriptor_paths.py), sorted (NVIDIA by SM number,
    then the rest by name)."""
    names = list(descriptor_paths.descriptors())

    def order(name: str):
        m = re.fullmatch(r"sm_(\d+)", name)
        return (0, int(m.group(1)), name) if m else (1, 0, name)

    return sorted(names, key=order)


def resolve_path(name_or_path: str | Path) -> Path:
    """A path as given (it ends in .toml or holds a separator), else the file that descriptor name is found in (a
    name found nowhere: where the package would hold it, for the error to name)."""
    text = str(name_or_path)
    if text.endswith(".toml") or "/" in text or "\\" in text:
        return Path(text)
    found = descriptor_paths.descriptors().get(text)
    return found.path if found else TARGETS_DIR / f"{text}.toml"


def load_target(name_or_path: str | Path) -> Target:
    """Load and validate a descriptor by name (``sm_90``) or path (``targets/sm_90.toml``)."""
    path = resolve_path(name_or_path)
    if not path.is_file():
        known = ", ".join(list_targets())
        where = ", ".join(str(d) for d, _ in descriptor_paths.search_dirs())
        raise DescriptorError(path, "<file>", f"no such descriptor (known targets: {known}; searched {where})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise DescriptorError(path, "<toml>", f"not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DescriptorError(path, "<file>", f"not UTF-8 text: {exc}") from None
    return target_from_dict(data, path)


def target_from_dict(data: dict[str, Any], path: str | Path = "<descriptor>") -> Target:
    """Validate a parsed descriptor (the TOML as a dict) and build the Target."""
    data = dict(data)
    tuning = parse_tuning(data.pop("tuning", None), path)
    fields = _parse_table(Target, data, path, prefix="")
    target = Target(**fields, tuning=tuning, path=str(path))
    _check_consistency(target, path)
    check_tuning(target, path)
    mk = target.megakernel
    return dataclasses.replace(
        target, megakernel=dataclasses.replace(mk, blocks=target.compute_units * mk.blocks_per_cu)
    )


def _parse_table(cls, data: Any, path, prefix: str) -> dict[str, Any]:
    where = prefix.rstrip(".") or "<top level>"
    if not isinstance(data, dict):
        raise DescriptorError(path, where, f"expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    schema = [f for f in dataclasses.fields(cls) if not f.metadata.get("derived")]
    known = {f.name for f in schema}
    for key in data:
        if key not in known:
            derived = [f.name for f in dataclasses.fields(cls) if f.metadata.get("derived")]
            reason = "is derived, not set in the file" if key in derived else f"unknown key (known: {', '.join(sorted(known))})"
            raise DescriptorError(path, prefix + key, reason)
    out: dict[str, Any] = {}
    for f in schema:
        name = prefix + f.name
        if f.name not in data:
            if f.metadata.get("optional"):
                continue
            raise DescriptorError(path, name, "missing")
        out[f.name] = _parse_value(hints[f.name], data[f.name], path, name)
    return out


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}.get(
        type(value), type(value).__name__
    )


def _parse_value(hint, value: Any, path, name: str) -> Any:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # an optional table: X | None
        (hint,) = [h for h in typing.get_args(hint) if h is not type(None)]
    if dataclasses.is_dataclass(hint):
        return hint(**_parse_table(hint, value, path, prefix=name + "."))
    if hint is bool:
        if not isinstance(value, bool):
            raise DescriptorError(path, name, f"expected a boolean, got {_type_name(value)} {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise DescriptorError(path, name, f"expected an integer, got {_type_name(value)} {value!r}")
        if value <= 0:
            raise DescriptorError(path, name, f"must be positive, got {value}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DescriptorError(path, name, f"expected a number, got {_type_name(value)} {value!r}")
        if not value > 0 or value != value or value == float("inf"):
            raise DescriptorError(path, name, f"must be a positive finite number, got {value}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise DescriptorError(path, name, f"expected a string, got {_type_name(value)} {value!r}")
        return value
    if typing.get_origin(hint) is tuple:  # tuple[str, ...]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DescriptorError(path, name, f"expected an array of strings, got {value!r}")
        if not value:
            raise DescriptorError(path, name, "must not be empty")
        if len(set(value)) != len(value):
            raise DescriptorError(path, name, f"lists a dtype twice: {value!r}")
        return tuple(value)
    raise AssertionError(f"unhandled schema type {hint!r}")  # a bug in this module, not in the descriptor


def _amd_wave_size(arch: str) -> int:
    """Lanes per wavefront the AMD back end builds for ``arch``: CDNA/GCN (gfx9) has wave64 only; RDNA (gfx10-12)
    has both, and lucegen compiles it as wave32 (the RDNA compute default; WMMA is wave32 there)."""
    return 64 if arch[3:-2] == "9" else 32


#: Physical ranges of a descriptor's chip-wide figures: the published NVIDIA (Turing .. Blackwell) and AMD (GCN ..
#: CDNA4, RDNA1 .. RDNA4) families with a margin either side. Values outside describe no chip (a typo, a unit
#: slip: bytes for KB, TB/s for GB/s). ``field: (low, high, why)``; both ends inclusive.
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PHYSICAL_RANGES = {
    "compute_units": (1, 1024, "SMs / CUs per chip (the largest published: 304 on MI300X)"),
    "max_threads_per_block": (32, 1024, "threads per block (1024 on every NVIDIA and AMD chip)"),
    "max_threads_per_cu": (32, 4096, "resident threads per SM / CU (2048 on H100, 2560 on CDNA)"),
    "smem_per_block": (16 * KiB, 512 * KiB, "bytes of shared memory per block"),
    "smem_per_block_optin": (16 * KiB, 512 * KiB, "bytes of shared memory per block with the opt-in"),
    "smem_per_cu": (16 * KiB, 512 * KiB, "bytes of shared memory (LDS) per SM / CU (228 KB on H100, 160 KB on "
                                         "CDNA4)"),
    "regs_per_cu": (8192, 1 << 19, "32-bit registers per SM / CU (65536 on NVIDIA; 131072 VGPRs on CDNA)"),
    "regs_per_thread_max": (32, 512, "registers per thread (255 on NVIDIA, 256 VGPRs on RDNA, 512 on CDNA)"),
    "mem_bandwidth_gbs": (10.0, 20_000.0, "GB/s of device memory (8000 on B200 and MI355X)"),
    "l2_bytes": (128 * KiB, 1 * GiB, "bytes of L2 (128 MB on B200)"),
    "memory_bytes": (256 * MiB, 2048 * GiB, "bytes of device memory (288 GB on MI355X; unified-memory chips: "
                                             "their share)"),
    "matmul.peak_tflops": (0.1, 20_000.0, "dense matrix TFLOPS in compute_dtype (2250 on B200)"),
    "prefill.max_tokens": (16, 1 << 20, "prompt tokens per prefill segment (its workspace grows with it)"),
    "simds_per_cu": (0, 8, "SIMDs per CU (2 on RDNA, 4 on CDNA; 0: not an AMD descriptor)"),
}
#: Upper end of the per-thread register file on NVIDIA chips (the ISA encodes 255 general registers).
NVIDIA_MAX_REGS_PER_THREAD = 255
#: tree_attention_mma's largest K/V tile (lucegen/families/tree_verify.py attention_tiling halves it down to 16).
TREE_ATTENTION_TILE = 64


def _check_physical_ranges(t: Target, fail) -> None:
    """Every chip-wide figure within :data:`PHYSICAL_RANGES`, and the tiles dividing what they tile."""
    for field, (low, high, what) in PHYSICAL_RANGES.items():
        value = t
        for part in field.split("."):
            value = getattr(value, part)
        if not low <= value <= high:
            fail(field, f"{value:g} is outside [{low:g}, {high:g}], the range of {what}")
    if t.is_nvidia and t.regs_per_thread_max > NVIDIA_MAX_REGS_PER_THREAD:
        fail("regs_per_thread_max", f"NVIDIA threads address at most {NVIDIA_MAX_REGS_PER_THREAD} registers, "
             f"got {t.regs_per_thread_max}")
    if t.l2_bytes > t.memory_bytes:
        fail("l2_bytes", f"{t.l2_bytes} exceeds memory_bytes {t.memory_bytes}")
    pf = t.prefill
    for name in ("deltanet_chunk", "attention_block_q"):
        if pf.max_tokens % getattr(pf, name):
            fail("prefill.max_tokens", f"{pf.max_tokens} is not a multiple of prefill.{name} {getattr(pf, name)} "
                 f"(a full segment is whole tiles)")
    keys = t.ddtree.tensor_core_attention_keys
    if keys and (keys < TREE_ATTENTION_TILE or keys & (keys - 1) or keys > PHYSICAL_RANGES["prefill.max_tokens"][1]):
        fail("ddtree.tensor_core_attention_keys", f"{keys} is not a power of two from {TREE_ATTENTION_TILE} (a "
             f"power-of-two multiple of the tensor-core attention's K/V tile) to "
             f"{PHYSICAL_RANGES['prefill.max_tokens'][1]}")


def _check_tiling(t: Target, table: str, tiling, fail) -> None:
    """The checks every GEMM instance's tiling (``[matmul]`` or ``[matmul.<epilogue>]``) must pass."""
    mm = t.matmul
    for tile in ("tile_m", "tile_n", "tile_k"):
        if getattr(tiling, tile) % 16:
            fail(f"{table}.{tile}", f"{getattr(tiling, tile)} is not a multiple of 16 (the MMA fragment size)")
    if tiling.warps * t.warp_size > t.max_threads_per_block:
        fail(f"{table}.warps", f"{tiling.warps} warps × {t.warp_size} exceed max_threads_per_block "
             f"{t.max_threads_per_block}")
    if tiling.tile_n % (8 * mm.cluster_m):
        fail("matmul.cluster_m", f"tile_n {tiling.tile_n} does not split into {mm.cluster_m} multicast parts of "
             f"8-row multiples")
    if tiling.schedule not in GEMM_SCHEDULES:
        fail(f"{table}.schedule", f"{tiling.schedule!r} is not one of {', '.join(GEMM_SCHEDULES)}")
    if tiling.schedule == "pingpong":
        if not (mm.instruction.startswith("wgmma") and t.features.tma):
            fail(f"{table}.schedule", "pingpong needs the TMA-fed wgmma mainloop (a wgmma instruction and "
                 "features.tma)")
        if tiling.warps != 8 or tiling.tile_m != 64:
            fail(f"{table}.schedule", f"pingpong runs two warpgroups (warps = 8) on tiles of one warpgroup's 64 "
                 f"rows (tile_m = 64), got warps {tiling.warps}, tile_m {tiling.tile_m}")
        if mm.cluster_m != 1:
            fail(f"{table}.schedule", f"pingpong has no cluster variant (cluster_m must be 1, got {mm.cluster_m})")
    smem = tiling.stages * (tiling.tile_m + tiling.tile_n) * tiling.tile_k * DTYPES[t.compute_dtype][1]
    if smem > t.smem_per_block_optin:
        fail(f"{table}.stages", f"{tiling.stages} stages of {tiling.tile_m}x{tiling.tile_k} + "
             f"{tiling.tile_n}x{tiling.tile_k} tiles need {smem} bytes of shared memory, over smem_per_block_optin "
             f"{t.smem_per_block_optin}")


def _check_consistency(t: Target, path) -> None:
    def fail(field: str, reason: str):
        raise DescriptorError(path, field, reason)

    if not re.fullmatch(r"[A-Za-z0-9_.-]+", t.name):
        fail("name", f"{t.name!r} must be letters, digits, '_', '-' or '.'")
    file_stem = Path(str(path)).stem
    if str(path).endswith(".toml") and file_stem != t.name:
        fail("name", f"{t.name!r} differs from the file name {file_stem!r}")
    if t.vendor not in VENDORS:
        fail("vendor", f"{t.vendor!r} is not one of {', '.join(VENDORS)}")
    if t.vendor == "nvidia":
        if not re.fullmatch(r"sm_\d{2,3}", t.arch):
            fail("arch", f"{t.arch!r} is not an NVIDIA arch like sm_90")
        if _sm_number(t.arch) < _NVIDIA_MIN_SM:
            fail("arch", f"{t.arch} is older than sm_{_NVIDIA_MIN_SM}, the oldest arch NVRTC 13 compiles for")
        if t.warp_size != 32:
            fail("warp_size", f"NVIDIA warps are 32 threads, got {t.warp_size}")
    else:
        if not re.fullmatch(r"gfx[0-9]{2,4}[0-9a-f]?", t.arch):
            fail("arch", f"{t.arch!r} is not an AMD arch like gfx1100")
        if t.warp_size not in (32, 64):
            fail("warp_size", f"AMD wavefronts are 32 or 64 threads, got {t.warp_size}")
        if t.warp_size != _amd_wave_size(t.arch):
            fail("warp_size", f"{t.arch} runs {_amd_wave_size(t.arch)}-lane wavefronts in lucegen's builds "
                 f"(gfx9 has wave64 only; gfx10-12 compile as wave32, no -mwavefrontsize64), got {t.warp_size}")
        if t.simds_per_cu < 1 or t.max_threads_per_cu % (t.simds_per_cu * t.warp_size):
            fail("simds_per_cu", f"an AMD descriptor states its SIMDs per CU (a divisor of max_threads_per_cu / "
                 f"warp_size), got {t.simds_per_cu}")
    _check_physical_ranges(t, fail)
    if t.max_threads_per_block % t.warp_size:
        fail("max_threads_per_block", f"{t.max_threads_per_block} is not a multiple of warp_size {t.warp_size}")
    if t.max_threads_per_block > t.max_threads_per_cu:
        fail("max_threads_per_block", f"{t.max_threads_per_block} exceeds max_threads_per_cu {t.max_threads_per_cu}")
    if t.smem_per_block > t.smem_per_block_optin:
        fail("smem_per_block", f"{t.smem_per_block} exceeds smem_per_block_optin {t.smem_per_block_optin}")
    if t.smem_per_block_optin > t.smem_per_cu:
        fail("smem_per_block_optin", f"{t.smem_per_block_optin} exceeds smem_per_cu {t.smem_per_cu}")
    if t.regs_per_thread_max * t.warp_size > t.regs_per_cu:
        fail("regs_per_thread_max", f"{t.regs_per_thread_max} × warp_size exceeds regs_per_cu {t.regs_per_cu}")

    for feature in dataclasses.fields(Features):
        if getattr(t.features, feature.name) and not _feature_possible(t.vendor, t.arch, feature.name):
            fail(f"features.{feature.name}", f"{t.arch} does not support {feature.name}")
    for dtype in t.dtypes:
        if dtype not in DTYPES:
            fail("dtypes", f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        if dtype != "fp16" and not getattr(t.features, dtype):
            fail("dtypes", f"{dtype} listed but features.{dtype} is false ({t.arch} cannot compute in it)")
    if t.compute_dtype not in COMPUTE_DTYPES:
        fail("compute_dtype", f"{t.compute_dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}")
    if t.compute_dtype not in t.dtypes:
        fail("compute_dtype", f"{t.compute_dtype} is not in dtypes {list(t.dtypes)}")
    # the megakernel's cache and every target's default; the quantised formats are a load-time choice of the
    # quantised GGUF target (QuantDecoder(kv_cache=...), `--kv-cache`)
    if t.kv_cache_type not in COMPUTE_DTYPES:
        fail("kv_cache_type", f"{t.kv_cache_type!r} is not one of {', '.join(COMPUTE_DTYPES)} (q8_0 / q4_0 are "
                              "chosen at load: --kv-cache)")
    if t.kv_cache_type not in t.dtypes:
        fail("kv_cache_type", f"{t.kv_cache_type!r} is not in dtypes {list(t.dtypes)}")
    if t.quant is not None:
        if t.quant.compute_dtype not in COMPUTE_DTYPES:
            fail("quant.compute_dtype", f"{t.quant.compute_dtype!r} is not one of {', '.join(COMPUTE_DTYPES)}")
        if t.quant.compute_dtype not in t.dtypes:
            fail("quant.compute_dtype", f"{t.quant.compute_dtype} is not in dtypes {list(t.dtypes)}")
        if t.quant.int8_activations:
            sm = _sm_capability(t.arch) if t.vendor == "nvidia" else None
            if sm is None or sm < (8, 0):
                fail("quant.int8_activations", f"needs the integer tensor cores' mma m16n8k32 s8 (NVIDIA sm_80+), "
                                               f"not {t.arch}")
            if t.quant_compute_dtype != "fp16":
                fail("quant.int8_activations", f"quantises fp16 activations as they load; [quant] compute_dtype is "
                                               f"{t.quant_compute_dtype}")

    mk = t.megakernel
    if mk.threads % t.warp_size:
        fail("megakernel.threads", f"{mk.threads} is not a multiple of warp_size {t.warp_size}")
    if mk.threads > t.max_threads_per_block:
        fail("megakernel.threads", f"{mk.threads} exceeds max_threads_per_block {t.max_threads_per_block}")
    if mk.threads * mk.blocks_per_cu > t.max_threads_per_cu:
        fail("megakernel.blocks_per_cu", f"{mk.blocks_per_cu} blocks × {mk.threads} threads exceed "
             f"max_threads_per_cu {t.max_threads_per_cu}")

    mm = t.matmul
    if mm.instruction not in MATRIX_INSTRUCTIONS:
        fail("matmul.instruction", f"{mm.instruction!r} is not one of {', '.join(MATRIX_INSTRUCTIONS)}")
    min_sm = MATRIX_INSTRUCTIONS[mm.instruction]
    if min_sm is not None and (t.vendor != "nvidia" or _sm_number(t.arch) < min_sm):
        fail("matmul.instruction", f"{mm.instruction} needs an NVIDIA chip of sm_{min_sm} or newer, not {t.arch}")
    if mm.instruction.startswith("wgmma") and t.arch != "sm_90":
        fail("matmul.instruction", f"{mm.instruction} (warpgroup MMA, sm_90a) exists on sm_90 only, not {t.arch}")
    if mm.instruction == "mma_m16n8k8" and t.compute_dtype != "fp16":
        fail("matmul.instruction", "mma_m16n8k8 is used for fp16 only (bf16 needs mma_m16n8k16)")
    if mm.cluster_m not in (1, 2):
        fail("matmul.cluster_m", f"{mm.cluster_m} is not 1 or 2")
    if mm.cluster_m > 1 and not mm.instruction.startswith("wgmma"):  # (used when features.tma is on)
        fail("matmul.cluster_m", f"{mm.cluster_m} needs the TMA-fed wgmma mainloop (a wgmma instruction); use 1")
    _check_tiling(t, "matmul", mm, fail)
    for ep, tiling in mm.tilings().items():
        _check_tiling(t, f"matmul.{ep}", tiling, fail)
    pf = t.prefill
    if pf.deltanet_chunk not in (16, 32, 64):
        fail("prefill.deltanet_chunk", f"{pf.deltanet_chunk} is not 16, 32 or 64")
    for name in ("attention_block_q", "attention_block_kv"):
        if getattr(pf, name) % 16:
            fail(f"prefill.{name}", f"{getattr(pf, name)} is not a multiple of 16 (the MMA fragment size)")


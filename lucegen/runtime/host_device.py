"""A host-only stand-in for :class:`lucegen.runtime.device.Device`: the runtime's host code runs on a CPU (CI's
dry runs, ``lucegen plan``) exactly as it would on the chip of a descriptor, allocating from a ledger.

Modules are compiled as for a GPU (NVRTC runs without one) but nothing is loaded or run. Every launch is checked
against the kernel it names, which is where the host side of a kernel's contract can break unseen on a CPU:

- the argument list: bound to the kernel's declaration in its family (lucegen.kernel_signature; every parameter
  named once, each of its kind), which must agree with the kernel's C declaration in the source and, on NVIDIA
  targets, with the cubin's parameter table (count and byte sizes) when the function is looked up; then as many
  arguments as the kernel declares, each of the kind its C declaration says (an address, an ``int``, a ``float``,
  a 64-bit integer, a struct passed by value) and of the byte size the cubin's parameter table records;
- every address argument: null or inside a live allocation (nothing freed, nothing never allocated);
- the launch shape: threads per block within the target's limit, dynamic shared memory within what the function
  was given (``set_max_dynamic_smem`` past the 48 KB default) and the target's opt-in limit, a programmatic launch
  only where the descriptor claims one.

Uploads, memsets, copies and tensor maps are bounds-checked against the allocations too. Downloads read zeros, or
what ``device.reply(buffer, dtype, shape)`` returns when a test sets it. Timings are not measured (every event pair
reads 1 ms). ``memory_info`` reports the descriptor's memory less the ledger and ``driver_bytes`` (what a real
driver would hold: context, modules, graphs). On AMD targets the sizes come from the declarations alone (a struct
passed by value is checked for its kind, not its size).
"""

from __future__ import annotations

import re
import threading

import numpy as np

from ..compile.elf import cubin_parameters
from ..errors import DeviceError
from ..kernel_signature import KernelSignature, source_parameters
from .device import (Buffer, ByValue, TensorMap, check_tensor_map_2d, declared_signature, launch_arguments,
                     upload_pair)

DEFAULT_DYNAMIC_SMEM = 48 * 1024
DECLARED_BYTES = {"address": 8, "int32": 4, "float": 4, "int64": 8, "struct": None}
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__grid_constant__)\b")


def kernel_kinds(source: str) -> dict[str, tuple[str, ...]]:
    """{kernel: the kind of each parameter} from the ``extern "C" __global__`` declarations of a CUDA source."""
    out = {}
    for name, params in source_parameters(source).items():
        kinds = []
        for param in params:
            words = _QUALIFIERS.sub(" ", param).split()[:-1]  # drop the parameter's name
            decl = " ".join(words)
            if "*" in param:
                kinds.append("address")
            elif decl == "float":
                kinds.append("float")
            elif decl in ("int", "unsigned", "unsigned int", "int32_t", "uint32_t"):
                kinds.append("int32")
            elif decl in ("unsigned long long", "long long", "size_t", "uint64_t", "int64_t"):
                kinds.append("int64")
            else:
                kinds.append("struct")
        out[name] = tuple(kinds)
    return out


def declared_kinds(signature: KernelSignature) -> tuple[tuple[str, int | None], ...]:
    """(kind as kernel_kinds names it, bytes) of each parameter of a declaration."""
    out = []
    for p in signature.params:
        if p.kind == "scalar":
            dtype = np.dtype(p.dtype)
            kind = "float" if dtype.kind == "f" else "int32" if dtype.itemsize == 4 else "int64"
        else:
            kind = "address" if p.kind == "pointer" else "struct"
        out.append((kind, p.size))
    return tuple(out)


def argument_kind(arg) -> tuple[str, int]:
    """(kind, bytes) of one launch argument as lucegen.runtime.device.pack_args passes it."""
    if isinstance(arg, Buffer):
        return "address", 8
    if isinstance(arg, ByValue):
        return "struct", len(arg.raw)
    if isinstance(arg, np.generic):
        if arg.dtype == np.float32:
            return "float", 4
        if arg.dtype in (np.int32, np.uint32):
            return "int32", 4
        if arg.dtype == np.uint64:
            return "address|int64", 8
        if arg.dtype == np.int64:
            return "int64", 8
    raise DeviceError(f"a launch argument of type {type(arg).__name__} ({arg!r}) is not one pack_args passes")


class HostBuffer(Buffer):
    def free(self) -> None:
        if self.ptr:
            self._device.release(self)
            self.ptr = 0


class HostPinnedArray:
    """Device.pinned's stand-in: a numpy array of ordinary memory, counted live until freed."""

    def __init__(self, array: np.ndarray, release):
        self.array, self.ptr, self._release = array, 1, release

    def free(self) -> None:
        if self.ptr:
            self._release()
            self.ptr, self.array = 0, None


class HostFunction:
    def __init__(self, module: "HostModule", name: str):
        self.module, self.name = module, name
        self.sizes = module.parameters[name]
        self.kinds = module.kinds.get(name)
        if self.kinds is None or len(self.kinds) != len(self.sizes):
            raise DeviceError(f"{name}: its declaration in the module's source ({self.kinds}) does not match the "
                              f"compiled kernel's {len(self.sizes)} parameters")
        self.signature = declared_signature(module.compiled, name)
        if self.signature is not None:
            self._check_declaration()
        self.info = module.compiled.kernel(name)
        self.max_dynamic_smem = DEFAULT_DYNAMIC_SMEM
        self.programmatic = False  # as Function's: launches programmatic unless told otherwise

    def _check_declaration(self) -> None:
        """The family's declaration against the source's C declaration (kinds) and the compiled parameter table
        (count, sizes)."""
        declared = declared_kinds(self.signature)
        if len(declared) != len(self.sizes):
            raise DeviceError(f"{self.name}: its family declares {len(declared)} parameters, the compiled kernel has "
                              f"{len(self.sizes)}")
        for p, (kind, nbytes), source_kind, size in zip(self.signature.params, declared, self.kinds, self.sizes):
            if kind != source_kind or (size is not None and nbytes not in (None, size)):
                raise DeviceError(f"{self.name}: parameter {p.name} is declared {kind} of {nbytes} bytes; the source "
                                  f"declares {source_kind} and the compiled kernel takes {size} bytes")

    def launch(self, grid, block, args=(), *, smem: int = 0, stream=None, cooperative: bool = False,
               programmatic: bool | None = None, **arguments) -> None:
        args = launch_arguments(self, args, arguments)
        dev, target = self.module.device, self.module.device.target
        if programmatic is None:
            programmatic = self.programmatic
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        block = (block,) if isinstance(block, int) else tuple(block)
        where = f"launch of {self.name}"
        dev.check_current(where)
        if not all(isinstance(g, (int, np.integer)) and g >= 1 for g in grid + block):
            raise DeviceError(f"{where}: grid {grid} and block {block} need positive integers")
        if int(np.prod(block)) > target.max_threads_per_block:
            raise DeviceError(f"{where}: {int(np.prod(block))} threads exceed {target.max_threads_per_block}")
        if smem > self.max_dynamic_smem or self.info.shared_bytes + smem > target.smem_per_block_optin:
            raise DeviceError(f"{where}: {smem} B of dynamic shared memory (function limit {self.max_dynamic_smem}, "
                              f"{self.info.shared_bytes} B static)")
        if programmatic and (cooperative or not target.features.programmatic_launch):
            raise DeviceError(f"{where}: programmatic launch on {target.name}")
        if len(args) != len(self.sizes):
            raise DeviceError(f"{where}: {len(args)} arguments for {len(self.sizes)} parameters")
        for i, (arg, size) in enumerate(zip(args, self.sizes)):
            kind, nbytes = argument_kind(arg)
            declared = self.kinds[i]
            label = f"argument {self.signature.params[i].name}" if self.signature else f"argument {i}"
            if (size is not None and nbytes != size) or declared not in kind.split("|"):
                raise DeviceError(f"{where}: {label} is {kind} of {nbytes} bytes; the kernel's parameter is "
                                  f"{declared} of {size} bytes")
            if declared == "address":
                address = arg.ptr if isinstance(arg, Buffer) else int(arg)
                if address and dev.allocation(address) is None:
                    raise DeviceError(f"{where}: {label} ({address:#x}) is in no live allocation")
        dev.launches.append((self.name, grid, block, smem, self, tuple(args)))

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        if nbytes > self.module.device.target.smem_per_block_optin:
            raise DeviceError(f"{self.name}: {nbytes} bytes of dynamic shared memory exceed smem_per_block_optin")
        self.max_dynamic_smem = nbytes

    def max_active_blocks_per_cu(self, block_threads: int, smem: int = 0) -> int:
        """An estimate from the descriptor's limits and the compiled kernel's resources (no allocation granularity):
        what the occupancy query would answer on the chip."""
        t = self.module.device.target
        by_threads = t.max_threads_per_cu // block_threads
        by_regs = t.regs_per_cu // max(1, self.info.registers * block_threads)
        by_smem = t.smem_per_cu // max(1, self.info.shared_bytes + smem)
        return max(0, min(by_threads, by_regs, by_smem, 32))

    def max_active_clusters(self, cluster: int, block_threads: int, smem: int = 0) -> int:
        per_cu = self.max_active_blocks_per_cu(block_threads, smem)
        return per_cu * self.module.device.target.compute_units // cluster

    def attribute(self, name: str) -> int:
        return {"NUM_REGS": self.info.registers, "SHARED_SIZE_BYTES": self.info.shared_bytes}[name]


class HostModule:
    def __init__(self, device: "HostDevice", compiled):
        self.device, self.compiled = device, compiled
        self.kinds = kernel_kinds(compiled.source)
        if device.target.is_nvidia:
            self.parameters = cubin_parameters(compiled.binary)
        else:  # the declared sizes (None: a struct, whatever its size)
            self.parameters = {name: tuple(DECLARED_BYTES[k] for k in kinds) for name, kinds in self.kinds.items()}
        self._functions: dict[str, HostFunction] = {}

    def function(self, name: str, *, programmatic: bool = False) -> HostFunction:
        """As Module.function."""
        if name not in self.parameters:
            raise DeviceError(f"module {self.compiled.name}: no kernel {name!r}")
        fn = self._functions.setdefault(name, HostFunction(self, name))
        fn.programmatic |= programmatic and self.device.target.features.programmatic_launch
        return fn

    def unload(self) -> None:
        pass


class HostGraph:
    def launch(self, stream) -> None:
        pass

    def destroy(self) -> None:
        pass


class HostStream:
    handle = 0

    def synchronize(self) -> None:
        pass

    def begin_capture(self) -> None:
        pass

    def end_capture(self) -> HostGraph:
        return HostGraph()

    def destroy(self) -> None:
        pass


class HostEvent:
    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, end: "HostEvent") -> float:
        return 1.0

    def destroy(self) -> None:
        pass


class HostDevice:
    """Device's interface over a ledger of fake addresses; ``launches`` lists (kernel name, grid, block, smem,
    function, arguments) of every launch, graph captures included."""

    GAP = 1 << 16  # between allocations: an address past one's end lands in none

    def __init__(self, target, driver_bytes: int = 0):
        self.target, self.name, self.driver_bytes = target, f"host dry run ({target.name})", driver_bytes
        self.allocated = 0
        self.live: dict[int, int] = {}  # address -> bytes
        self.launches: list = []
        self.reply = None
        self.pinned_live = 0  # pinned arrays not yet freed
        self._next = 1 << 40
        # whether the context is current in a thread (thread-local, as a CUDA context's binding is): in the opening
        # thread and in those that called make_current; a launch or an allocation from another thread fails as the
        # driver's would
        self._thread = threading.local()
        self._thread.current = True

    def make_current(self) -> None:
        self._thread.current = True

    def check_current(self, what: str) -> None:
        if not getattr(self._thread, "current", False):
            raise DeviceError(f"{what}: CUDA_ERROR_INVALID_CONTEXT (no context is current in thread "
                              f"{threading.current_thread().name}; call the device's make_current() there first)")

    # ---- memory ------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> HostBuffer:
        self.check_current("cuMemAlloc")
        if nbytes <= 0:
            raise DeviceError(f"cannot allocate {nbytes} bytes")
        ptr = self._next
        self._next += -(-nbytes // 256) * 256 + self.GAP
        self.live[ptr] = nbytes
        self.allocated += nbytes
        return HostBuffer(ptr, nbytes, self)

    def release(self, buffer: Buffer) -> None:
        if self.live.pop(buffer.ptr, None) != buffer.nbytes:
            raise DeviceError(f"free of {buffer.ptr:#x}: not a live allocation of {buffer.nbytes} bytes")
        self.allocated -= buffer.nbytes

    def allocation(self, address: int) -> tuple[int, int] | None:
        """The live allocation (start, bytes) holding ``address``, or None."""
        for start, nbytes in self.live.items():
            if start <= address < start + nbytes:
                return start, nbytes
        return None

    def check_range(self, what: str, address: int, nbytes: int) -> None:
        if nbytes <= 0:
            return
        held = self.allocation(int(address))
        if held is None or int(address) + nbytes > held[0] + held[1]:
            raise DeviceError(f"{what}: {nbytes} bytes at {int(address):#x} are not inside one live allocation")

    def memory_info(self) -> tuple[int, int]:
        return self.target.memory_bytes - self.allocated - self.driver_bytes, self.target.memory_bytes

    def upload(self, array: np.ndarray, buffer: Buffer | None = None) -> Buffer:
        self.check_current("cuMemcpyHtoD")
        array, buffer = upload_pair(self, array, buffer)
        self.check_range("upload", buffer.ptr, array.nbytes)
        return buffer

    def upload_async(self, array: np.ndarray, buffer: Buffer, stream) -> None:
        self.check_current("cuMemcpyHtoDAsync")
        array, buffer = upload_pair(self, array, buffer)
        self.check_range("upload_async", buffer.ptr, array.nbytes)

    def pinned(self, count: int, dtype) -> HostPinnedArray:
        if count <= 0:
            raise DeviceError(f"cannot pin {count} elements")
        self.pinned_live += 1
        return HostPinnedArray(np.zeros(count, dtype), self._release_pinned)

    def _release_pinned(self) -> None:
        self.pinned_live -= 1

    def upload_pinned_async(self, host, buffer: Buffer, stream) -> None:
        self.check_current("cuMemcpyHtoDAsync")
        self.check_range("upload_pinned_async", buffer.ptr, host.array.nbytes)

    def download_pinned_async(self, buffer: Buffer, host, stream) -> None:
        """As :meth:`download`, into ``host`` (``reply`` answers, or zeros)."""
        host.array[:] = self.download(buffer, host.array.dtype, host.array.shape)

    def download(self, buffer: Buffer, dtype, shape) -> np.ndarray:
        self.check_current("cuMemcpyDtoH")
        out = np.zeros(shape, dtype=dtype)
        self.check_range("download", buffer.ptr, out.nbytes)
        if out.nbytes > buffer.nbytes:
            raise DeviceError(f"download of {out.nbytes} bytes from a {buffer.nbytes}-byte buffer")
        return out if self.reply is None else np.asarray(self.reply(buffer, dtype, shape), dtype=dtype)

    def memset(self, buffer: Buffer, byte: int = 0) -> None:
        self.check_current("cuMemsetD8")
        self.check_range("memset", buffer.ptr, buffer.nbytes)

    def memset_async(self, ptr: int, nbytes: int, stream=None, byte: int = 0) -> None:
        self.check_current("cuMemsetD8Async")
        self.check_range("memset_async", ptr, nbytes)

    def copy_async(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        self.check_current("cuMemcpyDtoDAsync")
        self.check_range("copy_async (destination)", dst, nbytes)
        self.check_range("copy_async (source)", src, nbytes)

    def tensor_map_2d(self, ptr: int, rows: int, cols: int, row_stride_bytes: int, box_rows: int, box_cols: int,
                      dtype: str = "bf16") -> TensorMap:
        if not self.target.features.tma:
            raise DeviceError(f"{self.target.name} has no TMA (features.tma = false): no tensor maps")
        check_tensor_map_2d(ptr, row_stride_bytes, box_rows, box_cols, dtype)
        self.check_range("tensor map", ptr, (rows - 1) * row_stride_bytes + 2 * cols)
        return TensorMap(bytes(TensorMap.SIZE))

    # ---- modules, streams ----------------------------------------------------------------------------------------
    def load(self, compiled) -> HostModule:
        self.check_current("cuModuleLoadData")
        if compiled.target != self.target.name or compiled.arch.rstrip("a") != self.target.arch:
            raise DeviceError(f"module {compiled.name} was compiled for {compiled.target} ({compiled.arch}); "
                              f"this device runs {self.target.name} ({self.target.arch})")
        return HostModule(self, compiled)

    def stream(self) -> HostStream:
        return HostStream()

    def event(self) -> HostEvent:
        return HostEvent()

    def synchronize(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "HostDevice":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""The GPU, through ``cuda.bindings.driver``: open it, load compiled modules, move data, launch, time, capture.

    dev = Device.open()                       # detects sm_XY + SM count, picks targets/sm_XY.toml
    mod = dev.load(codegen.build(dev.target, "small_kernels"))
    x = dev.upload(np.ones(1024, np.float32)); out = dev.alloc(4)
    mod.function("argmax_f32").launch(grid=1, block=256, x=x, n=1024, out=out)
    idx = dev.download(out, np.int32, (1,))

A kernel's launch names its arguments after the parameters its family declares (lucegen.kernel_signature; the
Function looks the declaration up when the module is loaded): a pointer takes a :class:`Buffer` or an
:func:`address`, a scalar a Python or numpy number (converted to the declared C type, refused out of its range), a
struct a :class:`ByValue` (a :class:`TensorMap`). A missing, unknown or wrongly-kinded argument is a DeviceError
naming the kernel and the parameter. A kernel no family declares (a probe's own source) takes ``args``, a tuple of
Buffers, ByValue structs and numpy scalars in the kernel's order. Every driver call is checked: a failure is a
DeviceError naming the call.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from typing import Iterable, Sequence

import numpy as np

from .. import codegen
from ..errors import DeviceError
from ..kernel_signature import KernelSignature, SignatureError, parameter_name, source_parameters
from ..target import Target, list_targets, load_target
from .device_facts import DeviceFacts, pick_target


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover - cuda-python is a dependency
        raise DeviceError(f"cuda-python is not installed: {exc}") from None
    return driver


def _check(call: str, result):
    """Unwrap a cuda.bindings result tuple (err, *values); raise DeviceError naming ``call`` on failure."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else name
        text = text.decode() if isinstance(text, bytes) else text
        raise DeviceError(f"{call} failed: {name} ({text})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _dim3(value: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(int(d) < 1 for d in dims):
        raise DeviceError(f"launch dimensions must be 1-3 positive integers, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


@dataclasses.dataclass
class Buffer:
    """Device memory. Free with :meth:`free` or use as a context manager."""

    ptr: int
    nbytes: int
    _device: "Device | None" = dataclasses.field(default=None, repr=False)

    def free(self) -> None:
        if self.ptr:
            _check("cuMemFree", _driver().cuMemFree(self.ptr))
            self.ptr = 0
            if self._device is not None:
                self._device.allocated -= self.nbytes

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __int__(self) -> int:
        return self.ptr


def upload_pair(device, array: np.ndarray, buffer: Buffer | None) -> tuple[np.ndarray, Buffer]:
    """What every device's upload copies: ``array`` made contiguous, and ``buffer`` (a new one of ``device`` if None)
    checked to hold it."""
    array = np.ascontiguousarray(array)
    buffer = buffer or device.alloc(max(array.nbytes, 1))
    if array.nbytes > buffer.nbytes:
        raise DeviceError(f"upload of {array.nbytes} bytes into a {buffer.nbytes}-byte buffer")
    return array, buffer


@dataclasses.dataclass
class PinnedArray:
    """Page-locked host memory as a numpy array (``array``, at host address ``ptr``): what the device copies to and
    from asynchronously (:meth:`Device.upload_pinned_async`, :meth:`Device.download_pinned_async`), inside a captured
    graph too, where a pageable array cannot be. Free with :meth:`free`."""

    array: np.ndarray
    ptr: int

    def free(self) -> None:
        if self.ptr:
            _check("cuMemFreeHost", _driver().cuMemFreeHost(self.ptr))
            self.ptr, self.array = 0, None


class Stream:
    def __init__(self, handle):
        self.handle = handle

    def synchronize(self) -> None:
        _check("cuStreamSynchronize", _driver().cuStreamSynchronize(self.handle))

    def begin_capture(self) -> None:
        """Start recording this stream's launches into a CUDA graph (see :meth:`end_capture`)."""
        driver = _driver()
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check("cuStreamBeginCapture", driver.cuStreamBeginCapture(self.handle, mode))

    def end_capture(self) -> "Graph":
        driver = _driver()
        graph = _check("cuStreamEndCapture", driver.cuStreamEndCapture(self.handle))
        executable = _check("cuGraphInstantiate", driver.cuGraphInstantiate(graph, 0))
        return Graph(graph, executable)

    def destroy(self) -> None:
        if self.handle is not None:
            _check("cuStreamDestroy", _driver().cuStreamDestroy(self.handle))
            self.handle = None


class Graph:
    """A captured, instantiated CUDA graph; :meth:`launch` replays it on a stream."""

    def __init__(self, graph, executable):
        self.graph, self.executable = graph, executable

    def launch(self, stream: Stream) -> None:
        _check("cuGraphLaunch", _driver().cuGraphLaunch(self.executable, stream.handle))

    def destroy(self) -> None:
        driver = _driver()
        if self.executable is not None:
            _check("cuGraphExecDestroy", driver.cuGraphExecDestroy(self.executable))
            _check("cuGraphDestroy", driver.cuGraphDestroy(self.graph))
            self.executable = self.graph = None


class Event:
    def __init__(self, handle):
        self.handle = handle

    def record(self, stream: Stream | None = None) -> None:
        _check("cuEventRecord", _driver().cuEventRecord(self.handle, stream.handle if stream else 0))

    def synchronize(self) -> None:
        _check("cuEventSynchronize", _driver().cuEventSynchronize(self.handle))

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to ``end`` (both recorded; waits for ``end``)."""
        end.synchronize()
        return float(_check("cuEventElapsedTime", _driver().cuEventElapsedTime(self.handle, end.handle)))

    def destroy(self) -> None:
        if self.handle is not None:
            _check("cuEventDestroy", _driver().cuEventDestroy(self.handle))
            self.handle = None


def address(addr: int) -> np.uint64:
    """A raw device address (a Buffer's ptr plus an offset) as a kernel argument."""
    return np.uint64(int(addr))


class ByValue:
    """A struct kernel argument: its bytes, passed by value (``__grid_constant__`` where the kernel indexes it)."""

    def __init__(self, raw: bytes):
        self.raw = bytes(raw)


class TensorMap(ByValue):
    """A CUtensorMap (128 opaque bytes) passed by value as a ``__grid_constant__`` kernel argument."""

    SIZE = 128

    def __init__(self, raw: bytes):
        if len(raw) != self.SIZE:
            raise DeviceError(f"a tensor map is {self.SIZE} bytes, got {len(raw)}")
        super().__init__(raw)


def check_tensor_map_2d(ptr: int, row_stride_bytes: int, box_rows: int, box_cols: int, dtype: str) -> None:
    """What :func:`tensor_map_2d` requires of its arguments (one clear error each)."""
    if dtype not in ("bf16", "fp16"):
        raise DeviceError(f"tensor_map_2d: dtype {dtype!r} is not one of ['bf16', 'fp16']")
    if box_cols * 2 != 128 or not 1 <= box_rows <= 256:
        raise DeviceError(f"tensor_map_2d: box {box_rows}x{box_cols} does not fit the 128-byte swizzle")
    if int(ptr) % 16 or row_stride_bytes % 16:
        raise DeviceError(f"tensor_map_2d: address {int(ptr):#x} and row stride {row_stride_bytes} must be "
                          f"multiples of 16 bytes")


def tensor_map_2d(ptr: int, rows: int, cols: int, row_stride_bytes: int, box_rows: int, box_cols: int,
                  dtype: str = "bf16") -> TensorMap:
    """The TMA descriptor of a row-major [rows][cols] matrix of 2-byte elements at ``ptr`` (rows ``row_stride_bytes``
    apart), loaded as [box_rows][box_cols] boxes with the 128-byte swizzle (box_cols * 2 must be 128); elements
    outside the matrix load as zeros."""
    check_tensor_map_2d(ptr, row_stride_bytes, box_rows, box_cols, dtype)
    driver = _driver()
    kinds = {"bf16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             "fp16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16}
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    err, tmap = driver.cuTensorMapEncodeTiled(
        kinds[dtype], 2, int(ptr), [u64(cols), u64(rows)], [u64(row_stride_bytes)], [u32(box_cols), u32(box_rows)],
        [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    _check(f"cuTensorMapEncodeTiled({rows}x{cols}, box {box_rows}x{box_cols})", (err,))
    return TensorMap(np.array([int(v) for v in tmap.opaque], dtype=np.uint64).tobytes())


def pack_args(args: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """Lay kernel arguments out for cuLaunchKernel: (storage, array of pointers into it). Keep both alive.
    Scalars and addresses take 8-byte slots; a struct (ByValue, TensorMap) its bytes (64-byte aligned)."""
    values = []
    for i, arg in enumerate(args):
        if isinstance(arg, Buffer):
            values.append(np.uint64(arg.ptr).tobytes())
        elif isinstance(arg, np.generic) and arg.dtype.kind in "iufb":
            values.append(arg.tobytes())
        elif isinstance(arg, ByValue):
            values.append(arg.raw)
        else:
            raise DeviceError(f"kernel argument {i}: expected a Buffer, a ByValue struct or a numpy scalar "
                              f"(np.int32(...), np.float32(...)), got {type(arg).__name__} {arg!r}")
    offsets, end = [], 0
    for blob in values:
        align = 64 if len(blob) > 8 else 8
        end = -(-end // align) * align
        offsets.append(end)
        end += max(8, len(blob))
    storage = np.zeros(max(8, end) + 64, dtype=np.uint8)
    shift = (-storage.ctypes.data) % 64  # the host copy itself 64-byte aligned, like the parameter it fills
    for off, blob in zip(offsets, values):
        storage[shift + off : shift + off + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    base = storage.ctypes.data + shift
    pointers = np.array([base + off for off in offsets], dtype=np.uint64)
    return storage, pointers


@functools.lru_cache(maxsize=None)
def _binding(signature: KernelSignature) -> tuple:
    """Per parameter of a declaration, what binding an argument checks: (parameter, kind: pointer, struct, float or
    int, numpy scalar type, least and greatest value of an int)."""
    plan = []
    for p in signature.params:
        if p.kind != "scalar":
            plan.append((p, p.kind, None, None, None))
        elif np.dtype(p.dtype).kind == "f":
            plan.append((p, "float", p.dtype, None, None))
        else:
            info = np.iinfo(p.dtype)
            plan.append((p, "int", p.dtype, int(info.min), int(info.max)))
    return tuple(plan)


def bind_arguments(kernel: str, signature: KernelSignature, values: dict) -> tuple:
    """The arguments of a launch of ``kernel``, named in ``values``, in the order of its declared parameters: a
    pointer's Buffer or address, a scalar converted to its declared type's numpy scalar, a struct's ByValue. A
    DeviceError names the kernel and the parameter of a missing, unknown or wrongly-kinded argument."""
    plan = _binding(signature)
    if len(values) != len(plan) or any(p.name not in values for p, *_ in plan):
        names = [p.name for p, *_ in plan]
        missing, unknown = [n for n in names if n not in values], [n for n in values if n not in names]
        raise DeviceError(f"launch of {kernel}: " + "; ".join(
            ([f"no argument for {', '.join(missing)}"] if missing else []) +
            ([f"no parameter named {', '.join(unknown)}"] if unknown else [])) + f" (parameters: {', '.join(names)})")
    out = []
    for p, kind, scalar_type, least, greatest in plan:
        value = values[p.name]
        if kind == "int":
            if not isinstance(value, (int, np.integer)):
                raise DeviceError(f"launch of {kernel}: argument {p.name} ({p.ctype}) takes an integer, not "
                                  f"{type(value).__name__} {value!r}")
            if not least <= value <= greatest:
                raise DeviceError(f"launch of {kernel}: argument {p.name} ({p.ctype}): {int(value)} is out of its "
                                  f"range")
            out.append(scalar_type(value))
        elif kind == "float":
            if not isinstance(value, (int, float, np.integer, np.floating)):
                raise DeviceError(f"launch of {kernel}: argument {p.name} ({p.ctype}) takes a number, not "
                                  f"{type(value).__name__} {value!r}")
            out.append(scalar_type(value))
        elif kind == "pointer":
            if not isinstance(value, (Buffer, np.uint64)):
                raise DeviceError(f"launch of {kernel}: argument {p.name} ({p.ctype}*) takes a Buffer or an address "
                                  f"(lucegen.runtime.device.address), not {type(value).__name__} {value!r}")
            out.append(value)
        else:
            if not isinstance(value, ByValue):
                raise DeviceError(f"launch of {kernel}: argument {p.name} ({p.ctype} by value) takes a ByValue (a "
                                  f"TensorMap), not {type(value).__name__}")
            if p.nbytes is not None and len(value.raw) != p.nbytes:
                raise DeviceError(f"launch of {kernel}: argument {p.name} ({p.ctype}) is {p.nbytes} bytes, given "
                                  f"{len(value.raw)}")
            out.append(value)
    return tuple(out)


def declared_signature(compiled, kernel: str) -> KernelSignature | None:
    """The declaration of ``kernel`` in the family the module ``compiled`` was built for, as that module's source
    instantiates it (its conditional parameters resolved); None where the family declares no such kernel. A
    DeviceError if the source's parameters are none of the declaration's."""
    declared = codegen.signature(compiled.name, kernel)
    if declared is None:
        return None
    params = source_parameters(compiled.source).get(kernel)
    if params is None:
        raise DeviceError(f"module {compiled.name}: its source declares no kernel {kernel}")
    try:
        return declared.check_source(kernel, tuple(parameter_name(p) for p in params))
    except SignatureError as exc:
        raise DeviceError(f"module {compiled.name}: {exc}") from None


def launch_arguments(function, args: Sequence, named: dict) -> tuple:
    """What a launch of ``function`` (a Function or the host device's) passes: its named arguments bound to its
    declaration, or, for a kernel no family declares, its ``args``."""
    if function.signature is not None:
        if args:
            raise DeviceError(f"launch of {function.name}: name its arguments "
                              f"({', '.join(p.name for p in function.signature.params)}), not a tuple")
        return bind_arguments(function.name, function.signature, named)
    if named:
        raise DeviceError(f"launch of {function.name}: no family declares its parameters, so its arguments go in "
                          f"args=(...) in the kernel's order, not by name ({', '.join(named)})")
    return tuple(args)


def _launch_config(grid, block, smem: int, stream=0, attributes=()):
    """A CUlaunchConfig (cuLaunchKernelEx, the occupancy queries) of a 3-D grid and block."""
    config = _driver().CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes, config.hStream = smem, stream
    config.attrs, config.numAttrs = list(attributes), len(attributes)
    return config


class Function:
    def __init__(self, module: "Module", name: str, handle):
        self.module, self.name, self.handle = module, name, handle
        #: The kernel's declared parameters (None: no family declares it; launches then take ``args``).
        self.signature = declared_signature(module.compiled, name)
        #: Whether launches are programmatic unless told otherwise (Module.function's ``programmatic``).
        self.programmatic = False

    def launch(self, grid, block, args: Sequence = (), *, smem: int = 0, stream: Stream | None = None,
               cooperative: bool = False, programmatic: bool | None = None, **arguments) -> None:
        """Launch on ``stream`` (default stream if None) with the kernel's ``arguments`` by parameter name
        (:func:`bind_arguments`; ``args`` only for a kernel no family declares). ``cooperative`` uses
        cuLaunchCooperativeKernel (all blocks co-resident; required for grid-wide barriers). ``programmatic``
        (features.programmatic_launch; None: the function's own) lets the kernel start before the previous one in
        the stream has finished: it must call lg_grid_dependency_wait() before it touches what that kernel writes
        (common/prelude.cuh.j2)."""
        if programmatic is None:
            programmatic = self.programmatic
        driver = _driver()
        gx, gy, gz = _dim3(grid)
        bx, by, bz = _dim3(block)
        threads = bx * by * bz
        target = self.module.device.target
        if threads > target.max_threads_per_block:
            raise DeviceError(f"{self.name}: {threads} threads per block exceed {target.name}'s "
                              f"max_threads_per_block {target.max_threads_per_block}")
        _storage, pointers = pack_args(launch_arguments(self, args, arguments))
        params = pointers.ctypes.data if len(pointers) else 0
        handle = stream.handle if stream else 0
        if programmatic:
            if cooperative or not target.features.programmatic_launch:
                raise DeviceError(f"{self.name}: a programmatic launch needs features.programmatic_launch "
                                  f"({target.name}) and no cooperative launch")
            attribute = driver.CUlaunchAttribute()
            attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attribute.value.programmaticStreamSerializationAllowed = 1
            config = _launch_config((gx, gy, gz), (bx, by, bz), smem, handle, [attribute])
            _check(f"cuLaunchKernelEx({self.name})", driver.cuLaunchKernelEx(config, self.handle, params, 0))
        elif cooperative:
            result = driver.cuLaunchCooperativeKernel(self.handle, gx, gy, gz, bx, by, bz, smem, handle, params)
            _check(f"cuLaunchCooperativeKernel({self.name})", result)
        else:
            result = driver.cuLaunchKernel(self.handle, gx, gy, gz, bx, by, bz, smem, handle, params, 0)
            _check(f"cuLaunchKernel({self.name})", result)

    def set_max_dynamic_smem(self, nbytes: int) -> None:
        target = self.module.device.target
        if nbytes > target.smem_per_block_optin:
            raise DeviceError(f"{self.name}: {nbytes} bytes of dynamic shared memory exceed {target.name}'s "
                              f"smem_per_block_optin {target.smem_per_block_optin}")
        driver = _driver()
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        _check(f"cuFuncSetAttribute({self.name})", driver.cuFuncSetAttribute(self.handle, attr, nbytes))

    def max_active_blocks_per_cu(self, block_threads: int, smem: int = 0) -> int:
        """Occupancy: how many blocks of this shape fit on one SM at once."""
        driver = _driver()
        result = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.handle, block_threads, smem)
        return int(_check(f"cuOccupancyMaxActiveBlocksPerMultiprocessor({self.name})", result))

    def max_active_clusters(self, cluster: int, block_threads: int, smem: int = 0) -> int:
        """Occupancy of a kernel compiled with ``__cluster_dims__(cluster, 1, 1)``: how many of its clusters the
        whole device holds at once (cluster CTAs share a GPC, so this can be less than SMs / cluster)."""
        driver = _driver()
        config = _launch_config((cluster, 1, 1), (block_threads, 1, 1), smem)
        result = driver.cuOccupancyMaxActiveClusters(self.handle, config)
        return int(_check(f"cuOccupancyMaxActiveClusters({self.name})", result))

    def attribute(self, name: str) -> int:
        """A CU_FUNC_ATTRIBUTE_* value by its short name, e.g. ``attribute("NUM_REGS")``."""
        driver = _driver()
        attr = getattr(driver.CUfunction_attribute, f"CU_FUNC_ATTRIBUTE_{name}")
        return int(_check(f"cuFuncGetAttribute({self.name}, {name})", driver.cuFuncGetAttribute(attr, self.handle)))


class Module:
    def __init__(self, device: "Device", compiled, handle):
        self.device, self.compiled, self.handle = device, compiled, handle
        self._functions: dict[str, Function] = {}

    def function(self, name: str, *, programmatic: bool = False) -> Function:
        """Kernel ``name``. ``programmatic``: it waits for the kernel before it in its stream before touching that
        kernel's outputs (lg_grid_dependency_wait, lg_dependent_start), so its launches are programmatic where the
        target has features.programmatic_launch."""
        if name not in self._functions:
            driver = _driver()
            result = driver.cuModuleGetFunction(self.handle, name.encode())
            if result[0] != driver.CUresult.CUDA_SUCCESS:
                known = ", ".join(k.name for k in self.compiled.kernels)
                raise DeviceError(f"module {self.compiled.name}: no kernel {name!r} (kernels: {known})")
            self._functions[name] = Function(self, name, result[1])
        fn = self._functions[name]
        fn.programmatic |= programmatic and self.device.target.features.programmatic_launch
        return fn

    def unload(self) -> None:
        if self.handle is not None:
            _check("cuModuleUnload", _driver().cuModuleUnload(self.handle))
            self.handle = None


def detect() -> tuple[str, int, str]:
    """(arch like "sm_90", SM count, device name) of GPU 0, without opening a context."""
    driver = _driver()
    try:
        init = driver.cuInit(0)
    except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError when there is no NVIDIA driver (libcuda)
        raise DeviceError(f"cannot open an NVIDIA GPU: {exc}") from None
    _check("cuInit", init)
    if _check("cuDeviceGetCount", driver.cuDeviceGetCount()) < 1:
        raise DeviceError("no NVIDIA GPU visible")
    dev = _check("cuDeviceGet", driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute
    major = _check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = _check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    sms = _check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    name = _check("cuDeviceGetName", driver.cuDeviceGetName(256, dev))
    name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
    return f"sm_{major}{minor}", int(sms), name


def read_facts() -> DeviceFacts:
    """GPU 0's facts, from the driver (no context opened)."""
    arch, sms, name = detect()
    driver = _driver()
    dev = _check("cuDeviceGet", driver.cuDeviceGet(0))
    attr = driver.CUdevice_attribute

    def get(key: str) -> int:
        return int(_check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(getattr(attr, key), dev)))

    return DeviceFacts(
        arch=arch, sms=sms, name=name,
        memory_bytes=int(_check("cuDeviceTotalMem", driver.cuDeviceTotalMem(dev))),
        l2_bytes=get("CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE"),
        smem_per_block_optin=get("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        smem_per_cu=get("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        regs_per_cu=get("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR"),
        max_threads_per_cu=get("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR"),
        clock_khz=get("CU_DEVICE_ATTRIBUTE_CLOCK_RATE"),
        memory_clock_khz=get("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE"),
        bus_width_bits=get("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH"),
    )


def match_target(arch: str, sms: int, device_name: str = "GPU", target: Target | str | None = None) -> Target:
    """The descriptor for a device of ``arch`` with ``sms`` SMs: the one given (refused if it does not match) or
    the one in targets/ whose arch and compute_units match."""
    if target is not None:
        chosen = target if isinstance(target, Target) else load_target(target)
        if chosen.arch != arch:
            raise DeviceError(f"descriptor {chosen.name} is for {chosen.arch}, but the device ({device_name}) is {arch}")
        if chosen.compute_units != sms:
            raise DeviceError(f"descriptor {chosen.name} has compute_units = {chosen.compute_units}, but the device "
                              f"({device_name}) has {sms} SMs; run `lucegen new-target NAME --like {chosen.name}` "
                              f"and set compute_units = {sms}")
        return chosen
    candidates = [load_target(n) for n in list_targets()]
    for t in candidates:
        if t.is_nvidia and t.arch == arch and t.compute_units == sms:
            return t
    same_arch = [t.name for t in candidates if t.is_nvidia and t.arch == arch]
    like = same_arch[0] if same_arch else "sm_89"
    raise DeviceError(f"no descriptor for {arch} with {sms} SMs ({device_name}); run "
                      f"`lucegen new-target NAME --like {like}` and set arch = \"{arch}\", compute_units = {sms}")


class Device:
    """GPU 0 with its primary context made current, and the descriptor that matches it."""

    def __init__(self, target: Target, handle, context, name: str):
        self.target, self.handle, self.context, self.name = target, handle, context, name
        self.allocated = 0  # bytes of the live buffers from alloc (the memory plan's ledger)

    @classmethod
    def open(cls, target: Target | str | None = None) -> "Device":
        arch, sms, name = detect()
        if target is None:  # any NVIDIA GPU: an exact descriptor, else one built from the driver's facts
            chosen = pick_target(read_facts())
        else:
            chosen = match_target(arch, sms, name, target)
        driver = _driver()
        handle = _check("cuDeviceGet", driver.cuDeviceGet(0))
        context = _check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(handle))
        _check("cuCtxSetCurrent", driver.cuCtxSetCurrent(context))
        return cls(chosen, handle, context, name)

    def make_current(self) -> None:
        """Make the device's context current in the calling thread: a CUDA context is current per thread, so a
        thread other than the one that opened the device (a server's engine thread, a user's worker) calls this
        before its first launch."""
        _check("cuCtxSetCurrent", _driver().cuCtxSetCurrent(self.context))

    def close(self) -> None:
        if self.context is not None:
            self.synchronize()
            _check("cuDevicePrimaryCtxRelease", _driver().cuDevicePrimaryCtxRelease(self.handle))
            self.context = None

    def pci_bus_id(self) -> str:
        """The GPU's PCI bus id ("0000:3b:00.0"): how NVML (lucegen/runtime/energy.py) finds the same GPU whatever
        CUDA's device order."""
        bus = _check("cuDeviceGetPCIBusId", _driver().cuDeviceGetPCIBusId(32, self.handle))
        bus = bus.split(b"\0", 1)[0].decode() if isinstance(bus, bytes) else str(bus)
        return bus

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- modules -----------------------------------------------------------------------------------------------
    def load(self, compiled) -> Module:
        """Load a CompiledModule (its cubin) compiled for this device's target."""
        if compiled.target != self.target.name or compiled.arch.rstrip("a") != self.target.arch:
            raise DeviceError(f"module {compiled.name} was compiled for {compiled.target} ({compiled.arch}); "
                              f"this device runs {self.target.name} ({self.target.arch})")
        handle = _check(f"cuModuleLoadData({compiled.name})", _driver().cuModuleLoadData(compiled.binary))
        return Module(self, compiled, handle)

    # ---- memory ------------------------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        if nbytes <= 0:
            raise DeviceError(f"cannot allocate {nbytes} bytes")
        ptr = _check(f"cuMemAlloc({nbytes})", _driver().cuMemAlloc(nbytes))
        self.allocated += nbytes
        return Buffer(int(ptr), nbytes, self)

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory (cuMemGetInfo)."""
        free, total = _check("cuMemGetInfo", _driver().cuMemGetInfo())
        return int(free), int(total)

    def upload(self, array: np.ndarray, buffer: Buffer | None = None) -> Buffer:
        """Copy a host array to the device (into ``buffer`` if given, else a new one)."""
        array, buffer = upload_pair(self, array, buffer)
        if array.nbytes:
            _check("cuMemcpyHtoD", _driver().cuMemcpyHtoD(buffer.ptr, array.ctypes.data, array.nbytes))
        return buffer

    def upload_async(self, array: np.ndarray, buffer: Buffer, stream: Stream) -> None:
        """Copy a host array into ``buffer``, queued on ``stream``: after the kernels queued before it, before those
        queued after it, with no host wait. The array is pageable memory, which the driver stages before returning,
        so the caller may reuse or drop it at once."""
        array, buffer = upload_pair(self, array, buffer)
        if array.nbytes:
            _check("cuMemcpyHtoDAsync", _driver().cuMemcpyHtoDAsync(buffer.ptr, array.ctypes.data, array.nbytes,
                                                                    stream.handle))

    def pinned(self, count: int, dtype) -> PinnedArray:
        """``count`` elements of ``dtype`` of page-locked host memory (cuMemHostAlloc), zeroed."""
        nbytes = count * np.dtype(dtype).itemsize
        if nbytes <= 0:
            raise DeviceError(f"cannot pin {nbytes} bytes")
        ptr = int(_check(f"cuMemHostAlloc({nbytes})", _driver().cuMemHostAlloc(nbytes, 0)))
        array = np.frombuffer((ctypes.c_byte * nbytes).from_address(ptr), dtype=dtype, count=count)
        array[:] = 0
        return PinnedArray(array, ptr)

    def upload_pinned_async(self, host: PinnedArray, buffer: Buffer, stream: Stream) -> None:
        """Copy all of ``host`` into ``buffer``, queued on ``stream`` (capturable in a graph: the graph then reads
        ``host`` as it is when the copy runs)."""
        if host.array.nbytes > buffer.nbytes:
            raise DeviceError(f"upload of {host.array.nbytes} bytes into a {buffer.nbytes}-byte buffer")
        _check("cuMemcpyHtoDAsync", _driver().cuMemcpyHtoDAsync(buffer.ptr, host.ptr, host.array.nbytes,
                                                                stream.handle))

    def download_pinned_async(self, buffer: Buffer, host: PinnedArray, stream: Stream) -> None:
        """Copy the first ``host.array.nbytes`` of ``buffer`` into ``host``, queued on ``stream`` (capturable);
        readable once the stream is synchronised."""
        if host.array.nbytes > buffer.nbytes:
            raise DeviceError(f"download of {host.array.nbytes} bytes from a {buffer.nbytes}-byte buffer")
        _check("cuMemcpyDtoHAsync", _driver().cuMemcpyDtoHAsync(host.ptr, buffer.ptr, host.array.nbytes,
                                                                stream.handle))

    def download(self, buffer: Buffer, dtype, shape: int | Sequence[int]) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        if out.nbytes > buffer.nbytes:
            raise DeviceError(f"download of {out.nbytes} bytes from a {buffer.nbytes}-byte buffer")
        if out.nbytes:
            _check("cuMemcpyDtoH", _driver().cuMemcpyDtoH(out.ctypes.data, buffer.ptr, out.nbytes))
        return out

    def tensor_map_2d(self, ptr: int, rows: int, cols: int, row_stride_bytes: int, box_rows: int, box_cols: int,
                      dtype: str = "bf16") -> TensorMap:
        """:func:`tensor_map_2d` (a TMA descriptor for a kernel argument; needs ``features.tma``)."""
        if not self.target.features.tma:
            raise DeviceError(f"{self.target.name} has no TMA (features.tma = false): no tensor maps")
        return tensor_map_2d(ptr, rows, cols, row_stride_bytes, box_rows, box_cols, dtype)

    def memset(self, buffer: Buffer, byte: int = 0) -> None:
        _check("cuMemsetD8", _driver().cuMemsetD8(buffer.ptr, byte, buffer.nbytes))

    def memset_async(self, ptr: int, nbytes: int, stream: Stream | None = None, byte: int = 0) -> None:
        """Fill ``nbytes`` at device address ``ptr`` with ``byte``, queued on ``stream`` (capturable in a graph)."""
        if nbytes > 0:
            handle = stream.handle if stream else 0
            _check("cuMemsetD8Async", _driver().cuMemsetD8Async(int(ptr), byte, nbytes, handle))

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Stream | None = None) -> None:
        """Device-to-device copy of ``nbytes`` queued on ``stream`` (capturable in a graph)."""
        if nbytes > 0:
            handle = stream.handle if stream else 0
            _check("cuMemcpyDtoDAsync", _driver().cuMemcpyDtoDAsync(int(dst), int(src), nbytes, handle))

    # ---- streams, events, sync ---------------------------------------------------------------------------------
    def stream(self) -> Stream:
        driver = _driver()
        return Stream(_check("cuStreamCreate", driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)))

    def event(self) -> Event:
        driver = _driver()
        return Event(_check("cuEventCreate", driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DEFAULT)))

    def synchronize(self) -> None:
        _check("cuCtxSynchronize", _driver().cuCtxSynchronize())

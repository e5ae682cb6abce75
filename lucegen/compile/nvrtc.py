"""NVIDIA back end: NVRTC (cuda.bindings.nvrtc) compiles CUDA C++ straight to a cubin for ``-arch=sm_XX``.

Headers (cuda_bf16.h, cuda_fp16.h, the CCCL) come from the nvidia-* wheels, located by cuda.pathfinder; no system
CUDA is needed. Per-kernel registers, spills and static shared memory come from ptxas' verbose report in the log;
code size from the cubin's symbol table.
"""

from __future__ import annotations

import functools
import re
import threading

from .base import CompilerRejected, KernelInfo
from .elf import cubin_resources, function_sizes

BASE_OPTIONS = ("-std=c++17", "-default-device", "-Xptxas", "-v")
# One NVRTC compile at a time per process: concurrent compiles lose or mix ptxas' verbose report (seen with
# NVRTC 13.0: a module compiled beside another came back with an empty resource report).
_COMPILE_LOCK = threading.Lock()


def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


def _check(result, what: str):
    nvrtc = _nvrtc()
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise CompilerRejected(f"{what}: {msg.decode() if isinstance(msg, bytes) else msg}")
    return result[1] if len(result) == 2 else result[1:]


@functools.cache
def compiler_id() -> str:
    major, minor = _check(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return f"nvrtc {major}.{minor}"


@functools.cache
def supported_archs() -> tuple[int, ...]:
    return tuple(_check(_nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))


@functools.cache
def include_options() -> tuple[str, ...]:
    import cuda.pathfinder as pathfinder

    dirs = []
    for lib in ("cudart", "cccl"):
        found = pathfinder.find_nvidia_header_directory(lib)
        if found is None:
            raise CompilerRejected(f"CUDA headers for {lib!r} not found (install the nvidia-cuda-runtime and "
                                   "nvidia-cuda-cccl wheels)")
        dirs.append(f"-I{found}")
    return tuple(dirs)


def options_for(arch: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The compile options that enter the cache key (include paths excluded: they move between machines)."""
    return (f"-arch={arch}", *BASE_OPTIONS, *extra)


def compile(arch: str, filename: str, source: str, options: tuple[str, ...]) -> tuple[bytes, str, tuple[KernelInfo, ...]]:
    nvrtc = _nvrtc()
    sm = int(re.sub(r"\D", "", arch))
    if sm not in supported_archs():
        raise CompilerRejected(f"{compiler_id()} cannot compile for {arch} (supports sm_"
                               f"{', sm_'.join(map(str, supported_archs()))})")
    with _COMPILE_LOCK:
        return _compile_locked(nvrtc, filename, source, options)


def _compile_locked(nvrtc, filename: str, source: str, options: tuple[str, ...]):
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in (*options, *include_options())]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        _check((nvrtc.nvrtcGetProgramLog(prog, buf)[0], None), "nvrtcGetProgramLog")
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompilerRejected(log)
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check((nvrtc.nvrtcGetCUBIN(prog, cubin)[0], None), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return cubin, log, kernel_infos(log, cubin)


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def kernel_infos(log: str, cubin: bytes) -> tuple[KernelInfo, ...]:
    """Each kernel's registers, spill bytes and static shared memory from ptxas' report in the log; code size from
    the cubin. A kernel the log does not cover (NVRTC 13.0 reports ptxas info for only the first program compiled
    in a process) is read from the cubin's .nv.info instead, with its stack frame bytes standing in for spills."""
    sizes = function_sizes(cubin)
    from_log: dict[str, KernelInfo] = {}
    current, regs, spills, smem = None, 0, 0, 0

    def flush():
        if current is not None:
            from_log[current] = KernelInfo(current, regs, spills, smem, sizes.get(current, 0))

    for line in log.splitlines():
        if m := _ENTRY.search(line):
            flush()
            current, regs, spills, smem = m.group(1), 0, 0, 0
        elif (m := _SPILLS.search(line)) and current is not None:
            spills = int(m.group(1)) + int(m.group(2))
        elif (m := _USED.search(line)) and current is not None:
            regs, smem = int(m.group(1)), int(m.group(2) or 0)
    flush()
    infos = list(from_log.values())
    for name, (elf_regs, frame, shared) in cubin_resources(cubin).items():
        if name not in from_log:
            infos.append(KernelInfo(name, elf_regs, frame, shared, sizes.get(name, 0)))
    return tuple(infos)

"""Types shared by the compiler back ends."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KernelInfo:
    """Resources of one kernel as the compiler reports them."""

    name: str
    registers: int  # per thread (NVIDIA: registers; AMD: VGPRs)
    spills: int  # bytes spilled (stores + loads on NVIDIA; scratch bytes per lane on AMD)
    shared_bytes: int  # static shared memory (LDS) per block
    code_bytes: int  # machine code size


@dataclass(frozen=True)
class CompiledModule:
    """A compiled translation unit: ``binary`` is a cubin (NVIDIA) or an AMDGPU ELF code object (AMD)."""

    name: str
    target: str
    arch: str
    binary: bytes
    kernels: tuple[KernelInfo, ...]
    log: str
    compiler: str
    options: tuple[str, ...]
    cached: bool
    source: str = field(default="", repr=False)  # the translation unit it was compiled from

    def kernel(self, name: str) -> KernelInfo:
        for info in self.kernels:
            if info.name == name:
                return info
        raise KeyError(name)


class CompilerRejected(Exception):
    """Internal: a back end's compiler failed; ``log`` is its output. compile_source turns it into CompileError."""

    def __init__(self, log: str):
        super().__init__(log)
        self.log = log

"""AMD back end: clang's AMDGPU backend compiles HIP device code with no ROCm installed.

Two steps, both through ``clang-19`` (override with ``$LUCEGEN_CLANG``): HIP → AMDGPU assembly
(``-x hip --offload-arch=gfxNNNN -nogpulib -nogpuinc --cuda-device-only -O3 -S``; the HIP definitions the code needs
come from templates/common/hip_runtime.h.j2, rendered into the source), then assembly → an AMDGPU ELF relocatable code
object (``-x assembler -target amdgcn-amd-amdhsa``). This avoids the device link step, which needs ``lld`` (not part
of the clang-19 package). Resource usage comes from ``-Rpass-analysis=kernel-resource-usage`` remarks; code size from
the object's symbol table.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .base import CompilerRejected, KernelInfo
from .elf import function_sizes

#: ``-fuse-cuid=none``: by default clang names a ``__hip_cuid_<hash>`` symbol after a hash of the input's path, which
#: lies in a fresh temp directory each compile; without it two builds of one source give the same code object, byte
#: for byte.
BASE_OPTIONS = ("-nogpulib", "-nogpuinc", "--cuda-device-only", "-O3", "-std=c++17", "-fuse-cuid=none")


#: Why an AMD compile cannot run here, and the Debian package that fixes it.
MISSING_CLANG = ("clang-19 not found: AMD targets compile with it; install the Debian package clang-19 "
                 "(apt-get install clang-19) or set LUCEGEN_CLANG")


def find_clang() -> str | None:
    """The clang the AMD back end uses ($LUCEGEN_CLANG, else clang-19, else clang on PATH); None when there is none."""
    for candidate in (os.environ.get("LUCEGEN_CLANG"), "clang-19", "clang"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


@functools.cache
def clang() -> str:
    found = find_clang()
    if found is None:
        raise CompilerRejected(MISSING_CLANG)
    return found


@functools.cache
def compiler_id() -> str:
    out = subprocess.run([clang(), "--version"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0].strip() if out else "clang (unknown version)"


def options_for(arch: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    return (f"--offload-arch={arch}", *BASE_OPTIONS, *extra)


def compile(arch: str, filename: str, source: str, options: tuple[str, ...]) -> tuple[bytes, str, tuple[KernelInfo, ...]]:
    with tempfile.TemporaryDirectory(prefix="lucegen-hip-") as tmp:
        src = Path(tmp) / filename
        asm, obj = Path(tmp) / "module.s", Path(tmp) / "module.o"
        src.write_text(source)
        step1 = subprocess.run(
            [clang(), "-x", "hip", *options, "-Rpass-analysis=kernel-resource-usage", "-S", filename, "-o", str(asm)],
            capture_output=True, text=True, cwd=tmp, check=False,
        )
        log = step1.stderr
        if step1.returncode != 0:
            raise CompilerRejected(log)
        step2 = subprocess.run(
            [clang(), "-x", "assembler", "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}", "-c", str(asm), "-o", str(obj)],
            capture_output=True, text=True, check=False,
        )
        if step2.returncode != 0:
            raise CompilerRejected(log + step2.stderr)
        binary = obj.read_bytes()
    remarks = "\n".join(line for line in log.splitlines() if "kernel-resource-usage" in line)
    return binary, remarks, kernel_infos(remarks, binary)


_REMARK = re.compile(r"remark:\s+([A-Za-z ]+?)(?: \[[^\]]*\])?: (\S+) \[-Rpass-analysis")


def kernel_infos(log: str, binary: bytes) -> tuple[KernelInfo, ...]:
    """Parse clang's kernel-resource-usage remarks. ``spills`` = (VGPR + SGPR spills) × 4 bytes."""
    sizes = function_sizes(binary)
    kernels: list[dict] = []
    for line in log.splitlines():
        m = _REMARK.search(line)
        if not m:
            continue
        key, value = m.group(1).strip(), m.group(2)
        if key == "Function Name":
            kernels.append({"name": value})
        elif kernels:
            kernels[-1][key] = value
    return tuple(
        KernelInfo(
            name=k["name"],
            registers=int(k.get("VGPRs", 0)),
            spills=4 * (int(k.get("VGPRs Spill", 0)) + int(k.get("SGPRs Spill", 0))),
            shared_bytes=int(k.get("LDS Size", 0)),
            code_bytes=sizes.get(k["name"], 0),
        )
        for k in kernels
    )

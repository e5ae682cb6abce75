"""Compile rendered source for a target: NVRTC → cubin (NVIDIA), clang-19 → AMDGPU code object (AMD).

``compile_source(target, name, source)`` is the one entry point. Results are cached on disk by content
(see :mod:`lucegen.compile.cache`); a warm call costs one file read and a sha256.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import TYPE_CHECKING

from ..errors import CompileError
from . import cache
from .base import CompiledModule, CompilerRejected, KernelInfo

if TYPE_CHECKING:
    from ..target import Target

__all__ = ["CompiledModule", "KernelInfo", "compile_source", "backend_for"]

logger = logging.getLogger("lucegen")

#: Bump when the cache entry's metadata format or the back ends' output changes meaning.
CACHE_FORMAT = 2


def backend_for(target: "Target"):
    if target.is_nvidia:
        from . import nvrtc

        return nvrtc
    from . import hip

    return hip


def compile_source(
    target: "Target",
    name: str,
    source: str,
    *,
    template: str | None = None,
    options: tuple[str, ...] = (),
    arch: str | None = None,
    use_cache: bool = True,
) -> CompiledModule:
    """Compile ``source`` (a whole translation unit) for ``target``.

    ``name`` names the module (file name in compiler messages: ``<name>.cu``/``.hip``); ``template`` is the
    template it came from (for error messages); ``options`` are extra compiler flags (e.g. ``--use_fast_math``);
    ``arch`` overrides the target's arch string (e.g. ``sm_90a`` for wgmma kernels).
    Raises CompileError with the compiler log and the failing source lines.
    """
    backend = backend_for(target)
    arch = arch or target.arch
    filename = f"{name}{target.source_suffix}"
    try:
        compiler = backend.compiler_id()
        opts = backend.options_for(arch, tuple(options))
    except CompilerRejected as exc:
        raise CompileError(f"{template or name} for {target.name}: {exc.log}") from None
    key = cache.cache_key(format=CACHE_FORMAT, compiler=compiler, options=opts, arch=arch, filename=filename,
                          source=source)
    if use_cache and (hit := cache.load(key)) is not None:
        meta, binary = hit
        kernels = tuple(KernelInfo(**k) for k in meta["kernels"])
        return CompiledModule(name, target.name, arch, binary, kernels, meta["log"], compiler, opts, cached=True,
                              source=source)
    logger.info("compiling %s for %s (%s); later runs take it from the cache", template or filename, target.name,
                compiler)
    try:
        binary, log, kernels = backend.compile(arch, filename, source, opts)
    except CompilerRejected as exc:
        raise CompileError(format_failure(template or name, target.name, compiler, filename, source, exc.log)) from None
    if use_cache:
        cache.store(key, {"kernels": [dataclasses.asdict(k) for k in kernels], "log": log}, binary)
    return CompiledModule(name, target.name, arch, binary, kernels, log, compiler, opts, cached=False, source=source)


# NVRTC: "file.cu(12): error: ..."; clang: "file.hip:12:5: error: ..."
_LOCATION = re.compile(r"^(?P<file>[^\s:()]+)(?:\((?P<l1>\d+)\)|:(?P<l2>\d+):\d+): (?:catastrophic )?(?:fatal )?error")


def format_failure(template: str, target: str, compiler: str, filename: str, source: str, log: str,
                   context: int = 2, max_errors: int = 5) -> str:
    """The CompileError message: what failed, the compiler log, then each failing line of the rendered source."""
    lines = source.splitlines()
    failing = []
    for entry in log.splitlines():
        m = _LOCATION.match(entry.strip())
        if m and m.group("file").endswith(filename):
            number = int(m.group("l1") or m.group("l2"))
            if number not in failing:
                failing.append(number)
    parts = [f"{compiler} failed to compile template {template} for target {target}:", log.strip()]
    for number in failing[:max_errors]:
        parts.append(f"--- {filename} (rendered from {template}), line {number}:")
        for i in range(max(1, number - context), min(len(lines), number + context) + 1):
            marker = ">>" if i == number else "  "
            parts.append(f"{marker} {i:5d} | {lines[i - 1]}")
    return "\n".join(parts)

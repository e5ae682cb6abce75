"""A kernel's parameter list, declared once as data: the template's C signature is rendered from it and a launch's
named arguments are checked and packed against it.

    RMSNORM = KernelSignature("rmsnorm_{dtype}", (
        pointer("x", "{T}", const=True), pointer("w", "{T}", const=True), pointer("y", "{T}"),
        scalar("n", "int"), scalar("eps", "float")))

A family lists its kernels' declarations in ``KernelFamily.signatures``. In the template, the Jinja global
``kernel_signature(name, **values)`` writes ``name(<parameters>)`` from the declaration of the template's family that
matches the kernel name; ``values`` fill the ``{placeholder}`` types (``T=T``) and say which conditional parameters
(``when="tma"``) the instance has (``tma=TMA``). The runtime launches the kernel with named arguments
(``fn.launch(grid, block, x=..., n=4096, eps=1e-6)``), which lucegen.runtime.device packs in the declared order and
C types.

A name's ``{field}`` stands for one or more lower-case letters, digits or underscores (``gemm_rows_f32_m{bm}``
matches ``gemm_rows_f32_m64``); one kernel name matches at most one declaration of a family.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np

from .errors import LucegenError

#: The scalar C types a declaration may use, with the numpy type a launch packs each as.
SCALAR_TYPES = {
    "int": np.int32, "unsigned": np.uint32, "unsigned int": np.uint32, "float": np.float32,
    "long long": np.int64, "unsigned long long": np.uint64, "size_t": np.uint64,
}
KINDS = ("pointer", "scalar", "struct")
#: Keyword arguments of Function.launch that are launch options, so no parameter may be named so.
LAUNCH_OPTIONS = ("grid", "block", "args", "smem", "stream", "cooperative", "programmatic")
#: Columns of a rendered signature's lines, at most (where one parameter alone is not longer).
LINE_WIDTH = 120

_FIELD = re.compile(r"\{(\w+)\}")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


class SignatureError(LucegenError):
    """A declaration that cannot be, or a kernel, source or launch that does not match its declaration."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One kernel parameter. ``ctype``: a pointer's element type, a scalar's type (a key of SCALAR_TYPES) or a
    struct's type; ``{name}`` in it is a placeholder the template fills. ``when``: the parameter exists only in
    instances rendered with that flag true."""

    name: str
    ctype: str
    kind: str
    const: bool = False
    restrict: bool = True  # pointers: __restrict__
    grid_constant: bool = False  # structs: __grid_constant__ (the kernel takes the parameter's address)
    nbytes: int | None = None  # structs: the size a by-value argument must have (None: any)
    when: str | None = None

    def __post_init__(self):
        where = f"parameter {self.name!r}"
        if not _IDENTIFIER.fullmatch(self.name):
            raise SignatureError(f"{where}: not a C identifier")
        if self.name in LAUNCH_OPTIONS:
            raise SignatureError(f"{where}: the name is a launch option of Function.launch "
                                 f"({', '.join(LAUNCH_OPTIONS)})")
        if self.kind not in KINDS:
            raise SignatureError(f"{where}: kind {self.kind!r} is not one of {list(KINDS)}")
        if self.kind == "scalar" and self.ctype not in SCALAR_TYPES:
            raise SignatureError(f"{where}: scalar type {self.ctype!r} is not one of {sorted(SCALAR_TYPES)}")
        if self.kind != "struct" and (self.grid_constant or self.nbytes is not None):
            raise SignatureError(f"{where}: only a struct is __grid_constant__ or has a size")

    @property
    def dtype(self) -> type:
        """A scalar's numpy type."""
        return SCALAR_TYPES[self.ctype]

    @property
    def size(self) -> int | None:
        """Bytes of the parameter as the kernel receives it (None: a struct of undeclared size)."""
        if self.kind == "pointer":
            return 8
        if self.kind == "scalar":
            return np.dtype(self.dtype).itemsize
        return self.nbytes

    @property
    def placeholders(self) -> set[str]:
        return set(_FIELD.findall(self.ctype))

    def c_declaration(self, types: dict[str, str]) -> str:
        ctype = _FIELD.sub(lambda m: str(types[m.group(1)]), self.ctype)
        const = "const " if self.const else ""
        if self.kind == "pointer":
            return f"{const}{ctype}* {'__restrict__ ' if self.restrict else ''}{self.name}"
        if self.kind == "struct":
            return f"{const}{'__grid_constant__ ' if self.grid_constant else ''}{ctype} {self.name}"
        return f"{const}{ctype} {self.name}"


def pointer(name: str, ctype: str, *, const: bool = False, restrict: bool = True, when: str | None = None) -> Param:
    return Param(name, ctype, "pointer", const=const, restrict=restrict, when=when)


def scalar(name: str, ctype: str, *, when: str | None = None) -> Param:
    return Param(name, ctype, "scalar", when=when)


def struct(name: str, ctype: str, nbytes: int | None = None, *, const: bool = True, grid_constant: bool = True,
           when: str | None = None) -> Param:
    return Param(name, ctype, "struct", const=const, grid_constant=grid_constant, nbytes=nbytes, when=when)


@dataclasses.dataclass(frozen=True)
class KernelSignature:
    """A kernel's name (or a pattern of names, ``{field}`` parts) and its parameters in order."""

    name: str
    params: tuple[Param, ...]

    def __post_init__(self):
        names = [p.name for p in self.params]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise SignatureError(f"kernel {self.name}: parameters declared twice: {', '.join(twice)}")
        object.__setattr__(self, "_pattern", re.compile(
            "".join(re.escape(part) if i % 2 == 0 else "[a-z0-9_]+" for i, part in enumerate(_FIELD.split(self.name)))))

    def matches(self, kernel: str) -> bool:
        return self._pattern.fullmatch(kernel) is not None

    @property
    def flags(self) -> tuple[str, ...]:
        """The names conditional parameters depend on (``when``), in order of first use."""
        return tuple(dict.fromkeys(p.when for p in self.params if p.when))

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(sorted(set().union(*(p.placeholders for p in self.params))))

    def instance(self, kernel: str, flags: dict[str, bool]) -> "KernelSignature":
        """The declaration of the kernel named ``kernel`` rendered with ``flags``: its conditional parameters kept
        or dropped, its name the kernel's."""
        missing = [f for f in self.flags if f not in flags]
        if missing:
            raise SignatureError(f"kernel {kernel}: no value for the flag(s) {', '.join(missing)} its conditional "
                                 f"parameters depend on")
        return KernelSignature(kernel, tuple(dataclasses.replace(p, when=None) for p in self.params
                                             if p.when is None or flags[p.when]))

    def instances(self, kernel: str) -> list["KernelSignature"]:
        """The kernel's declaration under every assignment of its flags."""
        return [self.instance(kernel, dict(zip(self.flags, values)))
                for values in itertools.product((False, True), repeat=len(self.flags))]

    def render(self, kernel: str, values: dict) -> str:
        """``kernel(<parameters>)``, from ``values`` (every placeholder's type and every flag, nothing else), in
        lines of at most LINE_WIDTH columns (the closing ``) {`` counted), continuation lines under the first
        parameter."""
        if not self.matches(kernel):
            raise SignatureError(f"kernel {kernel} does not match its declaration's name {self.name}")
        wanted = set(self.placeholders) | set(self.flags)
        missing, extra = sorted(wanted - set(values)), sorted(set(values) - wanted)
        if missing or extra:
            raise SignatureError(f"kernel {kernel}: " + "; ".join(
                ([f"no value for {', '.join(missing)}"] if missing else []) +
                ([f"{', '.join(extra)} is neither a type placeholder nor a flag of its declaration"] if extra else [])))
        decl = self.instance(kernel, {f: bool(values[f]) for f in self.flags})
        parts = [p.c_declaration(values) for p in decl.params]
        lines, line = [], f"{kernel}("
        indent = " " * len(line)
        for i, part in enumerate(parts):
            text = part + ("," if i < len(parts) - 1 else ") {")
            if line.strip() and not line.endswith("(") and len(line) + 1 + len(text) > LINE_WIDTH:
                lines.append(line)
                line = indent + text
            else:
                line += ("" if line.endswith("(") else " ") + text
        if not parts:
            line += ") {"
        lines.append(line)
        return "\n".join(lines)[: -len(" {")]

    def check_source(self, kernel: str, source_names: tuple[str, ...]) -> "KernelSignature":
        """The instance of this declaration whose parameter names are ``source_names`` (the kernel's parameters as a
        rendered source declares them); a SignatureError if none is."""
        for inst in self.instances(kernel):
            if tuple(p.name for p in inst.params) == tuple(source_names):
                return inst
        raise SignatureError(f"kernel {kernel}: the source declares the parameters ({', '.join(source_names)}), "
                             f"which no instance of its declaration {self.name} has "
                             f"({'; '.join(', '.join(p.name for p in i.params) for i in self.instances(kernel))})")


def find(signatures, kernel: str) -> KernelSignature | None:
    """The one declaration among ``signatures`` whose name matches ``kernel`` (None if none does)."""
    found = [s for s in signatures if s.matches(kernel)]
    if len(found) > 1:
        raise SignatureError(f"kernel {kernel} matches more than one declaration: {', '.join(s.name for s in found)}")
    return found[0] if found else None


_KERNEL = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s*)?'
                     r'(?:__cluster_dims__\([^)]*\)\s*)?(?:__attribute__\(\(\w+\([^)]*\)\)\)\s*)*(\w+)\s*\(([^)]*)\)')


def source_parameters(source: str) -> dict[str, tuple[str, ...]]:
    """{kernel: its parameters' declarations} of the ``extern "C" __global__`` kernels of a CUDA / HIP source."""
    return {m.group(1): tuple(p.strip() for p in m.group(2).split(",") if p.strip())
            for m in _KERNEL.finditer(source)}


def parameter_name(declaration: str) -> str:
    """The name a C parameter declaration (``const float* __restrict__ x``) declares."""
    return re.findall(r"\w+", declaration)[-1]


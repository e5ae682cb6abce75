"""``lucegen build --target NAME | --all [--out DIR] [--check] [--jobs N]``: render every kernel family for each
target (and each model shape a shape-dependent family declares), compile it (NVRTC → cubin, clang → AMDGPU code
object, through the cache), report each kernel's resources and write the sources into DIR/<target>/ (layout:
lucegen.codegen; default: generated/ in a source checkout; an installed lucegen, which has no generated/, writes
nothing without --out). ``--check`` renders in memory only and fails (exit 1) if the sources there are stale; it
writes and deletes nothing.

Order of work, so that a bad input writes nothing: load every descriptor, render every family, compile everything,
and only then write the generated files (atomically, only those that changed) and remove sources that no family
produces any more.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from .. import PACKAGE_DIR, codegen, source_checkout
from ..atomic import atomic_write
from ..compile import CompiledModule
from ..errors import LucegenError
from ..families.base import KernelFamily
from ..target import Target, list_targets, load_target

SOURCE_SUFFIXES = (".cu", ".hip")
log = logging.getLogger("lucegen")


def register(subparsers) -> None:
    p = subparsers.add_parser("build", help="render and compile every kernel for one or all targets",
                              description=__doc__.split("\n\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--target", action="append", metavar="NAME", help="target name or .toml path (repeatable)")
    which.add_argument("--all", action="store_true", help="every descriptor (`lucegen targets` lists them)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="write the sources into DIR/<target>/ (default: generated/ of a source checkout; none from an "
                        "installed lucegen); sources there that no kernel family produces are removed")
    p.add_argument("--check", action="store_true",
                   help="only check that the sources (generated/, or --out) match the templates (exit 1 naming stale "
                        "files)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="compiler processes at once (default: CPU count)")
    p.add_argument("--quiet", action="store_true", help="print only the totals (no line per module, no table)")
    p.set_defaults(func=run)


@dataclass
class Unit:
    """One family rendered for one target and shape (a preset name; None: shape-free)."""

    target: Target
    family: KernelFamily
    shape: str | None
    source: str
    path: Path
    module: CompiledModule | None = None


def source_path(root: Path, target: Target, fam: KernelFamily, shape) -> Path:
    """Where a family's source for ``target`` and ``shape`` goes under ``root``: its place in generated/, moved to
    ``root``."""
    return root / codegen.generated_path(target, fam, shape).relative_to(codegen.GENERATED_DIR)


def render_units(targets: list[Target], root: Path | None = None) -> list[Unit]:
    """Every family for each target at each shape it declares (codegen.shapes), and for the target's quantised-target
    variant where that differs ([quant]): a family and shape whose render is the same for the variant (it does not
    read what [quant] changes) is written and compiled once. ``root`` is the directory the sources belong in (default
    generated/; --out)."""
    root = codegen.GENERATED_DIR if root is None else root
    units = []
    for t in targets:
        base = {}
        for fam in codegen.families(t):
            for shape in codegen.shapes(t, fam):
                base[fam.name, shape] = codegen.render_family(t, fam, shape)
                units.append(Unit(t, fam, shape, base[fam.name, shape], source_path(root, t, fam, shape)))
        q = t.quantised_target()
        if q is t:
            continue
        for fam in codegen.families(q):
            for shape in codegen.shapes(q, fam):
                source = codegen.render_family(q, fam, shape)
                if source != base.get((fam.name, shape)):
                    units.append(Unit(q, fam, shape, source, source_path(root, q, fam, shape)))
    return units


def orphans(targets: list[Target], units: list[Unit], root: Path) -> list[Path]:
    """Sources in root/<target>/ (and its variants' folders) that no family produces."""
    produced = {u.path for u in units}
    found = []
    for t in targets:
        directory = root / t.name
        if directory.is_dir():
            found += [p for p in sorted(directory.rglob("*")) if p.suffix in SOURCE_SUFFIXES and p not in produced]
    return found


def stale_files(targets: list[Target], units: list[Unit], root: Path) -> list[str]:
    stale = []
    for u in units:
        try:
            current = u.path.read_text(encoding="utf-8")
        except OSError:
            current = None
        if current != u.source:
            stale.append(f"{_rel(u.path, root)} ({'missing' if current is None else 'differs from its template'})")
    stale += [f"{_rel(p, root)} (no kernel family produces it)" for p in orphans(targets, units, root)]
    return stale


def _rel(path: Path, root: Path) -> str:
    """``path`` from the directory holding ``root`` (generated/sm_86/...)."""
    try:
        return str(path.relative_to(root.parent))
    except ValueError:
        return str(path)


def output_root(out: Path | None, check: bool) -> Path | None:
    """Where the sources go: --out, else generated/ in a source checkout, else nowhere (None: an installed lucegen
    never writes into its own package directory)."""
    if out is not None:
        return out
    if source_checkout() is not None:
        return codegen.GENERATED_DIR
    if check:
        raise LucegenError("--check compares generated/ of a source checkout, and this lucegen is installed "
                           f"({PACKAGE_DIR}): run it from a checkout, or pass --out DIR to check sources written "
                           "there")
    return None


def _compile(target: Target, family: str, source: str) -> CompiledModule:
    """One unit's compile, in a worker process (a family travels by name: its functions do not pickle)."""
    return codegen.compile_family(target, codegen.family(family), source)


def compile_units(units: list[Unit], jobs: int, progress) -> None:
    """Compile every unit, over ``jobs`` worker processes (threads did not overlap NVRTC compiles: two threads
    compiling prefill_gemm used one core's time); ``progress(unit, done)`` after each unit, ``done`` counting the
    units finished so far."""
    if jobs <= 1 or len(units) <= 1:
        for i, u in enumerate(units):
            u.module = codegen.compile_family(u.target, u.family, u.source)
            progress(u, i + 1)
        return
    import multiprocessing

    # spawn: a worker starts clean of whatever the parent loaded (a forked CUDA or NVRTC state is undefined)
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(units)), mp_context=multiprocessing.get_context("spawn"))
    try:
        pending = {pool.submit(_compile, u.target, u.family.name, u.source): u for u in units}
        for done, future in enumerate(as_completed(pending), 1):
            u = pending[future]
            u.module = future.result()
            progress(u, done)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def report(units: list[Unit]) -> str:
    header = ("target", "shape", "module", "kernel", "regs", "spills", "smem", "code")
    rows = [header]
    for u in units:
        for k in u.module.kernels:
            where = "/".join(filter(None, (u.target.name, u.target.variant)))  # sm_90, sm_90/quant
            rows.append((where, u.shape or "-", u.family.name, k.name, str(k.registers), str(k.spills),
                         str(k.shared_bytes), str(k.code_bytes)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i >= 4 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run(args) -> int:
    start = time.perf_counter()
    names = list_targets() if args.all else args.target
    targets = [load_target(n) for n in names]  # every descriptor validated before anything else happens
    root = output_root(args.out, args.check)
    units = render_units(targets, root)

    if args.check:
        stale = stale_files(targets, units, root)
        label = "generated/" if args.out is None else f"{root}/"
        if stale:
            fix = "run `lucegen build --all` and commit the result" if args.out is None else "build again with --out"
            print(f"lucegen: {label} is stale; {fix}:", file=sys.stderr)
            for line in stale:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"{label} is up to date for {len(targets)} target(s), {len(units)} source(s) "
              f"({time.perf_counter() - start:.2f} s)")
        return 0

    def progress(u: Unit, done: int) -> None:
        if not args.quiet:
            where = "/".join(filter(None, (u.target.name, u.target.variant, u.shape)))
            how = "cached" if u.module.cached else "compiled"
            log.info("[%d/%d] %s %s %s (%.1f s)", done, len(units), where, u.family.name, how,
                     time.perf_counter() - start)

    compile_units(units, max(1, args.jobs), progress)

    written, removed = 0, []
    if root is not None:
        for u in units:
            try:
                unchanged = u.path.read_text(encoding="utf-8") == u.source
            except OSError:
                unchanged = False
            if not unchanged:
                atomic_write(u.path, u.source.encode())
                written += 1
        removed = orphans(targets, units, root)
        for path in removed:
            path.unlink()

    if not args.quiet:
        print(report(units))
    kernels = [k for u in units for k in u.module.kernels]
    hits = sum(u.module.cached for u in units)
    print(f"total: {len(targets)} target(s), {len(units)} module(s), {len(kernels)} kernel(s), "
          f"{sum(k.code_bytes for k in kernels)} code bytes, {sum(k.spills for k in kernels)} spill bytes; "
          f"{hits} cached, {len(units) - hits} compiled; "
          + (f"{written} file(s) written to {root}" if root is not None else "no sources written")
          + (f", {len(removed)} removed" if removed else "")
          + f"; {time.perf_counter() - start:.2f} s")
    if root is None:
        print("(an installed lucegen has no generated/: pass --out DIR to write the rendered sources to DIR/<target>/)")
    return 0

"""Which kernels' machine code a change moves: every kernel of the given families compiled from two source trees, by
the same NVRTC, its SASS compared instruction for instruction (branch targets ignored).

A change that leaves a kernel's source paths alone can still move its schedule (measured on the H100: a helper moved
out of m1q's loop left its SASS unchanged under NVRTC 13.5 and cost the decode step 4% under the device's 13.0).
``--nvrtc-lib`` compiles with another NVRTC than the installed one: the directory of a
``nvidia-cuda-nvrtc`` wheel's ``nvidia/cu13/lib`` (e.g. ``pip download --no-deps "nvidia-cuda-nvrtc==13.0.*"``, then
unzip it), whose libraries are loaded before cuda-python opens its own. The SASS comes from ``cuobjdump``
(``--cuobjdump``, else the one on PATH or in an installed ``nvidia-cuda-cuobjdump`` wheel). Each tree compiles in a
process of its own, with the tree first on its path, outside any cache (``use_cache=False``).

    python -m lucegen.devtools.sass_diff OLD_TREE NEW_TREE [--target sm_90] [--quantised]
                                         [--families quant_gemm tree_verify] [--shape qwen3.5-0.8b]
                                         [--nvrtc-lib DIR] [--cuobjdump PATH]

A shape-dependent family compiles for ``--shape`` (a model or draft preset), by default the first shape
``lucegen build`` renders it for on that target; a tree from before families took shapes renders its own default.

A tree is a directory holding the ``lucegen`` package (and, at revisions that kept them outside it, ``templates`` and
``targets``): ``git archive REV | tar -x -C DIR``. Prints, per family, the kernels whose SASS differs (with their
instruction counts) and those only one tree has; exits 1 where any differs. The per-tree processes run this file as
a script, so a tree from before lucegen.devtools existed compiles too.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def preload_nvrtc(lib_dir: str) -> None:
    """Load the NVRTC libraries of ``lib_dir`` (builtins first) so that cuda-python's later dlopen by soname finds
    them."""
    libs = sorted(glob.glob(os.path.join(lib_dir, "libnvrtc*.so*")))
    if not any(os.path.basename(p).startswith("libnvrtc.so") for p in libs):
        sys.exit(f"--nvrtc-lib {lib_dir}: no libnvrtc.so* there")
    for path in [p for p in libs if "builtins" in p] + [p for p in libs if "builtins" not in p]:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def compile_tree(out_dir: str, target_name: str, quantised: bool, names: list[str], shape: str | None = None) -> dict:
    """(In the tree's own process.) Each family's cubin into ``out_dir``; returns {family: cubin path} and the
    compiler's id."""
    from lucegen import codegen
    from lucegen.compile import compile_source, nvrtc
    from lucegen.target import load_target

    target = load_target(target_name)
    if quantised:
        target = target.quantised_target()
    made = {}
    for name in names:
        fam = codegen.family(name)
        if not fam.applies(target):
            continue
        if hasattr(codegen, "shapes"):  # a tree whose families render for a shape
            declared = [s for s in codegen.shapes(target, fam) + fam.shapes + fam.quantised_shapes if s]
            source = codegen.render_family(target, fam, (shape or declared[0]) if declared else None)
        else:
            source = codegen.render_family(target, fam)
        module = compile_source(target, fam.name, source, template=fam.template, options=tuple(fam.options(target)),
                                arch=fam.arch(target), use_cache=False)
        path = os.path.join(out_dir, f"{name}.cubin")
        with open(path, "wb") as f:
            f.write(module.binary)
        made[name] = path
    return {"compiler": nvrtc.compiler_id(), "cubins": made}


def find_cuobjdump(given: str | None) -> str:
    if given:
        return given
    found = shutil.which("cuobjdump")
    if found:
        return found
    for base in sys.path:  # a wheel's: site-packages/nvidia/cu<N>/bin
        for path in sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "bin", "cuobjdump")), reverse=True):
            return path
    sys.exit("no cuobjdump: pass --cuobjdump (the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels, in "
             "lucegen's dev extra, have it and the nvdisasm it runs)")


def kernels_sass(cuobjdump: str, cubin: str) -> dict[str, list[str]]:
    """{kernel: its instructions} of a cubin, by ``cuobjdump -sass`` (which runs nvdisasm: the one on PATH, else the
    one beside it, as the nvidia-cuda-nvdisasm wheel installs it)."""
    path = os.pathsep.join(filter(None, (os.environ.get("PATH"), os.path.dirname(os.path.abspath(cuobjdump)))))
    run = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, env=dict(os.environ, PATH=path))
    if run.returncode:
        sys.exit(f"{cuobjdump} -sass {cubin} failed: {run.stderr.strip()}")
    return parse_sass(run.stdout)


def parse_sass(text: str) -> dict[str, list[str]]:
    """{kernel: its instructions} of cuobjdump's listing, without addresses and with branch targets blanked."""
    kernels: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        head = re.search(r"Function : (\S+)", line)
        if head:
            name = head.group(1)
            kernels[name] = []
            continue
        ins = re.search(r"/\*[0-9a-f]{4,}\*/\s*(.*?);", line)
        if name is not None and ins:
            text_ins = ins.group(1).strip()
            kernels[name].append(re.sub(r"0x[0-9a-f]+", "X", text_ins) if "BRA" in text_ins else text_ins)
    return kernels


def compare(old: dict[str, dict[str, list[str]]], new: dict[str, dict[str, list[str]]],
            families: list[str]) -> tuple[list[str], bool]:
    """The report lines for two trees' {family: {kernel: instructions}}, and whether any kernel differs or exists in
    one tree alone."""
    lines, differs = [], False
    for fam in families:
        a, b = old.get(fam, {}), new.get(fam, {})
        changed = [k for k in sorted(set(a) & set(b)) if a[k] != b[k]]
        only_old, only_new = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        differs |= bool(changed or only_old or only_new)
        lines.append(f"{fam}: {len(set(a) & set(b))} kernels in both, {len(changed)} differ")
        lines += [f"  differs  {k}: {len(a[k])} -> {len(b[k])} instructions" for k in changed]
        lines += [f"  old only {k}" for k in only_old]
        lines += [f"  new only {k}" for k in only_new]
    return lines, differs


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lucegen.devtools.sass_diff", description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="the older source tree (a directory holding the lucegen package)")
    ap.add_argument("new", help="the newer source tree")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--quantised", action="store_true", help="the target's quantised-GGUF variant")
    ap.add_argument("--families", nargs="+", default=["quant_gemm"])
    ap.add_argument("--shape", help="the model or draft preset of shape-dependent families (default: lucegen build's)")
    ap.add_argument("--nvrtc-lib", help="a directory of another NVRTC's libraries (nvidia/cu13/lib of its wheel)")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--compile-into", help=argparse.SUPPRESS)  # the per-tree child process
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.compile_into:
        if args.nvrtc_lib:
            preload_nvrtc(args.nvrtc_lib)
        print(json.dumps(compile_tree(args.compile_into, args.target, args.quantised, args.families, args.shape)))
        return 0
    cuobjdump = find_cuobjdump(args.cuobjdump)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for side, tree in (("old", args.old), ("new", args.new)):
            tree = os.path.abspath(tree)
            if not os.path.isdir(os.path.join(tree, "lucegen")):
                sys.exit(f"{tree}: no lucegen package there")
            out = os.path.join(tmp, side)
            os.makedirs(out)
            cmd = [sys.executable, os.path.abspath(__file__), args.old, args.new, "--target", args.target,
                   "--families", *args.families, "--compile-into", out]
            cmd += ["--quantised"] if args.quantised else []
            cmd += ["--shape", args.shape] if args.shape else []
            cmd += ["--nvrtc-lib", args.nvrtc_lib] if args.nvrtc_lib else []
            path = os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
            run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path),
                                 cwd=tmp)  # cwd: no tree shadows
            if run.returncode:
                sys.exit(f"compiling {tree} failed:\n{run.stderr[-4000:]}")
            results[side] = json.loads(run.stdout.strip().splitlines()[-1])
            results[side]["sass"] = {fam: kernels_sass(cuobjdump, path)
                                     for fam, path in results[side]["cubins"].items()}
    print(f"{args.target}{' (quantised)' if args.quantised else ''}: old {results['old']['compiler']}, "
          f"new {results['new']['compiler']}")
    lines, differs = compare(results["old"]["sass"], results["new"]["sass"], args.families)
    print("\n".join(lines))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())

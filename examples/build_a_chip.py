"""Build one chip: render every kernel family from the chip's descriptor, compile it, print the kernel table.

This is what `lucegen build --target CHIP` does, through the Python API. Run it on any machine; no GPU is needed
(NVIDIA chips compile with NVRTC from the nvidia-* wheels, AMD chips with clang-19):

    python examples/build_a_chip.py              # sm_86, the RTX 3090
    python examples/build_a_chip.py sm_90 --out /tmp/sm_90-sources

Compiles are cached by content under $LUCEGEN_CACHE_DIR (default ~/.cache/lucegen), so a second run is quick.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lucegen import codegen
from lucegen.target import load_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chip", nargs="?", default="sm_86", help="a descriptor name or a .toml path")
    parser.add_argument("--out", type=Path, help="also write the rendered sources to this directory")
    args = parser.parse_args()

    target = load_target(args.chip)  # validated: a bad field is one error naming the file and the field
    print(f"{target.name}: {target.description}, {target.arch}, {target.compute_units} compute units")
    print(f"{'kernel':<40} {'family':<16} {'regs':>5} {'spills':>7} {'smem':>7} {'code':>8}")
    kernels = 0
    for family in codegen.families(target):
        for shape in codegen.shapes(target, family):  # the model shapes a shape-dependent family renders for
            source = codegen.render_family(target, family, shape)  # the template with the chip's parameters
            if args.out:
                name = f"{family.name}{target.source_suffix}" if shape is None else \
                    f"{shape}/{family.name}{target.source_suffix}"
                (args.out / name).parent.mkdir(parents=True, exist_ok=True)
                (args.out / name).write_text(source)
            module = codegen.compile_family(target, family, source)  # NVRTC or clang, through the cache
            for k in module.kernels:
                print(f"{k.name:<40} {family.name:<16} {k.registers:>5} {k.spills:>7} {k.shared_bytes:>7} "
                      f"{k.code_bytes:>8}")
                kernels += 1
    print(f"{kernels} kernels compiled for {target.name}")


if __name__ == "__main__":
    main()

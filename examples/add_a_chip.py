"""Add a chip: copy a similar chip's descriptor with the new chip's figures into a user directory, then load it and
build it.

User descriptors live in $LUCEGEN_TARGETS_PATH (default ~/.config/lucegen/targets), and `lucegen new-target NAME
--like CHIP` starts one there. This script does the same by hand, in a temporary directory that it removes when it
is done. The new chip is the RTX 4080 (76 SMs, 716.8 GB/s, 64 MB L2, 16 GB), started from sm_89, the RTX 4090 of
the same Ada architecture:

    python examples/add_a_chip.py                               # build every kernel family for it
    python examples/add_a_chip.py --families small_kernels      # or only some

A descriptor that states something impossible is refused before anything is rendered; the script shows one.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

from lucegen import codegen
from lucegen.errors import DescriptorError
from lucegen.target import load_target

#: The RTX 4080's published figures (NVIDIA Ada GPU architecture whitepaper); everything else is as on the 4090.
RTX_4080 = {
    "name": '"rtx4080"',
    "description": '"NVIDIA GeForce RTX 4080 (Ada Lovelace)"',
    "compute_units": "76",
    "mem_bandwidth_gbs": "716.8",
    "l2_bytes": str(64 * 2**20),
    "memory_bytes": str(16 * 2**30),
    "peak_tflops": "97.5",
}


def with_fields(text: str, fields: dict[str, str]) -> str:
    """The descriptor text with each field's value replaced, its comment kept."""
    for key, value in fields.items():
        text, count = re.subn(rf"(?m)^({re.escape(key)}\s*=\s*)[^#\n]*?(\s*(#.*)?)$", rf"\g<1>{value}\g<2>", text,
                              count=1)
        if count != 1:
            raise SystemExit(f"no field {key!r} in the source descriptor")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="*", help="kernel families to build (default: all)")
    args = parser.parse_args()

    like = load_target("sm_89")
    text = with_fields(Path(like.path).read_text(), RTX_4080)
    with tempfile.TemporaryDirectory() as user_dir:
        os.environ["LUCEGEN_TARGETS_PATH"] = user_dir  # where lucegen looks for user descriptors
        path = Path(user_dir) / "rtx4080.toml"
        path.write_text(text)
        chip = load_target(path)
        print(f"{chip.name}: {chip.description}, {chip.arch}, {chip.compute_units} SMs, "
              f"{chip.mem_bandwidth_gbs:g} GB/s, megakernel grid {chip.megakernel.blocks} x {chip.megakernel.threads}")

        broken = Path(user_dir) / "broken.toml"
        broken.write_text(with_fields(text, {"name": '"broken"', "max_threads_per_block": "4096"}))
        try:
            load_target(broken)
        except DescriptorError as exc:
            print(f"refused as it should be: {exc}")
        else:
            raise SystemExit("a 4096-thread block limit was accepted")

        families = [f for f in codegen.families(chip) if not args.families or f.name in args.families]
        kernels = 0
        for family in families:
            for shape in codegen.shapes(chip, family):  # a shape-dependent family renders for its model shapes
                module = codegen.build(chip, family, shape)  # rendered for this descriptor, compiled by NVRTC
                kernels += len(module.kernels)
                worst = max(module.kernels, key=lambda k: k.registers)
                print(f"  {family.name:<16} {len(module.kernels):>3} kernels, most registers: {worst.name} "
                      f"({worst.registers}, {worst.spills} bytes spilled)")
        print(f"built {kernels} kernels in {len(families)} families for {chip.name}")


if __name__ == "__main__":
    main()

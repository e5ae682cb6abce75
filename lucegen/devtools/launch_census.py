"""Every launch of one verify pass of the quantised target (one slot: an AR step), recorded on the host device
(lucegen/runtime/host_device.py), with how its grid fills the chip: resident blocks per SM from the compiled
kernel's registers, shared memory and threads, waves = blocks / (resident per SM x SMs), and the fill of its last
wave. For the quantised GEMM launches also the weight bytes each reads, so the table says which share of a step's
bytes streams through grids whose last wave leaves the chip part idle. An estimate: it treats every block of a launch
as equally long and every SM as equal; the device decides.

    python -m lucegen.devtools.launch_census MODEL.gguf [--slots 1] [--target sm_90]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict

import numpy as np

from lucegen.model.quant import TYPES
from lucegen.runtime import ddtree
from lucegen.runtime.device import ByValue
from lucegen.runtime.host_device import HostDevice
from lucegen.runtime.quant_gemm import GEMM_TYPES, SEGMENT_DTYPE
from lucegen.runtime.quant_target import open_target
from lucegen.runtime.tree_verify import TreeVerifier
from lucegen.target import load_target


def is_gemm(args) -> bool:
    """A quantised GEMM's launch (not the module's quantiser or magnitude kernels): its first argument is the
    by-value segment table."""
    return bool(args) and isinstance(args[0], ByValue)


def gemm_bytes(args) -> int:
    """Weight bytes a quant_gemm launch reads: its segment table (argument 0) and K (argument 5)."""
    table = np.frombuffer(args[0].raw, SEGMENT_DTYPE)[: int(args[1])]
    K = int(args[5])
    return sum(int(s["rows"]) * K // TYPES[GEMM_TYPES[int(s["type"])]][1] * TYPES[GEMM_TYPES[int(s["type"])]][2]
               for s in table)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lucegen.devtools.launch_census", description=__doc__.splitlines()[0])
    p.add_argument("model", help="the quantised target (a GGUF file)")
    p.add_argument("--slots", type=int, default=1, help="verify slots (1: an AR step)")
    p.add_argument("--target", default="sm_90", help="the descriptor whose host device records the launches")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.slots < 1:
        p.error(f"--slots must be at least 1, got {args.slots}")
    target = load_target(args.target)
    dev = HostDevice(target)
    dec = open_target(args.model, max_context=256, device=dev)
    ver = TreeVerifier(dec, budget=max(1, args.slots - 1), graphs=False)

    dev.launches.clear()
    ver.verify(ddtree.chain(np.arange(args.slots - 1, dtype=np.int64) % dec.config.vocab_size), 0)

    rows = defaultdict(lambda: {"launches": 0, "blocks": 0, "bytes": 0, "wave_bytes": 0.0, "fills": []})
    for _name, grid, block, smem, fn, fargs in dev.launches:
        blocks, threads = int(np.prod(grid)), int(np.prod(block))
        per_cu = max(1, fn.max_active_blocks_per_cu(threads, smem))
        waves = blocks / (per_cu * target.compute_units)
        # a GEMM's rows by its grid (one row per matrix shape); other kernels by name
        gemm = is_gemm(fargs)
        r = rows[f"{fn.name} x{blocks}" if gemm else fn.name]
        r["launches"] += 1
        r["blocks"] += blocks
        r["fills"].append(waves / math.ceil(waves))
        r["per_cu"] = per_cu
        if gemm:
            nbytes = gemm_bytes(fargs)
            r["bytes"] += nbytes
            r["wave_bytes"] += nbytes * math.ceil(waves) / waves  # as long as whole waves at the same pace
    total = sum(r["bytes"] for r in rows.values())
    print(f"{args.model}: one verify pass of {args.slots} slot(s) on {target.name} ({target.compute_units} SMs): "
          f"{len(dev.launches)} launches, {total / 1e9:.2f} GB of GEMM weights")
    print(f"{'kernel (x blocks)':<26} {'launches':>8} {'blocks/launch':>13} {'per SM':>6} {'last-wave fill':>15} "
          f"{'GB':>7} {'GB in whole waves':>17}")
    for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["bytes"]):
        fills = r["fills"]
        print(f"{name:<26} {r['launches']:>8} {r['blocks'] / r['launches']:>13.0f} {r['per_cu']:>6} "
              f"{min(fills):>7.2f}-{max(fills):<7.2f} {r['bytes'] / 1e9:>7.2f} {r['wave_bytes'] / 1e9:>17.2f}")
    whole = sum(r["wave_bytes"] for r in rows.values())
    print(f"if every wave of a GEMM took as long as a full one: {whole / 1e9:.2f} GB-equivalents for "
          f"{total / 1e9:.2f} GB, {100 * (whole / max(1, total) - 1):.0f}% over a chip filled to the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a target's decode step and verify pass go, per kernel (torch's CUPTI profiler sees every launch of the
captured graphs). ``--timeline`` also prints one decode step's and one verify pass's kernels in order: time, the gap
before each (negative where a programmatic launch overlaps its predecessor), grid and registers; then per kernel its
launches, their time and their share of the step (each launch's end minus the one before's, summed).

    python -m lucegen.devtools.target_profile MODEL [--steps 8] [--slots 23] [--budget 64] [--timeline]
                                              [--tensor-core-keys N] [--no-programmatic]

``--budget`` sizes the verifier for that tree budget (default: slots - 1), as an engine built for a larger tree.
``--tensor-core-keys`` is the verifier's bound for tree_attention_mma (default: the descriptor's).
``--no-programmatic`` renders and launches every kernel without programmatic dependent launch: a kernel so launched
starts while its predecessor runs and the profiler counts its wait as its own time, so per-kernel times are taken
without it (the step's own time is not).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

import numpy as np


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lucegen.devtools.target_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="the target: a BF16 checkpoint directory or a GGUF (quantised)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--slots", type=int, default=23)
    ap.add_argument("--budget", type=int, help="the verifier's tree budget (default: slots - 1)")
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--tensor-core-keys", type=int, default=None, help="slots of this many keys or more attend on "
                    "tensor cores (default: the descriptor's bound)")
    ap.add_argument("--no-programmatic", action="store_true",
                    help="no programmatic dependent launch (per-kernel times)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.steps < 1 or args.slots < 1:
        ap.error(f"--steps and --slots must be at least 1, got {args.steps} and {args.slots}")
    import torch  # the CUPTI profiler; imported here, so that the tool's --help needs no torch
    from torch.profiler import ProfilerActivity, profile

    from lucegen.runtime import ddtree
    from lucegen.runtime.device import Device
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import open_target
    from lucegen.runtime.tree_verify import TreeVerifier

    torch.cuda.init()
    dev = Device.open()
    if args.no_programmatic:
        t = dev.target
        dev.target = dataclasses.replace(t, features=dataclasses.replace(t.features, programmatic_launch=False))
    dec = open_target(args.model, max_context=512, device=dev)
    ver = TreeVerifier(dec, budget=args.budget if args.budget is not None else args.slots - 1,
                       tensor_core_keys=args.tensor_core_keys)
    Prefiller(dec).prefill(np.arange(32) + 100)
    ver.decode(4)
    for name, run in (("decode step", lambda: ver.decode(args.steps + 1)),
                      (f"verify pass of {args.slots} slots",
                       lambda: ver.verify(ddtree.chain(np.arange(args.slots - 1) + 7), dec.next_token))):
        run()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
        print(name)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18))
        if args.timeline:
            timeline(prof, args.steps if name == "decode step" else 1)
    return 0


def timeline(prof, steps: int) -> None:
    """The kernels of the middle step of ``steps`` profiled steps, in order, the mean step time, and per kernel name
    the launches' time and their share of the step (each launch's end minus the one before's, summed)."""
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = sorted((e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    per_step = len(events) // steps
    span = (events[-1]["ts"] + events[-1]["dur"] - events[0]["ts"]) / steps
    print(f"{per_step} kernels per step, step {span:.1f} us (kernel times add up to "
          f"{sum(e['dur'] for e in events) / steps:.1f} us)")
    prev_end = None
    kinds: dict[str, list[float]] = {}
    for e in events[per_step * (steps // 2): per_step * (steps // 2 + 1)]:
        a = e.get("args", {})
        gap = 0.0 if prev_end is None else e["ts"] - prev_end
        print(f"{e['dur']:8.1f} {gap:6.1f}  {e['name'][:40]:40} grid={a.get('grid')} "
              f"regs={a.get('registers per thread')}")
        end = e["ts"] + e["dur"]
        kind = kinds.setdefault(e["name"][:40], [0, 0.0, 0.0])
        kind[0] += 1
        kind[1] += e["dur"]
        kind[2] += end - (e["ts"] if prev_end is None else prev_end)
        prev_end = end
    print(f"{'kernel':40} {'launches':>8} {'time us':>9} {'in the step us':>15}")
    for name, (n, dur, share) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
        print(f"{name:40} {n:>8} {dur:>9.1f} {share:>15.1f}")


if __name__ == "__main__":
    sys.exit(main())

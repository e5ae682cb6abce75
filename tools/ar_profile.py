"""Where a plain greedy step of a (quantised) target goes, kernel by kernel: torch's CUPTI profiler records every
launch of the captured decode graph; this prints one step's kernels in order with their time and the idle gap
before each, then totals per kernel name.

    python3 tools/ar_profile.py MODEL [--steps 16] [--trace OUT.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--trace")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import open_target
    from lucegen.runtime.tree_verify import TreeVerifier

    torch.cuda.init()
    dec = open_target(args.model, max_context=512)
    ver = TreeVerifier(dec, budget=1)
    Prefiller(dec).prefill(np.arange(32) + 100)
    ver.decode(8)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        ver.decode(args.steps + 1)
    path = args.trace or os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
    events.sort(key=lambda e: e["ts"])
    names = [e["name"] for e in events]
    per_step = len(events) // args.steps
    first = names.index(names[0])
    span = (events[-1]["ts"] + events[-1]["dur"] - events[first]["ts"]) / args.steps
    busy = sum(e["dur"] for e in events) / args.steps
    print(f"{len(events)} kernels, {per_step} per step; step {span:.1f} us, kernels busy {busy:.1f} us, "
          f"idle {span - busy:.1f} us")
    step = events[per_step * (args.steps // 2): per_step * (args.steps // 2 + 1)]
    prev_end = None
    for e in step:
        gap = 0.0 if prev_end is None else e["ts"] - prev_end
        a = e.get("args", {})
        print(f"{e['dur']:8.1f} {gap:6.1f}  {e['name'][:40]:40} grid={a.get('grid')} block={a.get('block')} "
              f"regs={a.get('registers per thread')}")
        prev_end = e["ts"] + e["dur"]
    by = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        by[e["name"]][0] += 1
        by[e["name"]][1] += e["dur"]
    print("per kernel name (per step): count, us")
    for name, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name[:50]:50} {n / args.steps:6.1f} {t / args.steps:9.1f}")


if __name__ == "__main__":
    main()

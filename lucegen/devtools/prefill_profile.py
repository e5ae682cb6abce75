"""Where one graph-launched prefill spends its time, kernel by kernel (device tool, needs torch for CUPTI):

    python -m lucegen.devtools.prefill_profile MODEL_DIR [T ...]

Prints, per T: the graph time (CUDA events, median of 10), then per kernel name the launches and µs per prefill
from torch.profiler's CUPTI trace of 3 graph launches, and the idle gaps between consecutive kernels.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

import numpy as np


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lucegen.devtools.prefill_profile",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a BF16 checkpoint directory")
    ap.add_argument("tokens", nargs="*", type=int, default=[520], help="prompt lengths T (default 520)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if min(args.tokens) < 1:
        ap.error(f"every prompt length must be at least 1, got {args.tokens}")
    import torch  # the CUPTI profiler; imported here, so that the tool's --help needs no torch
    from torch.profiler import ProfilerActivity, profile

    from lucegen.bench.prefill import time_prefill_graph
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.runtime.prefill.runner import Prefiller

    dec = MegakernelDecoder(args.model, max_context=max(args.tokens) + 1)
    pre = Prefiller(dec)
    dev = dec.device
    rng = np.random.default_rng(0)
    start, end = dev.event(), dev.event()
    for T in args.tokens:
        prompt = rng.integers(0, dec.config.vocab_size, T).astype(np.int32)
        dec.reset()
        pre.prefill(prompt)
        times = time_prefill_graph(dec, pre, prompt, 10, (start, end))
        reps = 3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                dec.reset()
                n = pre.stage(prompt)
                pre.launch(n)
                dev.synchronize()
        events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                         and "memset" not in e.name.lower() and "memcpy" not in e.name.lower()),
                        key=lambda e: e.time_range.start)
        per_name = defaultdict(lambda: [0, 0.0])
        busy, gaps, prev_end = 0.0, [], None
        for e in events:
            dur = e.time_range.end - e.time_range.start
            per_name[e.name][0] += 1
            per_name[e.name][1] += dur
            busy += dur
            if prev_end is not None and 0 <= e.time_range.start - prev_end < 50:
                gaps.append(e.time_range.start - prev_end)
            prev_end = e.time_range.end
        ms = statistics.median(times)
        print(f"\n=== T={T}: graph {ms * 1e3:.0f} µs ({T / ms * 1e3:,.0f} tok/s); kernels/prefill "
              f"{len(events) / reps:.0f}, busy {busy / reps:.0f} µs, gaps {sum(gaps) / reps:.0f} µs (median gap "
              f"{statistics.median(gaps):.2f} µs)")
        for name, (count, total) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
            print(f"{total / reps:9.1f} µs  {count / reps:5.0f}x  {total / count:7.2f} µs/launch  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where one graph-launched prefill spends its time, kernel by kernel (device tool, needs torch for CUPTI):

    python3 tools/prefill_profile.py MODEL_DIR [T ...]

Prints, per T: the graph time (CUDA events, median of 10), then per kernel name the launches and µs per prefill
from torch.profiler's CUPTI trace of 3 graph launches, and the idle gaps between consecutive kernels.
"""
import statistics
import sys
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from lucegen.bench.prefill import time_prefill_graph
from lucegen.runtime.megakernel import MegakernelDecoder
from lucegen.runtime.prefill.runner import Prefiller

model = sys.argv[1]
token_counts = [int(a) for a in sys.argv[2:]] or [520]
dec = MegakernelDecoder(model, max_context=max(token_counts) + 1)
pre = Prefiller(dec)
dev = dec.device
rng = np.random.default_rng(0)
start, end = dev.event(), dev.event()
for T in token_counts:
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
    print(f"\n=== T={T}: graph {ms * 1e3:.0f} µs ({T / ms * 1e3:,.0f} tok/s); kernels/prefill {len(events) / reps:.0f}, "
          f"busy {busy / reps:.0f} µs, gaps {sum(gaps) / reps:.0f} µs (median gap {statistics.median(gaps):.2f} µs)")
    for name, (count, total) in sorted(per_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{total / reps:9.1f} µs  {count / reps:5.0f}x  {total / count:7.2f} µs/launch  {name[:110]}")

"""Tuning sweep for the decode megakernel on the device: for each variant (template knobs and the descriptor's
megakernel shape), tg128 after a 32-token prompt, median of 5 launches, plus the per-phase profile (block 0, the
critical path of the grid, wait / staging / rest).
Usage: python experiments/mk_sweep.py MODEL_DIR '[{"name": "base"}, {"name": "rows4", "tuning": {"rows_a": 4}},
        {"name": "2x256", "megakernel": {"threads": 256, "blocks_per_cu": 2}}]'"""
import dataclasses
import json
import statistics
import sys

import numpy as np

from lucegen.bench.decode import profile_report
from lucegen.model.checkpoint import load_checkpoint
from lucegen.runtime.device import Device
from lucegen.runtime.megakernel import MegakernelDecoder

model, variants = sys.argv[1], json.loads(sys.argv[2])
ckpt = load_checkpoint(model)
dev = Device.open()
prompt = np.random.default_rng(0).integers(0, ckpt.config.vocab_size, 32).astype(np.int32)
rows = []
for v in variants:
    t = dev.target
    if "megakernel" in v:
        mk = dataclasses.replace(t.megakernel, **v["megakernel"])
        mk = dataclasses.replace(mk, blocks=t.compute_units * mk.blocks_per_cu)
        t = dataclasses.replace(t, megakernel=mk)
    out = {"name": v["name"]}
    try:
        for profile in (False, True):
            dec = MegakernelDecoder(ckpt, device=dev, target=t, max_context=200, tuning=v.get("tuning"),
                                    profile=profile)
            dec.prefill(prompt)
            snap = dec.snapshot()
            first = dec.next_token
            times = []
            s, e = dev.event(), dev.event()
            for i in range(6 if not profile else 1):
                dec.restore(snap)
                s.record()
                dec.launch([first], 128)
                e.record()
                times.append(s.elapsed_ms(e))
                res = dec.collect()
            if profile:
                rep = profile_report(res.profile, [l.kind for l in dec.layout.layers])
                out["profile"] = {k: round(x, 1) for k, x in rep["profile_us_per_token"].items()}
                out["breakdown"] = rep["phase_breakdown_us_per_token"]
                out["critical"] = {k: (round(x, 1) if isinstance(x, float) else x)
                                   for k, x in rep["critical_path_us_per_token"].items()}
            else:
                out["tok_s"] = round(128 / (statistics.median(times[1:]) / 1e3), 1)
                out["regs"] = dec.compiled.kernels[0].registers
                out["tokens"] = [int(x) for x in res.tokens[:8]]
            for b in snap["buffers"].values():
                b.free()
            dec.close()
    except Exception as exc:  # report and go on with the next variant
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]
    print("SWEEP", json.dumps(out), flush=True)
    rows.append(out)
print(f"{'variant':14s} {'tok/s':>7s} {'regs':>4s}  profile (µs/token)")
for r in rows:
    prof = " ".join(f"{k}={v}" for k, v in r.get("profile", {}).items())
    print(f"{r['name']:14s} {r.get('tok_s', 0):7.1f} {r.get('regs', 0):4d}  {r.get('error', prof)}")
    if "critical" in r:
        print(" " * 28 + "critical path: " + " ".join(f"{k}={v}" for k, v in r["critical"].items()))
        print(" " * 28 + "wait/stage/rest: " + " ".join(f"{k}={v}" for k, v in r["breakdown"].items()))

"""The memory plan of the engine ``lucegen bench dflash --model M --draft D --kv-cache KV`` builds
(lucegen/bench/dflash.py bench_engine, its defaults), computed on the host device, to set beside the plan the bench
prints on a GPU (README "The memory plan").

    python experiments/plan_crosscheck.py MODEL.gguf DRAFT [--kv-cache q4_0] [--target sm_90]
"""

from __future__ import annotations

import argparse

from lucegen.bench.dflash import bench_engine
from lucegen.runtime.host_device import HostDevice
from lucegen.runtime.memory_plan import GIB, MemoryPlan
from lucegen.target import load_target


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("draft")
    p.add_argument("--kv-cache", default=None)
    p.add_argument("--target", default="sm_90")
    p.add_argument("--driver-gib", type=float, default=0.83)
    args = p.parse_args()
    dev = HostDevice(load_target(args.target), driver_bytes=int(args.driver_gib * GIB))
    dec, draft, _prefiller, verifier = bench_engine(args.model, draft=args.draft, kv_cache=args.kv_cache, device=dev)
    plan = MemoryPlan.of_engine(dec, verifier, draft)
    print(plan.format())
    print(f"fixed {plan.fixed} bytes; ledger {dev.allocated} bytes")


if __name__ == "__main__":
    main()

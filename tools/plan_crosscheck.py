"""The memory plan of the engine ``lucegen bench dflash --model M --draft D --kv-cache KV`` builds (its context,
draft rows and budgets: lucegen/bench/dflash.py), computed on the host device, to set beside the plan the bench
prints on a GPU (README "The memory plan").

    python3 tools/plan_crosscheck.py MODEL.gguf DRAFT [--kv-cache q4_0] [--target sm_90]
"""

from __future__ import annotations

import argparse

from lucegen.bench.dflash import ACCEPTANCE_LENGTHS, BUDGETS
from lucegen.runtime.draft import DFlashDrafter
from lucegen.runtime.host_device import HostDevice
from lucegen.runtime.memory_plan import GIB, MemoryPlan
from lucegen.runtime.prefill.runner import Prefiller
from lucegen.runtime.quant_target import open_target
from lucegen.runtime.tree_verify import TreeVerifier
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
    prompt_tokens, gen_tokens = 32, 128  # bench_dflash's defaults
    max_budget = max(max(BUDGETS), max(ACCEPTANCE_LENGTHS))
    dec = open_target(args.model, max_context=prompt_tokens + 2 * gen_tokens + max_budget + 2, device=dev,
                      kv_cache=args.kv_cache)
    draft = DFlashDrafter(dec, args.draft, k=8, rows=max(64, max_budget + 1))
    verifier = TreeVerifier(dec, budget=max_budget, draft=draft)
    Prefiller(dec, draft=draft)
    plan = MemoryPlan.of_engine(dec, verifier, draft)
    print(plan.format())
    print(f"fixed {plan.fixed} bytes; ledger {dev.allocated} bytes")


if __name__ == "__main__":
    main()

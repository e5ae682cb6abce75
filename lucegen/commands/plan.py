"""``lucegen plan --model DIR|FILE.gguf [--draft D]``: the memory plan of a speculative engine, without a GPU.

The engine is built as ``lucegen run --draft`` builds it, on the host device of a descriptor
(``lucegen/runtime/host_device.py``: the kernels compile, nothing runs, every allocation goes to a ledger), so
lucegen's own buffers are counted exactly as the allocation code asks for them. What a driver holds beside them
(context, modules, graphs) cannot be counted on a CPU: ``--driver-gib`` states it (default: the 0.83 GiB measured
on the H100 with the 27B engine). The table says which context fits on the chip of every descriptor in each KV
format (lucegen/runtime/memory_plan.py)."""

from __future__ import annotations

from pathlib import Path

from ..errors import LucegenError
from . import check_draft_ring
from ..model.kv_cache import FORMATS as KV_FORMATS

DRIVER_GIB = 0.83  # the driver's own memory beside lucegen's buffers, measured on the H100 with the 27B engine
                   # (docs/benchmarks.md, memory plans)


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="what fits where: an engine's memory plan, computed on the CPU",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="the target: HF checkpoint directory or .gguf file")
    p.add_argument("--draft", type=Path, default=None, help="DFlash draft (HF directory or .gguf)")
    p.add_argument("--target", default="sm_90", help="descriptor to build on (default sm_90); the table forecasts "
                   "every descriptor")
    p.add_argument("--kv-cache", choices=tuple(KV_FORMATS), default=None,
                   help="the quantised target's KV cache format (default: the descriptor's kv_cache_type)")
    p.add_argument("--budget", type=int, default=None, help="tree nodes per verify (default: the descriptor's)")
    p.add_argument("--draft-ring", type=int, default=None, help="the draft's context ring (default: the context)")
    p.add_argument("--context", type=int, default=4096, help="context to build at (the plan is linear in it)")
    p.add_argument("--driver-gib", type=float, default=DRIVER_GIB,
                   help=f"the driver's own memory beside lucegen's buffers (default {DRIVER_GIB}, the H100's)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..runtime.draft import DFlashDrafter
    from ..runtime.host_device import HostDevice
    from ..runtime.memory_plan import GIB, MemoryPlan
    from ..runtime.prefill.runner import Prefiller
    from ..runtime.quant_target import open_target
    from ..runtime.tree_verify import TreeVerifier
    from ..target import load_target

    check_draft_ring(args)
    if args.context < 2 or args.driver_gib < 0:
        raise LucegenError(f"--context must be at least 2 and --driver-gib not negative, got {args.context} and "
                           f"{args.driver_gib}")
    target = load_target(args.target)
    device = HostDevice(target, driver_bytes=int(args.driver_gib * GIB))
    dec = open_target(args.model, max_context=args.context, device=device, kv_cache=args.kv_cache)
    draft = DFlashDrafter(dec, args.draft, ring=args.draft_ring) if args.draft else None
    prefiller = Prefiller(dec, draft=draft)
    verifier = TreeVerifier(dec, budget=args.budget, draft=draft)
    print(MemoryPlan.of_engine(dec, verifier, draft).format())
    print(f"  (built on the host device of {target.name}: lucegen's buffers as allocated; the driver's own "
          f"{args.driver_gib:.2f} GiB is assumed, not measured)")
    for part in (verifier, prefiller, draft, dec):
        if part is not None:
            part.close()
    return 0

"""Where a target's decode step and verify pass go, per kernel (torch's CUPTI profiler sees every launch).

    python3 tools/target_profile.py MODEL [--steps 8] [--slots 23]
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--slots", type=int, default=23)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lucegen.runtime import ddtree
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import open_target
    from lucegen.runtime.tree_verify import TreeVerifier

    torch.cuda.init()
    dec = open_target(args.model, max_context=512)
    ver = TreeVerifier(dec, budget=args.slots - 1)
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


if __name__ == "__main__":
    main()

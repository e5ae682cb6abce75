"""Where a DFlash draft step's time goes, per kernel (torch's CUPTI profiler sees every launch in the process).

    python3 tools/draft_profile.py TARGET DRAFT [--repeats 20]     # TARGET: a BF16 directory or a GGUF (quantised)
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("draft")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lucegen.runtime.draft import DFlashDrafter
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import open_target

    torch.cuda.init()
    dec = open_target(args.model, max_context=256)
    draft = DFlashDrafter(dec, args.draft, rows=64)
    root = Prefiller(dec, draft=draft).prefill(np.arange(32) + 100)
    for graphs in (True, False):
        draft.use_graphs = graphs
        draft.propose([root])
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(args.repeats):
                draft.propose([root])
        print(f"graphs={graphs}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))


if __name__ == "__main__":
    main()

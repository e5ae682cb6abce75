"""Where a DFlash draft step's time goes, per kernel (torch's CUPTI profiler sees every launch in the process).

    python -m lucegen.devtools.draft_profile TARGET DRAFT [--repeats 20]   # TARGET: a BF16 directory or a GGUF
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lucegen.devtools.draft_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="the target: a BF16 checkpoint directory or a GGUF (quantised)")
    ap.add_argument("draft", help="the DFlash draft (HF directory or GGUF)")
    ap.add_argument("--repeats", type=int, default=20, help="draft steps profiled")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    import torch  # the CUPTI profiler; imported here, so that the tool's --help needs no torch
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
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``lucegen bench decode --model DIR``: the megakernel's decode speed (tg-N after a P-token prompt), achieved
bandwidth against the descriptor, tok/J from NVML, barriers per token, optional per-phase profile, and the HF
transformers baseline measured in the same run. Prints a table; ``--json`` writes the numbers."""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import atomic_write
from ..errors import LucegenError


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="benchmark decode (megakernel vs HF transformers)",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="bench_kind", required=True, metavar="KIND")
    d = sub.add_parser("decode", help="tg-N decode tok/s, GB/s, tok/J, HF baseline")
    d.add_argument("--model", required=True, type=Path, help="HF checkpoint directory")
    d.add_argument("--prompt-tokens", type=int, default=32)
    d.add_argument("--gen-tokens", type=int, default=128)
    d.add_argument("--repeats", type=int, default=10, help="timed launches (median reported)")
    d.add_argument("--target", default=None, help="descriptor (default: the one matching the GPU)")
    d.add_argument("--profile", action="store_true", help="also run the profiling build: time per phase type")
    d.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")
    d.add_argument("--json", type=Path, default=None, help="write the results here")
    d.set_defaults(func=run)


def run(args) -> int:
    from ..bench.decode import bench_hf, bench_megakernel, format_table

    for name in ("prompt_tokens", "gen_tokens", "repeats"):
        if getattr(args, name) < 1:
            raise LucegenError(f"--{name.replace('_', '-')} must be at least 1")
    result = bench_megakernel(args.model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                              repeats=args.repeats, profile=args.profile, target=args.target)
    if not args.no_hf:
        result.update(bench_hf(args.model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens))
        result["speedup_vs_hf"] = result["tok_s"] / result["hf_tok_s"]
    print(format_table(result))
    if args.json:
        atomic_write(args.json, json.dumps(result, indent=2).encode())
    return 0

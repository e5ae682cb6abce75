"""``lucegen quantize --model DIR --format nvfp4 --out DIR``: a BF16/FP16 HF checkpoint quantised to NVFP4 in
ModelOpt's HF layout (docs/nvfp4.md). The directory is written whole beside ``--out`` and swapped in: killed at any
point, ``--out`` holds its old contents or the new checkpoint."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..atomic import atomic_directory
from ..errors import CheckpointError

FORMATS = ("nvfp4",)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "quantize", help="quantise a BF16/FP16 HF checkpoint (NVFP4, ModelOpt's layout)",
        description="Quantise the Linear layers of a BF16/FP16 HF checkpoint to NVFP4 (E2M1 values in blocks of 16 "
                    "with an E4M3 scale per block and an FP32 scale per tensor, rounded to nearest) and write a HF "
                    "directory in NVIDIA ModelOpt's layout.")
    p.add_argument("--model", required=True, type=Path, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--format", required=True, choices=FORMATS, help="target format")
    p.add_argument("--out", required=True, type=Path, help="output directory (replaced whole)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..model.nvfp4_writer import source_checkpoint, write_nvfp4_checkpoint

    ck = source_checkpoint(args.model)
    if args.out.resolve() == args.model.resolve():
        raise CheckpointError(f"--out {args.out}: the same directory as --model")
    if args.out.exists() and not args.out.is_dir():
        raise CheckpointError(f"{args.out}: exists and is not a directory")
    start = time.perf_counter()
    try:
        with atomic_directory(args.out) as tmp:
            for entry in tmp.iterdir():  # carried over from an earlier --out: this checkpoint replaces it whole
                entry.unlink() if entry.is_file() or entry.is_symlink() else _remove_tree(entry)
            count = write_nvfp4_checkpoint(ck, tmp)
    except OSError as exc:
        raise CheckpointError(f"{exc.filename or args.out}: cannot write: {exc.strerror or exc}") from None
    if not args.quiet:
        print(f"wrote {args.out} ({count} matrices in NVFP4) in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(args.out)
    return 0


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)

"""``lucegen init-weights``: write a random-weight checkpoint (HF safetensors directory or GGUF file) with the real
shapes of a preset, plus a tokenizer, so that every other command runs offline. A directory is written whole beside
``--out`` and swapped in, a GGUF file likewise: killed at any point, ``--out`` holds the old checkpoint or the new."""

from __future__ import annotations

import sys
from pathlib import Path

from ..atomic import atomic_directory
from ..errors import CheckpointError
from ..model.config import PRESETS, ModelConfig
from ..model.dflash import PRESETS as DRAFT_PRESETS

QUANTS = ("bf16", "f32", "f16", "q8_0", "q4_0", "q4_k_m", "q4_k_m_legacy")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "init-weights", help="write a random-weight checkpoint of a model preset",
        description="Write random weights with the real shapes and init statistics of a Qwen3.5 preset, in the "
                    "official HF layout (safetensors, BF16) or as a llama.cpp qwen35 GGUF, plus a tokenizer.")
    p.add_argument("--preset", required=True, choices=list(PRESETS) + list(DRAFT_PRESETS),
                   help="model preset, or a DFlash draft preset (dflash-*)")
    p.add_argument("--format", choices=("safetensors", "gguf"),
                   help="required for model presets; draft presets default to safetensors (gguf: lucebox-hub's "
                        "draft layout, --quant bf16 or q8_0)")
    p.add_argument("--quant", choices=QUANTS, default=None,
                   help="GGUF tensor types: bf16 (default), f32, f16, q8_0, q4_0, llama.cpp's current q4_k_m "
                        "recipe (attn_qkv counted with attn_v, F32 ssm_alpha/ssm_beta) or q4_k_m_legacy (the "
                        "older mix: Q5_K attn_qkv, Q4_K ssm_alpha/ssm_beta)")
    p.add_argument("--draft-layout", choices=("lucegen", "lucebox"), default="lucegen",
                   help="a draft GGUF's metadata: lucegen (default: the tapped layers listed) or lucebox (as "
                        "lucebox-hub's converter writes it: the tap count alone, the taps computed from the target)")
    p.add_argument("--out", required=True, type=Path,
                   help="output directory (safetensors) or .gguf file / directory to put model.gguf in (gguf)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed: same weights in both formats)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args) -> int:
    try:
        return write_checkpoint(args)
    except OSError as exc:  # an unwritable --out (no such directory, no permission, a full disk)
        where = exc.filename or args.out
        raise CheckpointError(f"{where}: cannot write: {exc.strerror or exc}") from None


def write_checkpoint(args) -> int:
    if args.seed < 0:
        raise CheckpointError(f"--seed: {args.seed} is negative (a seed is a non-negative integer)")
    if args.draft_layout != "lucegen" and (args.preset not in DRAFT_PRESETS or args.format != "gguf"):
        raise CheckpointError(f"--draft-layout {args.draft_layout}: for a draft preset written as a GGUF")
    if args.preset in DRAFT_PRESETS:
        return run_draft(args)
    if args.format is None:
        raise CheckpointError(f"--format: required for model preset {args.preset} (safetensors or gguf)")
    config = ModelConfig.preset(args.preset)
    if args.format == "safetensors":
        if args.quant not in (None, "bf16"):
            raise CheckpointError(f"--quant {args.quant}: safetensors checkpoints are written in BF16 only")
        if args.out.exists() and not args.out.is_dir():
            raise CheckpointError(f"{args.out}: exists and is not a directory")
        from ..model.init_weights import write_hf_checkpoint

        with atomic_directory(args.out) as tmp:  # the old checkpoint stays whole until the new one is
            seconds = write_hf_checkpoint(config, tmp, seed=args.seed, progress=not args.quiet)
        target = args.out
    else:
        from ..model.init_gguf import write_gguf_checkpoint

        target = gguf_path(args)
        seconds = write_gguf_checkpoint(config, target, quant=args.quant or "bf16", seed=args.seed,
                                        progress=not args.quiet)
    return report(args, target, config, seconds)


def report(args, target: Path, config, seconds: float) -> int:
    """What was written where (stderr unless --quiet), and its path on stdout."""
    if not args.quiet:
        print(f"wrote {target} ({config.name}, {config.num_parameters() / 1e6:.0f} M parameters) "
              f"in {seconds:.1f} s", file=sys.stderr)
    print(target)
    return 0


def gguf_path(args) -> Path:
    """``--out`` as the .gguf file, or ``<preset>-<quant>.gguf`` in the ``--out`` directory (created)."""
    out = args.out if args.out.suffix == ".gguf" else args.out / f"{args.preset}-{args.quant or 'bf16'}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def run_draft(args) -> int:
    """A random-weight DFlash draft: config.json + model.safetensors (BF16, the published draft's layout), or a GGUF
    in lucebox-hub's draft layout with the matrices in BF16 or Q8_0 (lucegen/model/dflash_gguf.py)."""
    from ..model.dflash import DFlashConfig
    from ..model.init_dflash import QUANTS as DRAFT_QUANTS, write_dflash_checkpoint, write_dflash_gguf

    config = DFlashConfig.preset(args.preset)
    target = args.out
    if args.format == "gguf":
        if (args.quant or "bf16") not in DRAFT_QUANTS:
            raise CheckpointError(f"--quant {args.quant}: a draft GGUF holds its matrices in "
                                  f"{' or '.join(DRAFT_QUANTS)}")
        target = gguf_path(args)
        seconds = write_dflash_gguf(config, target, quant=args.quant or "bf16", seed=args.seed,
                                    progress=not args.quiet, layout=args.draft_layout)
    else:
        if args.quant not in (None, "bf16"):
            raise CheckpointError(f"--quant {args.quant}: safetensors drafts are written in BF16 only")
        with atomic_directory(target) as tmp:
            seconds = write_dflash_checkpoint(config, tmp, seed=args.seed, progress=not args.quiet)
    return report(args, target, config, seconds)

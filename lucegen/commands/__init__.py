"""The ``lucegen`` subcommands (lucegen/cli.py wires them), and the checks several of them share."""

from __future__ import annotations

from ..errors import LucegenError


def check_draft_ring(args) -> None:
    """``--draft-ring N`` (run, bench dflash, plan): only with ``--draft``, at least one position."""
    if args.draft_ring is not None and (not args.draft or args.draft_ring < 1):
        raise LucegenError(f"--draft-ring needs --draft and at least 1 position, got {args.draft_ring}")

"""Where a bench result comes from, written at the head of every ``lucegen bench ... --json`` file: which bench, the
commit it ran, the machine (the GPU's name as the driver gives it) and the UTC date. A result committed under
docs/bench/ thereby says what it measured, and lucegen.devtools.readme_figures renders it into the README.

The commit is ``$LUCEGEN_COMMIT`` where set (a copy of a checkout without its .git, as a device runner ships it);
else ``git rev-parse`` in a source checkout, with ``-dirty`` when the package's tracked files (the code that ran)
differ from it, so that results written into docs/bench/ by one bench do not mark the next; else the package
version."""

from __future__ import annotations

import datetime
import os
import subprocess

from .. import __version__, source_checkout


def commit() -> str:
    """``$LUCEGEN_COMMIT`` where set; else the checkout's HEAD (7 hex digits, ``-dirty`` when a tracked file of the
    package differs); else ``lucegen VERSION`` (no checkout, a tree without .git, or git cannot read it)."""
    if os.environ.get("LUCEGEN_COMMIT", "").strip():
        return os.environ["LUCEGEN_COMMIT"].strip()
    root = source_checkout()
    if root is not None and (root / ".git").exists():  # not a repository further up the tree holding a copy
        try:
            head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=root, capture_output=True,
                                  text=True, timeout=30)
            if head.returncode == 0 and head.stdout.strip():
                clean = subprocess.run(["git", "diff-index", "--quiet", "HEAD", "--", "lucegen"], cwd=root,
                                       capture_output=True, timeout=30)
                return head.stdout.strip() + ("" if clean.returncode == 0 else "-dirty")
        except (OSError, subprocess.TimeoutExpired):
            pass
    return f"lucegen {__version__}"


def utc_date() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def provenance(bench: str, machine: str | None, label: str | None = None) -> dict:
    """The fields that head a bench's JSON. ``machine``: the GPU's name (None for ``bench serve``, a client that
    does not see the server's device); ``label``: the user's name for what was measured (``--label``)."""
    return {"bench": bench, "label": label, "commit": commit(), "machine": machine, "date": utc_date()}

"""``lucegen targets`` (table of chips, and where each was found), ``lucegen show NAME`` (resolved descriptor),
``lucegen new-target NAME --like CHIP [--dir DIR]`` (start a descriptor from a similar chip)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .. import TARGETS_DIR, descriptor_paths, source_checkout
from ..atomic import atomic_write
from ..errors import DescriptorError, LucegenError
from ..target import Target, list_targets, load_target
from ..tuning import tuning_table


def register(subparsers) -> None:
    p = subparsers.add_parser("targets", help="list the chip descriptors and their key parameters",
                              description="Table of the chip descriptors (the packaged ones and the user's, "
                                          f"${descriptor_paths.PATH_VARIABLE}) and their key parameters.")
    p.set_defaults(func=run_targets)

    p = subparsers.add_parser("show", help="print a resolved chip descriptor, derived values included",
                              description="Print a descriptor after validation, with derived values.")
    p.add_argument("name", help="target name (sm_90) or path to a .toml descriptor")
    p.set_defaults(func=run_show)

    p = subparsers.add_parser("new-target", help="write NAME.toml from a similar chip's descriptor",
                              description="Copy a similar chip's descriptor to NAME.toml for editing: into "
                                          "lucegen/targets/ in a source checkout (to commit it), else into the "
                                          "first user directory ($LUCEGEN_TARGETS_PATH, default "
                                          "~/.config/lucegen/targets). Refuses to overwrite or to reuse a name.")
    p.add_argument("name", help="new target name (letters, digits, '_', '-', '.')")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--like", help="existing target to start from (e.g. sm_89)")
    source.add_argument("--from-device", action="store_true",
                        help="the GPU's own: the descriptor of its arch nearest in size, with the facts its driver "
                             "reports (SMs, memory, L2, bandwidth, ...)")
    p.add_argument("--dir", type=Path, default=None, help="write into this directory instead")
    p.set_defaults(func=run_new_target)


def _features(t: Target) -> str:
    names = [f for f, on in vars(t.features).items() if on and f not in ("bf16", "cooperative_launch")]
    return ",".join(names) or "-"


def targets_table(targets: list[Target], origins: dict[str, str] | None = None) -> str:
    """One row a chip; ``origins`` (name -> "package" / "user") adds the column saying where each was found."""
    header = ("target", "vendor", "arch", "CUs", "warp", "smem/blk", "GB/s", "L2 MB", "dtype", "mk grid", "features",
              "from", "chip")
    rows = [header]
    for t in targets:
        rows.append((t.name, t.vendor, t.arch, str(t.compute_units), str(t.warp_size),
                     f"{t.smem_per_block_optin // 1024}K", f"{t.mem_bandwidth_gbs:g}", f"{t.l2_bytes / 2**20:g}",
                     t.compute_dtype, f"{t.megakernel.blocks}x{t.megakernel.threads}", _features(t),
                     (origins or {}).get(t.name, "path"), t.description))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def search_footnote() -> str:
    """Which directory each origin of the table's "from" column is."""
    lines = []
    for directory, origin in descriptor_paths.search_dirs():
        state = "" if directory.is_dir() else "  (does not exist)"
        lines.append(f"{origin + ':':9}{directory}{state}")
    if not descriptor_paths.user_dirs():
        lines.append(f"user:    none (${descriptor_paths.PATH_VARIABLE} is set and empty)")
    return "\n".join(lines)


def run_targets(args) -> int:
    found = descriptor_paths.descriptors()
    if not found:
        where = ", ".join(str(d) for d, _ in descriptor_paths.search_dirs())
        raise LucegenError(f"no chip descriptors found (searched {where}): the installed package lacks its data")
    print(targets_table([load_target(n) for n in list_targets()], {n: d.origin for n, d in found.items()}))
    print()
    print(search_footnote())
    return 0


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }" if value else "{}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def show_text(t: Target) -> str:
    data = t.to_dict()
    data.pop("path")
    data.pop("variant")
    data.pop("tuning")
    derived = {"megakernel.blocks": f"compute_units x blocks_per_cu = {t.compute_units} x {t.megakernel.blocks_per_cu}"}
    lines = [f"# {t.path}  (resolved; values marked 'derived' are computed and those marked 'default' come from "
             f"lucegen/tuning.py, not from the file)"]
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {_toml_value(value)}")
    if t.is_nvidia:
        major, minor = t.compute_capability
        lines.append(f"# derived: compute capability {major}.{minor}")
    for table, values in tables.items():
        lines.append(f"\n[{table}]")
        for key, value in values.items():
            note = derived.get(f"{table}.{key}")
            lines.append(f"{key} = {_toml_value(value)}" + (f"    # derived: {note}" if note else ""))
    for table, values in tuning_table(t.tuning).items():  # lucegen/tuning.py
        lines.append(f"\n[tuning.{table}]")
        for key, value in values.items():
            default = f"{table}.{key}" in t.tuning.defaults
            lines.append(f"{key} = {_toml_value(value)}" + ("    # default (lucegen/tuning.py)" if default else ""))
    return "\n".join(lines)


def run_show(args) -> int:
    print(show_text(load_target(args.name)))
    return 0


def _without_tuning(text: str) -> str:
    """A descriptor's text less its [tuning.*] tables (what was measured on that chip) and the comment lines
    directly above each."""
    lines, out, skipping = text.splitlines(keepends=True), [], False
    for line in lines:
        header = re.match(r"\s*\[([^\]]*)\]", line)
        if header:
            skipping = header.group(1).strip().split(".")[0] == "tuning"
            if skipping:
                while out and out[-1].lstrip().startswith("#"):
                    out.pop()
        if not skipping:
            out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return "".join(out).rstrip("\n") + "\n"


def new_target_dir() -> Path:
    """Where ``new-target`` writes without ``--dir``: the package's targets/ in a source checkout (the file is then
    committed with the code), else the first user directory."""
    if source_checkout() is not None:
        return TARGETS_DIR
    dirs = descriptor_paths.user_dirs()
    if not dirs:
        raise LucegenError(f"${descriptor_paths.PATH_VARIABLE} is set but empty: no user directory to write the "
                           f"descriptor to; pass --dir DIR")
    return dirs[0]


def _new_path(name: str, directory: Path | None) -> Path:
    """<directory>/<name>.toml for a new descriptor: a valid name, no file there, no descriptor of that name."""
    directory = Path(directory) if directory is not None else new_target_dir()
    path = directory / f"{name}.toml"
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise DescriptorError(path, "name", f"{name!r} must be letters, digits, '_', '-' or '.'")
    if path.exists():
        raise DescriptorError(path, "<file>", "already exists; edit it or choose another name")
    known = descriptor_paths.descriptors().get(name)
    if known is not None:
        raise DescriptorError(path, "name", f"{name!r} already exists as {known.path}; choose another name")
    return path


def _write_checked(path: Path, text: str) -> str:
    atomic_write(path, text.encode())
    try:
        load_target(path)
    except DescriptorError:
        os.unlink(path)
        raise
    return str(path)


def new_target_from_facts(name: str, facts, directory: Path | None = None) -> str:
    """Write <directory>/<name>.toml for the GPU ``facts`` describe (lucegen/runtime/device_facts.py: the
    descriptor of its arch nearest in size, with the driver's figures); returns the path."""
    from ..runtime.device_facts import descriptor_text, exact_match, nearest

    path = _new_path(name, directory)
    base = exact_match(facts) or nearest(facts)
    return _write_checked(path, descriptor_text(base, facts, name))


def new_target(name: str, like: str, directory: Path | None = None) -> str:
    """Write <directory>/<name>.toml (default: :func:`new_target_dir`) from <like>'s descriptor (validated); returns
    the path. Refuses to overwrite a file or to reuse the name of a descriptor found elsewhere."""
    source = load_target(like)  # validates --like (a name or a path)
    path = _new_path(name, directory)
    text = open(source.path, encoding="utf-8").read()
    text, count = re.subn(r'(?m)^name\s*=\s*"[^"]*"', f'name = "{name}"', text, count=1)
    if count != 1:
        raise DescriptorError(source.path, "name", "no name line to replace")
    text = _without_tuning(text)
    header = (f"# Started from {source.name} by `lucegen new-target {name} --like {source.name}`: replace every value\n"
              f"# below with the new chip's published figures (arch, compute_units, memory, ...). {source.name}'s\n"
              f"# [tuning.*] tables are left out: the new chip takes the defaults (lucegen/tuning.py) until measured.\n")
    return _write_checked(path, header + text)


def run_new_target(args) -> int:
    if args.from_device:
        from ..runtime.device import read_facts

        path = new_target_from_facts(args.name, read_facts(), args.dir)
    else:
        path = new_target(args.name, args.like, args.dir)
    searched = {d.resolve() for d, _ in descriptor_paths.search_dirs()}
    if Path(path).parent.resolve() in searched:
        print(f"wrote {path}: edit arch, compute_units and the chip's figures, then `lucegen show {args.name}`")
    else:
        print(f"wrote {path}: edit arch, compute_units and the chip's figures, then `lucegen show {path}` (its "
              f"directory is not searched by name: add it to ${descriptor_paths.PATH_VARIABLE} to use the name)")
    return 0

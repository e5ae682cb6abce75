"""The ``lucegen`` command. Each subcommand lives in ``lucegen/commands/<name>.py`` and exposes
``register(subparsers)``; this module only wires them together and turns :class:`LucegenError` into one line
and exit code 2."""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import LucegenError

# Modules under lucegen.commands, in the order their subcommands appear in --help.
COMMAND_MODULES = ("targets", "build", "weights", "run", "serve", "bench", "plan")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lucegen", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"lucegen.commands.{name}")
        except ModuleNotFoundError as exc:  # a command module not written yet
            if exc.name == f"lucegen.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LucegenError as exc:
        print(f"lucegen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lucegen: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The ``lucegen`` command. Each subcommand lives in ``lucegen/commands/<name>.py`` and exposes
``register(subparsers)``; this module only wires them together and turns :class:`LucegenError` into one line
and exit code 2; a reader that closes the pipe early (``lucegen show sm_90 | head``) ends the command quietly."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import LucegenError

# Modules under lucegen.commands, in the order their subcommands appear in --help.
COMMAND_MODULES = ("targets", "build", "weights", "run", "bench", "plan")


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``lucegen: error:`` line (exit 2) like every other error; the subcommand
    parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"lucegen: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lucegen", description=__doc__.splitlines()[0])
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
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # a usage error (one line, 2) or --help (0): a code for in-process callers too
            return exc.code if isinstance(exc.code, int) else 2
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit-time flush
        return code
    except BrokenPipeError:
        return _pipe_closed()
    except LucegenError as exc:
        print(f"lucegen: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lucegen: interrupted", file=sys.stderr)
        return 130


#: Exit status of a writer whose reader went away: 128 + SIGPIPE, what a shell reports for ``yes | head``.
PIPE_CLOSED = 141


def _pipe_closed() -> int:
    """The reader of stdout closed the pipe: point stdout at /dev/null so the interpreter's final flush has nowhere
    to fail, and stop without a message."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured in-process)
        pass
    return PIPE_CLOSED


if __name__ == "__main__":
    sys.exit(main())

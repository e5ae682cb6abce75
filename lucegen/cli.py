"""The ``lucegen`` command. Each subcommand lives in ``lucegen/commands/<name>.py`` and exposes
``register(subparsers)``; this module only wires them together and turns :class:`LucegenError` into one line
and exit code 2; a reader that closes the pipe early (``lucegen show sm_90 | head``) ends the command quietly."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from . import __doc__ as PACKAGE_DOC, __version__
from .errors import LucegenError

# Modules under lucegen.commands, in the order their subcommands appear in --help.
COMMAND_MODULES = ("targets", "build", "weights", "quantize", "run", "serve", "bench", "plan")


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one ``lucegen: error:`` line (exit 2) like every other error; the subcommand
    parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"lucegen: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lucegen", description=PACKAGE_DOC.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"lucegen {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, dest="log_verbose",
                        help="debugging detail on stderr besides the progress lines")
    parser.add_argument("-q", "--quiet", action="store_true", dest="log_quiet",
                        help="only warnings and errors on stderr")
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
        configure_logging(args.log_verbose, args.log_quiet)
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


def configure_logging(verbose: int, quiet: bool) -> None:
    """The ``lucegen`` logger's level and a stderr handler: INFO by default (progress lines such as what a first
    run compiles), WARNING with --quiet, DEBUG with -v."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    logger = logging.getLogger("lucegen")
    logger.setLevel(level)
    if not any(isinstance(h, StderrHandler) for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("lucegen: %(message)s"))
        logger.addHandler(handler)


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (a caller may have replaced it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


if __name__ == "__main__":
    sys.exit(main())

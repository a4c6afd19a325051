"""The `chronos` command: its parser, assembled from the sub-commands (one module each, in
chronos/commands/), and `main`, which runs the one asked for and turns Chronos's errors into one line on
standard error and their exit code."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from chronos import __version__, commands, config
from chronos.errors import ChronosError


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line and exit 2, like every other bad input (sub-commands inherit it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The `chronos` parser: its own flags, and every sub-command of chronos.commands."""
    parser = _Parser(prog="chronos", description="Chronos: a persistent time-delay scheduler "
                                     "for Kafka. Every setting is also a CHRONOS_* environment variable.")
    parser.add_argument("--version", action="version", version=f"chronos {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the sub-command `argv` asks for (the process's arguments by default); its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ChronosError as exc:
        print(f"chronos {args.command}: {config.redact_url(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


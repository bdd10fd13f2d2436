"""The `se-bridge` command line (docs/contracts.md#command-line): the parser, built from each
program's own `add_parser`, and the dispatch to the sub-command it chose."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn, cast

from bridge import __version__, demo
from bridge.agent import command as agent_command
from bridge.agent import status, winservice
from bridge.commands import signing
from bridge.config import ENV_PREFIX, LOG_LEVELS
from bridge.consumer import command as consumer_command
from bridge.logfile import LOG_FORMATS, setup_logging
from bridge.simulator import command as simulator_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="se-bridge",
        description="Azure Scheduled Events to fleet-wide records, alerts and approvals.",
    )
    parser.add_argument("--version", action="version", version=f"se-bridge {__version__}")
    # Each program's add_parser takes the plain type; what they create is a CommandParser.
    subparsers = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(
            dest="command", required=True, metavar="COMMAND", parser_class=CommandParser
        ),
    )
    agent_command.add_parser(subparsers)  # agent and check
    status.add_parser(subparsers)
    consumer_command.add_parser(subparsers)  # consume and policy
    simulator_command.add_parser(subparsers)
    demo.add_parser(subparsers)
    signing.add_parser(subparsers)
    winservice.add_parser(subparsers)
    for command in subparsers.choices.values():
        _logging_options(command)
    return parser


class CommandParser(argparse.ArgumentParser):
    """A sub-command's parser: a usage error exits 2, or the command's `usage_status` default
    (`status` says 3, UNKNOWN, where a monitoring system would read 2 as CRITICAL)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        status = self.get_default("usage_status")
        self.exit(status if isinstance(status, int) else 2, f"{self.prog}: error: {message}\n")


def _logging_options(parser: argparse.ArgumentParser) -> None:
    """`--log-level` and `--log-format`, on every sub-command."""
    group = parser.add_argument_group("logging")
    group.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        help=f"how much to log (setting agent.log_level, {ENV_PREFIX}AGENT_LOG_LEVEL; "
        "default INFO, WARNING for check)",
    )
    group.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="text, or json: one object per line for a log pipeline (setting agent.log_format, "
        f"{ENV_PREFIX}AGENT_LOG_FORMAT; default text)",
    )


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-commands' parsers, by name."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    choices: dict[str, argparse.ArgumentParser] = action.choices
    return choices


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # told by the command's parser, so that its usage status holds
        _commands(parser)[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    # The agent and the consumer log as their settings say, once they have read them.
    if args.command not in ("agent", "consume"):
        default = "WARNING" if args.command == "check" else "INFO"
        level = args.log_level or os.environ.get(f"{ENV_PREFIX}AGENT_LOG_LEVEL", default)
        fmt = args.log_format or os.environ.get(f"{ENV_PREFIX}AGENT_LOG_FORMAT", "text")
        setup_logging(
            level.upper() if level.upper() in LOG_LEVELS else default,
            fmt=fmt if fmt in LOG_FORMATS else "text",
            program=args.command,
        )
    code: int = args.func(args)
    return code

"""The `se-bridge` command line (docs/contracts.md#command-line): the parser, built from each
program's own `add_parser`, and the dispatch to the sub-command it chose."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

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
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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

"""The `se-bridge` command line (docs/contracts.md#command-line): the parser, built from each
program's own `add_parser`, and the dispatch to the sub-command it chose."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bridge import __version__, demo
from bridge.agent import command as agent_command
from bridge.agent import winservice
from bridge.commands import signing
from bridge.consumer import service
from bridge.logfile import setup_logging
from bridge.simulator import command as simulator_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="se-bridge",
        description="Azure Scheduled Events to fleet-wide records, alerts and approvals.",
    )
    parser.add_argument("--version", action="version", version=f"se-bridge {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    agent_command.add_parser(subparsers)  # agent and check
    service.add_parser(subparsers)
    simulator_command.add_parser(subparsers)
    demo.add_parser(subparsers)
    signing.add_parser(subparsers)
    winservice.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The agent and the consumer log as their settings say, once they have read them.
    if args.command not in ("agent", "check", "consume"):
        setup_logging("INFO")
    if args.command == "check":
        setup_logging("WARNING")
    code: int = args.func(args)
    return code

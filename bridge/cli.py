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
from bridge.config import ENV_PREFIX, LOG_FORMATS, LOG_LEVELS, flag_help, flag_of
from bridge.consumer import command as consumer_command
from bridge.consumer.people import command as people_command
from bridge.logfile import setup_logging
from bridge.monitoring import UNKNOWN, emit, stdout_gone
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
    consumer_command.add_status_options(subparsers.choices["status"])  # status --consumer
    consumer_command.add_parser(subparsers)  # consume and policy
    people_command.add_parsers(subparsers)  # approve, hold, pause and resume
    simulator_command.add_parser(subparsers)
    demo.add_parser(subparsers)
    signing.add_parser(subparsers)
    winservice.add_parser(subparsers)
    for name, command in subparsers.choices.items():
        _logging_options(command, name)
    return parser


class CommandParser(argparse.ArgumentParser):
    """A sub-command's parser: a usage error exits 2, or the command's `usage_status` default
    (`status` says 3, UNKNOWN, where a monitoring system would read 2 as CRITICAL)."""

    def error(self, message: str) -> NoReturn:
        status = self.get_default("usage_status")
        if status == UNKNOWN:  # a check's first line of stdout says its level, this one too
            emit(f"UNKNOWN: {self.prog}: {message}")
        self.print_usage(sys.stderr)
        self.exit(status if isinstance(status, int) else 2, f"{self.prog}: error: {message}\n")


# Whose log settings each command's --log-level and --log-format stand for, read from the
# environment when no flag is given (the agent and the consumer read their config file too);
# the other commands read no settings.
LOG_SECTIONS = {
    "agent": "agent",
    "check": "agent",
    "status": "agent",
    "service": "agent",
    "consume": "consumer",
    "policy": "consumer",
}
SIGPIPE_EXIT = 141  # what a shell reports of a writer whose reader left (128 + SIGPIPE)
# Quieter where the output is the point: check's verdicts, the demo's live view.
QUIET_COMMANDS = ("check", "demo")


LOGGING_OPTIONS = (flag_of("agent.log_level").name, flag_of("agent.log_format").name)


def _logging_options(parser: argparse.ArgumentParser, command: str) -> None:
    """`--log-level` and `--log-format`, on every sub-command; those of a program that reads
    settings name its section's."""
    section = LOG_SECTIONS.get(command)

    def help_of(key: str, default: str) -> str:
        if section is None:
            return f"{flag_of(f'agent.{key}').help} (default {default})"
        return flag_help(f"{section}.{key}", default=default)

    group = parser.add_argument_group("logging")
    level, fmt = LOGGING_OPTIONS
    group.add_argument(
        level,
        type=str.upper,
        choices=LOG_LEVELS,
        help=help_of("log_level", _default_level(command)),
    )
    group.add_argument(fmt, choices=LOG_FORMATS, help=help_of("log_format", "text"))


def _default_level(command: str) -> str:
    return "WARNING" if command in QUIET_COMMANDS else "INFO"


def _from_env(command: str, key: str) -> str | None:
    """The environment's `key` for `command`'s section; the consumer's tools still take the
    agent's variables where theirs are not set (bridge.config.UNDER_AGENT)."""
    section = LOG_SECTIONS.get(command)
    if section is None:
        return None
    names = [f"{ENV_PREFIX}{section.upper()}_{key.upper()}"]
    if section == "consumer":
        names.append(f"{ENV_PREFIX}AGENT_{key.upper()}")
    return next((os.environ[name] for name in names if os.environ.get(name)), None)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-commands' parsers, by name."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    choices: dict[str, argparse.ArgumentParser] = action.choices
    return choices


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:  # now, so that a reader gone is seen here, not as the interpreter exits
            if sys.stdout is not None:  # None in a Windows service
                sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`| head`): what it did not read is no error
        stdout_gone()
        return SIGPIPE_EXIT


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # told by the command's parser, so that its usage status holds
        _commands(parser)[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    # The agent and the consumer log as their settings say, once they have read them.
    if args.command not in ("agent", "consume"):
        default = _default_level(args.command)
        level = (args.log_level or _from_env(args.command, "log_level") or default).upper()
        fmt = args.log_format or _from_env(args.command, "log_format") or "text"
        setup_logging(
            level if level in LOG_LEVELS else default,
            fmt=fmt if fmt in LOG_FORMATS else "text",
            program=args.command,
        )
    code: int = args.func(args)
    return code

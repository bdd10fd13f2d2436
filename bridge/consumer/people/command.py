"""The sub-commands of a person's decision: `se-bridge approve`, `hold`, `pause` and `resume`
(their parsers; what they do is bridge/consumer/people/client.py, loaded when one runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.config import add_flags
from bridge.policy.model import parse_scope

FLAGS = ("people.api_url", "consumer.state_dir")  # settings taken as options, in --help's order

EXAMPLES = {
    "approve": """\
examples:
  se-bridge approve C7061BAC-AFDC-4513-B24B-AA5F13A16123 --reason "failover done"
  se-bridge approve C7061BAC-... --override-budget --reason "P1 incident, CAB-123"
  se-bridge approve C7061BAC-... --api https://se-bridge-func.azurewebsites.net
""",
    "hold": """\
examples:
  se-bridge hold C7061BAC-AFDC-4513-B24B-AA5F13A16123 --reason "primary database, wait"
""",
    "pause": """\
examples:
  se-bridge pause --reason "launch week" --until 2026-12-04T18:00Z
  se-bridge pause --scope zone:2 --until 2h --reason "incident 4711"
""",
    "resume": """\
examples:
  se-bridge resume --reason "launch is over"
  se-bridge resume --scope zone:2 --reason "incident 4711 closed"
""",
}


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    helps = {
        "approve": "let an event's maintenance start now (a person's early approval)",
        "hold": "let an event wait until its NotBefore (no early approval)",
        "pause": "stop every early approval, fleet-wide or in a budget group",
        "resume": "lift a pause",
    }
    for name, text in helps.items():
        p = subparsers.add_parser(
            name,
            help=text,
            description=f"A person's decision: {text}. Sent to the approval API as you, "
            "signed in with your own Azure account (or, for a loopback URL, with the local "
            "consumer's operator token). Exit 0 accepted, 1 refused or unreachable, 2 on a "
            "bad option.",
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name in ("approve", "hold"):
            p.add_argument("event", metavar="EVENT", help="the EventId")
        needed = name in ("pause", "resume")
        p.add_argument(
            "--reason",
            metavar="TEXT",
            required=needed,
            default="",
            help="why (kept in the Decision record)" + (", required" if needed else ""),
        )
        if name == "approve":
            p.add_argument(
                "--override-budget",
                action="store_true",
                help="break glass: approve even over a full budget (needs --reason; "
                "recorded as an override and alerted)",
            )
        if name == "pause":
            p.add_argument(
                "--until",
                metavar="TIME",
                help="an ISO 8601 time (UTC unless it says) or a duration such as 2h "
                "or 1d; default until resumed",
            )
        if needed:
            p.add_argument(
                "--scope",
                type=_scope,
                metavar="GROUP",
                help="a budget group, KIND:VALUE (zone:2, scale_set:web, ...); "
                "default the whole fleet",
            )
        p.add_argument(
            "--config", type=Path, metavar="FILE", help="TOML settings file ([consumer.people])"
        )
        add_flags(p, *FLAGS)
        p.set_defaults(func=_run, decision=name)


def _scope(text: str) -> str:
    """--scope as given, once it reads as a budget group (exit 2 before anything is sent)."""
    try:
        parse_scope(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _run(args: argparse.Namespace) -> int:
    from bridge.consumer.people import client  # noqa: PLC0415 - PyJWT, azure-identity: on use

    return client.run(args)

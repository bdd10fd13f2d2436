"""The consumer's sub-commands, `consume` and `policy`: their options, and the dispatch that
loads the consumer only when one of them needs it.

The bare package is the agent (pyproject.toml's extras): its command line must start, and say
what to install, without the consumer's libraries (Table Storage, the record check, blob
checkpoints, Key Vault). So the parsers live here, and `consume` and `policy explain` import their
modules when they run, after `extras.missing` found everything they need installed. `policy
check` needs only the policy file's reader, which the agent has too (local mode).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bridge import extras
from bridge.policy import file as policyfile


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `consume` and `policy` sub-commands."""
    add_consume_parser(subparsers)
    add_policy_parser(subparsers)


def add_status_options(status: argparse.ArgumentParser) -> None:
    """`status --consumer`: the consumer's side of `status` (bridge.consumer.status), on the
    agent's `status` sub-command, so that a monitoring system calls one command with one set
    of exit codes for both; without `--consumer` the agent's check runs as before."""
    group = status.add_argument_group(
        "the consumer's side (--consumer: people's pauses, asks and overrides in a fleet state)"
    )
    group.add_argument(
        "--consumer",
        action="store_true",
        help="check a consumer's fleet state instead of an agent's state directory (--config "
        "is then the consumer's settings file)",
    )
    group.add_argument(
        "--state",
        metavar="SPEC",
        help="with --consumer: the fleet state, read only: sqlite:PATH or tables (setting "
        "consumer.state, SE_BRIDGE_CONSUMER_STATE)",
    )
    group.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="with --consumer: the policy file (setting consumer.policy)",
    )
    group.add_argument(
        "--ask-age",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="with --consumer: WARNING when an ask has waited longer (default 1800)",
    )
    agent_check = status.get_default("func")

    def check(args: argparse.Namespace) -> int:
        if not args.consumer:
            code: int = agent_check(args)
            return code
        if not _installed("status --consumer"):
            return 3  # UNKNOWN: the check could not look
        from bridge.consumer import status as consumer_status  # noqa: PLC0415 - checked above

        return consumer_status.run(args)

    status.set_defaults(func=check)


def _installed(command: str) -> bool:
    message = extras.missing_message("consumer", command)
    if message:
        print(f"se-bridge: {message}", file=sys.stderr)
    return not message


def _consume(args: argparse.Namespace) -> int:
    if not _installed("consume"):
        return 2
    from bridge.consumer import service  # noqa: PLC0415 - the consumer extra, checked above

    return service.run(args)


def _check(args: argparse.Namespace) -> int:
    try:
        policy = policyfile.load(args.file)
    except policyfile.PolicyError as err:
        print(err, file=sys.stderr)
        return 2
    print("\n".join(policyfile.summary(policy)))
    return 0


def _explain(args: argparse.Namespace) -> int:
    if not _installed("policy explain"):
        return 2
    from bridge.consumer import explain  # noqa: PLC0415 - the consumer extra, checked above

    return explain.run_explain(args)


CONSUME_EXAMPLES = """\
examples:
  se-bridge consume --config /etc/se-bridge/consumer.toml
  se-bridge consume --hub /srv/hub --commands local:/srv/commands --policy policy.yaml
  SE_BRIDGE_CONSUMER_CONSUMER_GROUP=se-bridge-shadow se-bridge consume --shadow \
      --config consumer.toml   # decide, send nothing, in a consumer group of its own
"""


def add_consume_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "consume",
        help="apply the approval policy to the fleet's records (runs until stopped)",
        description="The standalone consumer: read the fleet's records (Event Hubs, or a local "
        "hub), keep the fleet state, apply the approval policy with its budgets, send signed "
        "approvals and write Decision records. Runs until SIGTERM or Ctrl-C. Exit 2 on a bad "
        "setting, 1 when it cannot start.",
        epilog=CONSUME_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML settings file")
    p.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="decisions spool and default state directory (setting consumer.state_dir, "
        "SE_BRIDGE_CONSUMER_STATE_DIR)",
    )
    p.add_argument(
        "--hub",
        type=Path,
        metavar="DIR",
        help="read a local hub, not Event Hubs (setting consumer.hub, SE_BRIDGE_CONSUMER_HUB)",
    )
    p.add_argument(
        "--commands",
        metavar="SPEC",
        help="where approvals go: local:DIR or storagequeue (setting commands.channel, "
        "SE_BRIDGE_COMMANDS_CHANNEL)",
    )
    p.add_argument(
        "--state",
        metavar="SPEC",
        help="fleet state: sqlite:PATH or tables (setting consumer.state, "
        "SE_BRIDGE_CONSUMER_STATE; default sqlite:<state-dir>/fleet.db)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="approval policy, YAML (setting consumer.policy, SE_BRIDGE_CONSUMER_POLICY; "
        "default the built-in policy)",
    )
    p.add_argument(
        "--sink",
        action="append",
        metavar="SPEC",
        help="where Decision records go: jsonl:PATH, stdout, hub:DIR, eventhubs or "
        "loganalytics; repeat for several (setting consumer.sinks, SE_BRIDGE_CONSUMER_SINKS; "
        "default jsonl:<state-dir>/decisions.jsonl)",
    )
    p.add_argument(
        "--shadow",
        action="store_const",
        const="shadow",
        dest="mode",
        help="decide and write Decision records, send no command, in a consumer group (and on "
        "a fleet state) other than the live consumer's (setting consumer.mode, "
        "SE_BRIDGE_CONSUMER_MODE=shadow)",
    )
    p.add_argument(
        "--metrics-address",
        metavar="[HOST:]PORT",
        help="serve /metrics, /healthz and /readyz here; a bare port listens on 127.0.0.1 "
        "(setting consumer.metrics_address, SE_BRIDGE_CONSUMER_METRICS_ADDRESS; default off)",
    )
    p.add_argument(
        "--page-address",
        metavar="[HOST:]PORT",
        help="serve the approval page and its API here; a bare port listens on 127.0.0.1, "
        "and without Entra ID settings only loopback is allowed (setting "
        "consumer.people.page_address, SE_BRIDGE_CONSUMER_PEOPLE_PAGE_ADDRESS; default off)",
    )
    p.set_defaults(func=_consume)


POLICY_EXAMPLES = """\
examples:
  se-bridge policy check /etc/se-bridge/policy.yaml
  se-bridge policy explain --policy policy.yaml --records /var/lib/se-bridge/records.jsonl
  se-bridge policy explain --state sqlite:/var/lib/se-bridge/fleet.db --event C7061BAC-...
  se-bridge policy explain --config consumer.toml --event C7061BAC-... --json
"""


def add_policy_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `policy` sub-command and its `check` and `explain`."""
    top = subparsers.add_parser(
        "policy",
        help="check a policy file, or explain a decision",
        description="Check an approval policy, or explain what it decides about one event.",
        epilog=POLICY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = commands.add_parser(
        "check",
        help="check a policy file and summarise its rules and budgets",
        description="Check a policy file: exit 0 and a summary, or exit 2 and what is wrong.",
    )
    check.add_argument("file", type=Path, metavar="FILE", help="the policy file (YAML)")
    check.set_defaults(func=_check)
    explain = commands.add_parser(
        "explain",
        help="say which rule and budget decide an event, and why",
        description="What the policy decides about one event now, and why: each rule tried, "
        "the action's gate and each budget. Reads a consumer's state (read only) or records.",
        epilog=POLICY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML settings file (the consumer's)"
    )
    explain.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="the policy (setting consumer.policy, SE_BRIDGE_CONSUMER_POLICY; default built in)",
    )
    source = explain.add_mutually_exclusive_group()
    source.add_argument(
        "--state",
        metavar="SPEC",
        help="a consumer's fleet state, read only: sqlite:PATH or tables (setting "
        "consumer.state, SE_BRIDGE_CONSUMER_STATE)",
    )
    source.add_argument(
        "--records",
        type=Path,
        metavar="FILE",
        help="records (JSON or JSONL) to decide from instead of a state",
    )
    explain.add_argument(
        "--event", metavar="EVENTID", help="the event (default with --records: the last one)"
    )
    explain.add_argument("--json", action="store_true", help="print one JSON object")
    explain.set_defaults(func=_explain)

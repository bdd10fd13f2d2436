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
from bridge.config import add_flags
from bridge.policy import file as policyfile
from bridge.policy import schedulefile
from bridge.policy.model import Budget
from bridge.records import parse_time, utc_now

# The settings each command takes as options, in the order --help lists them; their names,
# helps and types are the settings' (bridge.config.Flag).
CONSUME_FLAGS = (
    "consumer.state_dir",
    "consumer.hub",
    "commands.channel",
    "consumer.state",
    "consumer.policy",
    "consumer.sinks",
    "consumer.mode",
    "consumer.metrics_address",
    "people.page_address",
)
LOGGING = ("consumer.log_level", "consumer.log_format")  # bridge.cli adds them to every command
LOOK_FLAGS = ("consumer.state", "consumer.policy")  # status --consumer and policy explain


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `consume` and `policy` sub-commands."""
    add_consume_parser(subparsers)
    add_policy_parser(subparsers)


def add_status_options(status: argparse.ArgumentParser) -> None:
    """`status --consumer`: the consumer's side of `status` (bridge.consumer.status), on the
    agent's `status` sub-command, so that a monitoring system calls one command with one set
    of exit codes for both; without `--consumer` the agent's check runs as before."""
    group = status.add_argument_group(
        "the consumer's side (--consumer: people's pauses, asks and overrides in a fleet "
        "state, read only)"
    )
    group.add_argument(
        "--consumer",
        action="store_true",
        help="check a consumer's fleet state instead of an agent's state directory (--config "
        "is then the consumer's settings file)",
    )
    add_flags(group, *LOOK_FLAGS, before="with --consumer: ")
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
    if args.azure:
        if not _installed("policy check --azure"):
            return 2
        from bridge.consumer import weekaheadcheck  # noqa: PLC0415 - the consumer extra

        return weekaheadcheck.run(args, policy)
    if args.schedule is None:
        return 0
    return _check_schedule(policy.budgets, args.schedule, args.at)


def _check_schedule(budgets: tuple[Budget, ...], path: Path, at: str | None) -> int:
    """The patch schedules of `path` over the next 14 days against `budgets`: exit 1 on a
    break, 2 on a file it cannot read."""
    now = parse_time(at) if at else utc_now()
    if now is None:
        print(f"--at {at!r} is not a time (ISO 8601, such as 2024-06-17T09:00:00Z)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        runs, fleet, configurations = schedulefile.load(path, now)
    except schedulefile.ScheduleError as err:
        print(err, file=sys.stderr)
        return 2
    lines, found = schedulefile.report(budgets, runs, fleet, configurations, now)
    print("\n".join(lines))
    return 1 if found else 0


def _replay(args: argparse.Namespace) -> int:
    if not _installed("policy replay"):
        return 2
    from bridge.consumer import whatif  # noqa: PLC0415 - the consumer extra, checked above

    return whatif.run_replay(args)


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
    add_flags(p, *CONSUME_FLAGS)
    p.set_defaults(func=_consume)


POLICY_EXAMPLES = """\
examples:
  se-bridge policy check /etc/se-bridge/policy.yaml
  se-bridge policy check policy.yaml --schedule schedules.json   # the next 14 days' patch runs
  se-bridge policy check policy.yaml --azure --config consumer.toml   # ... as Azure holds them
  se-bridge policy explain --policy policy.yaml --records /var/lib/se-bridge/records.jsonl
  se-bridge policy explain --state sqlite:/var/lib/se-bridge/fleet.db --event C7061BAC-...
  se-bridge policy explain --config consumer.toml --event C7061BAC-... --json
  se-bridge policy replay --policy new-policy.yaml --records last-month.json
  se-bridge policy replay --records web_0.jsonl --records web_1.jsonl --records decisions.jsonl
"""


def add_policy_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `policy` sub-command and its `check`, `explain` and `replay`."""
    top = subparsers.add_parser(
        "policy",
        help="check a policy file, explain a decision, or replay history through a policy",
        description="Check an approval policy, explain what it decides about one event, or "
        "replay recorded history through it.",
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
    ahead = check.add_mutually_exclusive_group()
    ahead.add_argument(
        "--schedule",
        type=Path,
        metavar="FILE",
        help="also check the patch runs of the next 14 days of these maintenance "
        "configurations (JSON, docs/planned-disruptions.md) against the budgets: exit 1 on a "
        "break",
    )
    ahead.add_argument(
        "--azure",
        action="store_true",
        help="also check the patch runs of the next 14 days of the maintenance configurations "
        "Azure holds (read through Resource Graph as the consumer's identity, of "
        "weekahead.subscriptions) against the budgets, with the VMs of the consumer's fleet "
        "state: exit 1 on a break",
    )
    check.add_argument(
        "--at",
        metavar="TIME",
        help="with --schedule or --azure: from this time (ISO 8601; default: now)",
    )
    check.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="with --azure: TOML settings file (the consumer's)",
    )
    add_flags(check, "consumer.state", before="with --azure: ")
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
    add_flags(explain, "consumer.policy")
    source = explain.add_mutually_exclusive_group()
    add_flags(source, "consumer.state")
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
    add_replay_parser(commands)


def add_replay_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`policy replay`: recorded history through a policy, what would have differed."""
    what = commands.add_parser(
        "replay",
        help="replay recorded history through a policy: what would have been decided otherwise",
        description="Run recorded history (the agents' records and the consumer's Decision "
        "records) through a policy with the consumer's own code, and print what would have "
        "differed from what was decided, per event and per rule, with the budgets' "
        "arithmetic. Writes nothing. Exit 0 when nothing differed, 1 when something did, 2 on "
        "a bad policy, setting or file.",
        epilog=POLICY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML settings file (the consumer's)"
    )
    add_flags(what, "consumer.policy")
    what.add_argument(
        "--records",
        type=Path,
        metavar="FILE",
        action="append",
        required=True,
        help="history: a Log Analytics export (az ... -o json) or jsonl files of the agents' "
        "and the consumer's sinks (repeatable)",
    )
    what.add_argument(
        "--read-lag",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="an event the consumer first decided later than this after its first record was "
        "read late: differences meanwhile are marked, not counted (default 60)",
    )
    what.add_argument("--all", action="store_true", help="list the events decided the same way too")
    what.add_argument("--json", action="store_true", help="print one JSON object")
    what.set_defaults(func=_replay)

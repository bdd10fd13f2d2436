"""`se-bridge policy check POLICY --azure` (issue 40, item 2; docs/planned-disruptions.md
#check-the-schedules-before-they-run): the maintenance configurations Azure holds, read once
through Resource Graph as the consumer's identity (its settings: `--config`, the environment),
their runs of the next 14 days, with Service Health's planned maintenance and AKS's upgrade
notices overlapping them, checked against POLICY's budgets with the VMs of the consumer's fleet
state (read only), printed as `policy check --schedule` prints a file's: a BREAK line per
run and group, exit 1 when there is one, 2 when the settings or Azure cannot be read.
"""

from __future__ import annotations

import argparse
import sys

from bridge.config import Config, ConfigError, given
from bridge.consumer import wiring
from bridge.consumer.core import Consumer
from bridge.consumer.explain import NoCommands, ignore_decisions
from bridge.consumer.weekaheadpass import check_azure
from bridge.policy import schedulefile
from bridge.policy.model import FleetView, Policy
from bridge.records import parse_time, utc_now
from bridge.redact import describe
from bridge.retry import DeliveryError


def run(args: argparse.Namespace, policy: Policy) -> int:
    now = parse_time(args.at) if args.at else utc_now()
    if now is None:
        print(f"--at {args.at!r} is not a time (ISO 8601, such as 2024-06-17T09:00:00Z)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        config = wiring.load_config(args.config, flags=given(args, "consumer.state"))
        runs, others, fleet, problems = check_azure(config, _fleet(config, policy), now)
    except ConfigError as err:
        print(f"se-bridge: configuration error: {err}", file=sys.stderr)
        return 2
    except DeliveryError as err:
        print(
            "se-bridge: cannot read the maintenance configurations through Resource Graph: "
            f"{describe(err)}",
            file=sys.stderr,
        )
        return 2
    for problem in problems:
        print(f"WARNING {problem}", file=sys.stderr)
    configurations = len({run.configuration.lower() for run in runs})
    lines, found = schedulefile.report(policy.budgets, runs, fleet, configurations, now, others)
    print("\n".join(lines))
    return 1 if found else 0


def _fleet(config: Config, policy: Policy) -> FleetView:
    """The VMs the consumer's fleet state knows (read only), as its budgets group them."""
    store = wiring.build_store(wiring.state_spec(config), config)
    consumer = Consumer(store, NoCommands(), policy, ignore_decisions, config.consumer)
    try:
        return consumer.fleet_view()
    finally:
        consumer.close()

"""The policy the consumers run during a load test, and an independent reading of it.

The consumers load `POLICY_YAML` with the product's own policy reader. The checks in
`measure` must not trust that same code, so this module restates the few rules and budgets
in plain Python over the fleet description (`first_rule`, `group_of`, `limit`): a decision
the consumer got wrong shows up as a difference between the two.

Budgets: at most 20% of each scale set (`max_percent`), at most 2 VMs of each availability
set (`max_vms`, over the `avset` tag since IMDS does not name availability sets). Rules:
approve what users asked for, every Freeze, Spot evictions, and platform reboots of the
scale sets tagged `maintenance: rolling`; hold everything else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tests.benchmarks.loadgen.fleet import Vm

POLICY_YAML = """\
# se-bridge load generator policy (tests/benchmarks/loadgen/policy.py)
version: 1
budgets:
  - name: scale-set-20pct
    group: scale_set
    max_percent: 20
  - name: availability-set-2
    group: tag:avset
    max_vms: 2
rules:
  - name: user-initiated
    match: {event_source: User}
    action: approve
  - name: freeze
    match: {event_type: Freeze}
    action: approve
  - name: spot-eviction
    match: {event_type: Preempt}
    action: approve
  - name: rolling-reboot
    match:
      event_type: Reboot
      event_source: Platform
      vm: {tags: {maintenance: rolling}}
    action: approve
  - name: everything-else
    action: hold
"""


@dataclass(frozen=True)
class BudgetSpec:
    name: str
    group: str  # "scale_set" or "tag:avset"
    max_vms: int | None = None
    max_percent: float | None = None

    def limit(self, size: int) -> int:
        """docs/policy.md#budgets: max_vms, or max_percent of the group rounded down, >= 1."""
        if self.max_vms is not None:
            return self.max_vms
        return max(1, math.floor((self.max_percent or 0) * size / 100))


BUDGETS = (
    BudgetSpec("scale-set-20pct", "scale_set", max_percent=20),
    BudgetSpec("availability-set-2", "tag:avset", max_vms=2),
)
APPROVING_RULES = ("user-initiated", "freeze", "spot-eviction", "rolling-reboot")
HOLD_RULE = "everything-else"


def group_of(budget: BudgetSpec, vm: Vm) -> str | None:
    """The group `vm` is in for `budget`, as Azure identifies the set; None when in none."""
    if budget.group == "scale_set":
        key = vm.scale_set_key
        return None if key is None else "/".join(key)
    if budget.group == "tag:avset":
        return vm.tag("avset")
    raise ValueError(f"unknown budget group {budget.group}")


def first_rule(event_type: str, source: str, vms: Sequence[Vm]) -> str:
    """The first rule of POLICY_YAML that matches the event as it truly is."""
    kind, origin = event_type.lower(), source.lower()
    if origin == "user":
        return "user-initiated"
    if kind == "freeze":
        return "freeze"
    if kind == "preempt":
        return "spot-eviction"
    rolling = bool(vms) and all(vm.tag("maintenance") == "rolling" for vm in vms)
    if kind == "reboot" and origin == "platform" and rolling:
        return "rolling-reboot"
    return HOLD_RULE

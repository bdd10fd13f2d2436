"""How the policy's explanations name VMs, nodes and times: a few names, then how many
more, so that a placement group's 100 names do not bury the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta

from bridge.policy.model import (
    FleetView,
    Verdict,
)


def node_names(fleet: FleetView, vm_ids: Iterable[str]) -> list[str]:
    """The node names of VMs (their VM names where their agents name no node)."""
    found = (fleet.vms.get(v) for v in vm_ids)
    return [vm.node_name or vm.name for vm in found if vm is not None]


def took(span: timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    return f"{seconds // 60} min" if seconds >= 60 else f"{seconds} s"


LISTED_NAMES = 5  # a placement group's 100 names would bury the reason


def listed(template: str, items: Iterable[str], fleet: FleetView | None = None) -> list[str]:
    """`template` said of the VMs `items` (VmIds named as their VMs, or names), a few of them
    by name; nothing when there are none."""
    names = [fleet.vms[v].name if fleet and v in fleet.vms else v for v in items]
    if not names:
        return []
    shown = ", ".join(names[:LISTED_NAMES])
    if len(names) > LISTED_NAMES:
        shown += f" and {len(names) - LISTED_NAMES} more"
    one = len(names) == 1
    return [
        template.format(
            names=shown,
            VM="VM" if one else "VMs",
            has="has" if one else "have",
            it="it" if one else "they",
        )
    ]


def explained(verdict: Verdict, notes: list[str]) -> Verdict:
    """`verdict` with `notes` as its explanation, a line a step."""
    return replace(verdict, explanation=tuple(notes))

"""What a notification says, whatever the target's format."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

NoticeKind = Literal[
    "asked",
    "approved",
    "held",
    "timed_out",
    "override",
    "paused",
    "resumed",
    "rebalance",
    "patch_over_budget",
    "patch_cancelled",
]


@dataclass(frozen=True)
class Notice:
    """One thing a person should hear about, for the target named `target`.

    `event_id` and `event_type` are None for a pause or resume of the fleet; `explanation` is
    the policy's, a line each; `by` the person who decided (their name), None when the policy
    did; `link` the approval page's address for the event (the Notifier fills it from
    notify.page_url when None).
    """

    kind: NoticeKind
    target: str
    event_id: str | None
    event_type: str | None
    vms: tuple[str, ...]
    not_before: datetime | None
    explanation: tuple[str, ...]
    by: str | None
    reason: str | None
    link: str | None
    at: datetime
    more_vms: int = 0  # VMs it concerns beyond those `vms` names (listed: a patch run's thousands)


# A notice names at most this many VMs: a patch run of a 10,000-VM scale set is one notice, and
# every name would make a webhook body of hundreds of kilobytes no person reads.
MAX_VMS = 20


def listed(names: Iterable[str], limit: int = MAX_VMS) -> tuple[tuple[str, ...], int]:
    """The first `limit` of `names`, in their order, and how many more there are."""
    every = tuple(names)
    return every[:limit], max(0, len(every) - limit)

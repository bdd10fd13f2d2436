"""ARM's acknowledge as the carrier of last resort (issue 36, docs/second-source.md).

The policy picks the carrier (bridge.policy.carrier.choose_target): a live agent always, and
only when none can (no agent on any VM of the event, or each one silent or refusing) ARM's
acknowledge, `ARM_CARRIER`, for an event Event Grid told of. Everything before the send is the
same as for an agent: the verdict, the budgets, the ledger entry written first with its ETag,
the Decision record, the command kept for a resend (bridge.consumer.act). This sender stands
in front of the channel: a command whose target is ARM_CARRIER is not put on any queue but
acknowledged through ARM, at the resource the event's Event Grid view names; every other
command goes to the channel unchanged.

Its answer is folded into the ledger as an agent's Approval record is (the entry confirmed, or
refused so the next pass decides again, ARM being tried once), and said in an Approval record
with ApprovalSource ARM and a null VmId. A failure (ARM unreachable, throttled past the
client's own retries, the identity refused) is an ERROR and a count, and raises: the entry
stays unsent and the next pass acknowledges again, with the same CommandId and the same
event. Acknowledging an event twice approves it once, so a retry is never a second approval.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Protocol

from bridge import recordtypes as rt
from bridge.channels import CommandSender
from bridge.cloud.armack import Acknowledged
from bridge.commands.message import Command
from bridge.config import Config
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.fleet import Fleet
from bridge.policy.model import ARM_CARRIER
from bridge.records import ApprovalOutcome, Origin, RecordView, VmIdentity, approval_record
from bridge.redact import describe
from bridge.retry import PermanentError

log = logging.getLogger(__name__)


class Acknowledger(Protocol):
    def acknowledge(self, resource_id: str, event_ids: Sequence[str]) -> Acknowledged: ...

    def close(self) -> None: ...


class ArmCarrier:
    """A CommandSender: ARM_CARRIER's commands to ARM's acknowledge, the rest to `inner`."""

    def __init__(  # noqa: PLR0917 - the carrier's parts, each swapped by tests
        self,
        inner: CommandSender,
        arm: Acknowledger,
        fleet: Fleet,
        answered: Callable[[Sequence[RecordView]], object],
        emit: Callable[[Sequence[rt.Approval]], None],
        now: Callable[[], datetime],
        host_name: str = "consumer",
    ) -> None:
        """`answered`: folds an answer into the ledger (ApprovalLedger.note_approvals);
        `emit`: where the Approval records go (the consumer's sinks)."""
        self.inner, self.arm, self.fleet = inner, arm, fleet
        self._answered, self._emit, self._now = answered, emit, now
        self._origin = Origin(VmIdentity(), host_name)
        self.outcomes: Counter[str] = Counter()  # approved, refused, failed (the metrics)

    def send(self, command: Command, time_to_live: float) -> None:
        if command.vm_id != ARM_CARRIER:
            self.inner.send(command, time_to_live)
            return
        try:
            said = self.arm.acknowledge(self._resource(command), [command.event_id])
        except Exception as err:
            self.outcomes["failed"] += 1
            log.error(
                "ARM's acknowledge of event %s (command %s) failed: %s; the approval "
                "stays decided and is sent again at the next pass (same event, same "
                "command)",
                command.event_id,
                command.command_id,
                describe(err, with_type=True),
            )
            raise
        refused = said.refused.get(command.event_id)
        outcome: rt.ApprovalOutcome = "Refused" if refused else "Approved"
        self.outcomes[outcome.lower()] += 1
        now = self._now()
        latency = max(0, round((now - command.issued_at).total_seconds() * 1000))
        approved = "ARM's acknowledge approved the event (no live agent could carry it)"
        detail = f"ARM refused the acknowledge: {refused}" if refused else approved
        record = approval_record(
            self._origin,
            ApprovalOutcome(
                command.event_id,
                None,
                command.document_incarnation,
                command.command_id,
                "ARM",
                outcome,
                detail,
                command.rule,
                command.issued_at,
                None if refused else latency,
            ),
            now,
        )
        # The ledger matches an answer to its entry by CommandId and target.
        self._answered([{**record, "VmId": ARM_CARRIER}])
        self._emit([record])
        if refused:
            log.warning(
                "ARM refused to acknowledge event %s: %s; the next pass decides it again "
                "(a live agent if one appears; ARM is not asked again)",
                command.event_id,
                refused,
            )
        else:
            log.info(
                "approved event %s through ARM's acknowledge (%d ms after the decision)",
                command.event_id,
                latency,
            )

    def _resource(self, command: Command) -> str:
        """The compute resource Event Grid named for the event: what ARM acknowledges at."""
        doc = self.fleet.event(fs.event_key(command.event_id))
        azure = fs.event_document(doc).get("azure") if doc is not None else None
        resource = azure.get("resource_id") if azure else None
        if not resource:
            raise PermanentError(f"Event Grid named no resource for event {command.event_id}")
        return resource

    def close(self) -> None:
        try:
            self.arm.close()
        finally:
            self.inner.close()


def wanted(config: Config) -> bool:
    """Whether ARM's acknowledge may carry what no live agent can (eventgrid.acknowledge)."""
    return config.eventgrid.enabled and config.eventgrid.acknowledge


def install(
    consumer: Consumer,
    arm: Acknowledger,
    emit: Callable[[Sequence[rt.Approval]], None],
    now: Callable[[], datetime],
    host_name: str,
) -> ArmCarrier:
    """Put ARM's acknowledge in front of `consumer`'s channel, and let its policy choose it
    as the carrier of last resort (eventgrid.acknowledge)."""
    carrier = ArmCarrier(
        consumer.sender, arm, consumer.fleet, consumer.ledger.note_approvals, emit, now, host_name
    )
    consumer.sender = consumer.dispatch.sender = carrier
    consumer.decider.last_resort = True
    return carrier

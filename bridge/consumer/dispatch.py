"""The effects of a decision, given as values (bridge.consumer.verdicts builds them): say a
Decision record (and remember it on its event, notify), send a command, resend an approval
that a crash left unsent. The ledger is written by the decision pass (bridge.consumer.act),
which stores an approval's entry before it is said and sent, and marks it sent after.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from bridge import recordtypes as rt
from bridge.channels import CommandSender
from bridge.commands import message as commands
from bridge.consumer.decisionrecord import Voice, pause_record
from bridge.consumer.fleet import Fleet
from bridge.consumer.ledger import Emit, LedgerEntry
from bridge.consumer.notices import EVERY_TARGET, NoticeQueue
from bridge.consumer.people.operatorlog import OperatorAction, pause_of
from bridge.consumer.state import Doc
from bridge.consumer.verdicts import Said
from bridge.notify.notice import Notice
from bridge.policy.model import Policy
from bridge.records import parse_time
from bridge.redact import describe

log = logging.getLogger(__name__)
# Seconds a command stays in its channel past its ExpiresAt: an agent reads once more as
# its last Scheduled event leaves, within a poll of the start.
LATE_GRACE = 60.0

# An unsent entry this young is most likely another consumer's, between its ledger write and
# its send: left to it, or every such overlap would send the same command twice.
RESEND_UNSENT_AFTER = timedelta(seconds=10)


class Dispatch:
    """Says Decision records, notifies, and sends commands: what a decision does outside
    the ledger, each given as a value."""

    def __init__(
        self,
        fleet: Fleet,
        sender: CommandSender,
        emit: Emit,
        policy: Policy,
        host_name: str,
        *,
        mode: str = "normal",
        notifier: NoticeQueue | None = None,
    ) -> None:
        self.fleet = fleet
        self.notifier = notifier  # None: nobody is notified (an ask still waits for a person)
        self.sender = sender
        self.emit = emit
        # Shadow: everything but the send. The entry is marked sent and confirmed at once, as
        # a cooperative agent would confirm it, so the budgets play out as they would.
        self.shadow = mode == "shadow"
        self.voice = Voice(policy.source, host_name, self.shadow)  # what its pauses say
        # CommandIds this instance wrote to the ledger and has not yet seen marked sent.
        self._unfinished: set[str] = set()

    def say(self, said: Said, event_doc: Doc | None = None) -> None:
        """Emit the Decision record, then remember it on its event so that a standing
        decision is not said again, and give its notice.

        `event_doc`: the event as just read, most likely current: written over without
        reading it again (if it changed since, the write conflicts and it is read again).
        A record that names a command is an approval's, stored in the ledger and sent next:
        until it is marked sent, this consumer resends it at once (`resend`).
        """
        record = said.record
        if record["CommandId"] is not None:
            self._unfinished.add(record["CommandId"])
        self.emit([record])
        self.fleet.remember(said.key, said.remember, event_doc)
        if said.warning is not None:
            log.warning("%s", said.warning)
        if said.notice is not None:
            self.notify(said.notice)
        log.info(
            "event %s (%s): %s by rule %s: %s",
            record["EventId"],
            record["EventType"],
            record["DecisionAction"],
            record["DecisionRule"],
            record["DecisionReason"],
        )

    def resend(self, key: str, entry: LedgerEntry, now: datetime) -> commands.Command | None:
        """A failure between the ledger write and the send left a command unsent: the
        command to send again (its Decision said again too, same RecordId, in case it was
        the emit that failed); None when it is not to be resent (yet)."""
        if entry.get("origin") != "approved" or entry.get("sent") or not entry.get("command"):
            return None
        issued = parse_time(entry.get("issued_at"))
        ours = entry.get("command_id") in self._unfinished
        if not ours and issued is not None and now - issued < RESEND_UNSENT_AFTER:
            return None
        log.info("resending the approval of event %s, which was decided but not sent", key)
        if "decision" in entry:
            self.emit([entry["decision"]])
        return commands.parse(entry["command"])

    def send(self, command: commands.Command, now: datetime) -> None:
        """Send `command` (not in shadow mode); a failure leaves its entry unsent: the next
        pass sends it again."""
        # Past its ExpiresAt (the event's NotBefore, when the platform starts the event) the
        # command stays a while, so an agent that reads it after the event went ahead says Late.
        ttl = max(0.0, (command.expires_at - now).total_seconds()) + LATE_GRACE
        if not self.shadow:
            self.sender.send(command, ttl)

    def sent(self, command: commands.Command) -> None:
        """`command`'s entry is marked sent."""
        self._unfinished.discard(command.command_id)
        log.info(
            "%s the approval of event %s to VM %s (%s)",
            "shadow mode: did not send" if self.shadow else "sent",
            command.event_id,
            command.vm_id,
            command.reason,
        )

    def granted(self, command: commands.Command) -> None:
        """`command`, a Prepare, was sent."""
        log.info(
            "%s the drain of event %s to VM %s (Prepare: %s)",
            "shadow mode: did not grant" if self.shadow else "granted",
            command.event_id,
            command.vm_id,
            command.reason,
        )

    def failing(self) -> tuple[str, ...]:
        """The notification targets failing for good now (a Decision's NotifyFailing)."""
        return self.notifier.failing() if self.notifier is not None else ()

    def notify(self, notice: Notice) -> None:
        """Hand `notice` to the notifier, which never blocks; a notifier that breaks does
        not stop a decision."""
        # A shadow consumer tells nobody: people answer the live one, which asks them too.
        if self.notifier is None or self.shadow:
            return
        every = notice.target == EVERY_TARGET
        try:
            for target in self.notifier.targets if every else (notice.target,):
                self.notifier.notify(replace(notice, target=target))
        except Exception as err:
            log.error(
                "the %s notice about %s to %s could not be queued: %s",
                notice.kind,
                notice.event_id or "the fleet",
                notice.target,
                describe(err, with_type=True),
            )

    def operated(self, action: OperatorAction, now: datetime) -> None:
        """Say a pause or a resume a person made: a Decision record and a notice."""
        voice = self.voice
        record = operator_record(
            action,
            policy_source=voice.policy_source,
            host_name=voice.host_name,
            now=now,
            shadow=voice.shadow,
            notify_failing=list(self.failing()) or None,
        )
        self.emit([record])
        log.warning(
            "%s: %s by %s (%s): %s",
            record["EventId"],
            record["DecisionAction"],
            action.by.name,
            action.by.object_id,
            record["DecisionReason"],
        )
        self.notify(
            Notice(
                "paused" if action.kind == "pause" else "resumed",
                EVERY_TARGET,
                None,
                None,
                (),
                None,
                (record["DecisionReason"],),
                action.by.name,
                action.reason,
                None,
                now,
            )
        )


def operator_record(
    action: OperatorAction,
    *,
    policy_source: str,
    host_name: str,
    now: datetime,
    shadow: bool = False,
    notify_failing: list[str] | None = None,
) -> rt.Decision:
    """The Decision record of a pause or a resume (bridge.consumer.decisionrecord)."""
    return pause_record(
        pause_of(action),
        resumed=action.kind != "pause",
        voice=Voice(policy_source, host_name, shadow),
        now=now,
        failing=notify_failing or (),
    )

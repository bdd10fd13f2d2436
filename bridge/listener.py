"""The agent's command listener: reads this VM's command channel and acts on approvals.

It reads on its own thread, so a slow Storage Queue never delays an IMDS poll, and only
while it has a reason to: every `commands.poll_interval` while the current document
holds a Scheduled event, every `commands.idle_interval` otherwise (0: not at all, since
each read is a billed transaction on every VM of the fleet). The agent wakes it the
moment a Scheduled event appears.

Each command is checked (DESIGN 3.2) and then approved through the shared Approver,
which checks the event against a fresh IMDS document. A message is deleted once acted
on or refused; one IMDS could not take is left to reappear after the visibility timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from bridge import commands
from bridge.agentapproval import Approver, Attempt, Request
from bridge.channels import CommandInbox, Received, inbox
from bridge.commands import Command, CommandError
from bridge.config import CommandsSettings, Config
from bridge.records import ApprovalOutcome, iso
from bridge.retry import Backoff, DeliveryError

log = logging.getLogger(__name__)
BATCH = 16  # one command per pending event: a batch this size is never full in practice
MAX_BACKOFF = 60.0
FIRST_BACKOFF = 1.0
Opener = Callable[[str], CommandInbox]


class CommandListener:
    def __init__(
        self,
        settings: CommandsSettings,
        open_inbox: Opener,
        approver: Approver,
        now: Callable[[], datetime],
    ) -> None:
        self._settings, self._open, self._approver, self._now = settings, open_inbox, approver, now
        self._vm_id: str | None = None
        self._scheduled = False
        self._inbox: tuple[str, CommandInbox] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reads = _Streak("read the command channel")
        self._deletes = _Streak("delete a command message")
        self._thread = threading.Thread(target=self._run, name="commands", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def update(self, vm_id: str | None, scheduled: bool) -> None:
        """What the agent knows now: this VM's VmId and whether an event is Scheduled."""
        wake = (scheduled and not self._scheduled) or vm_id != self._vm_id
        self._vm_id, self._scheduled = vm_id, scheduled
        if wake:
            self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._inbox is not None and not self._thread.is_alive():
            self._inbox[1].close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before reading: an update from now on cuts the wait short
            try:
                delay = self.read_once()
            except Exception:  # the listener must outlive any bug in one read
                log.exception("unexpected error in the command listener; reading again later")
                delay = self._settings.poll_interval
            self._wake.wait(delay)

    def interval(self) -> float | None:
        """Seconds until the next read; None: no read until the agent wakes the listener."""
        if self._vm_id is None:
            return None
        if self._scheduled:
            return self._settings.poll_interval
        return self._settings.idle_interval or None

    def read_once(self) -> float | None:
        """One read of the channel, if one is due at all; the wait before the next."""
        interval, vm_id = self.interval(), self._vm_id
        if interval is None or vm_id is None:
            return None
        try:
            channel = self._channel(vm_id)
            messages = channel.receive(BATCH)
        except (DeliveryError, ValueError) as err:
            return max(interval, self._reads.failed(err))
        self._reads.succeeded()
        for message in messages:
            if self._stop.is_set():
                break  # unacted messages reappear after the visibility timeout
            if self.handle(message, vm_id):
                self._delete(channel, message)
        return interval

    def _channel(self, vm_id: str) -> CommandInbox:
        if self._inbox is None or self._inbox[0] != vm_id:
            if self._inbox is not None:
                self._inbox[1].close()
                self._inbox = None
            self._inbox = (vm_id, self._open(vm_id))
        return self._inbox[1]

    def _delete(self, channel: CommandInbox, message: Received) -> None:
        try:
            channel.delete(message)
        except DeliveryError as err:
            self._deletes.failed(err)  # it reappears; acting on it again is harmless
            return
        self._deletes.succeeded()

    # --- one command ------------------------------------------------------------------

    def handle(self, message: Received, vm_id: str) -> bool:
        """Act on one message; True when it is done with and may be deleted."""
        try:
            command = commands.parse(message.text)
        except CommandError as err:
            self._refuse(None, f"the message is not a valid command: {err}")
            return True
        if command.vm_id.strip().lower() != vm_id.strip().lower():
            self._refuse(command, f"it is for VM {command.vm_id}, this VM is {vm_id}")
            return True
        if self._approver.approved(command.event_id):
            # Checked before expiry: a late redelivery of a command already acted on is no news.
            log.info("command %s: event %s was approved already; deleted the repeat",
                     command.command_id, command.event_id)  # fmt: skip
            return True
        if command.expired(self._now()):
            self._refuse(command, f"it expired at {iso(command.expires_at)}")
            return True
        return self._approve(command)

    def _approve(self, command: Command) -> bool:
        attempt = self._approver.attempt(_request(command))
        if attempt.kind == "Refused" and attempt.outcome is not None:
            self._approver.record(attempt.outcome)
            log.info("refused command %s: %s", command.command_id, attempt.detail)
        elif attempt.kind in ("Retry", "Busy"):
            level = logging.WARNING if attempt.kind == "Retry" else logging.INFO
            log.log(level, "command %s for event %s left in the channel for the next read "
                    "(in %gs): %s", command.command_id, command.event_id,
                    self._settings.visibility_timeout, attempt.detail)  # fmt: skip
            return False
        else:
            _log_attempt(command, attempt)
        return True

    def _refuse(self, command: Command | None, why: str) -> None:
        outcome = ApprovalOutcome(
            event_id=command.event_id if command else None,
            event_type=None,
            incarnation=command.document_incarnation if command else None,
            command_id=command.command_id if command else None,
            source="Central",
            outcome="Refused",
            detail=why,
            rule=command.rule if command else None,
            issued_at=command.issued_at if command else None,
        )
        self._approver.record(outcome)
        log.info("refused command %s: %s", command.command_id if command else "(malformed)", why)


def _request(command: Command) -> Request:
    return Request(
        event_id=command.event_id,
        command_id=command.command_id,
        source="Central",
        rule=command.rule or None,
        reason=f"rule {command.rule or '(none)'}: {command.reason}",
        issued_at=command.issued_at,
    )


def _log_attempt(command: Command, attempt: Attempt) -> None:
    outcome = attempt.outcome
    if attempt.kind == "Approved" and outcome is not None:
        log.info("approved event %s (%s) for the fleet: rule %s, %s ms after the consumer "
                 "issued it", command.event_id, outcome.event_type, command.rule or "(none)",
                 outcome.latency_ms)  # fmt: skip
    elif attempt.kind == "Failed":
        log.error("could not approve event %s for command %s: %s; the event starts at its "
                  "NotBefore", command.event_id, command.command_id, attempt.detail)  # fmt: skip
    else:
        log.info("command %s: %s; deleted the repeat", command.command_id, attempt.detail)


class _Streak:
    """Failures of one kind: a WARNING at the first of a streak, backoff, a line at the end."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._failures = 0
        self._backoff = Backoff(initial=FIRST_BACKOFF, maximum=MAX_BACKOFF)

    def failed(self, err: Exception) -> float:
        self._failures += 1
        if self._failures == 1:
            log.warning("cannot %s: %s; retrying with backoff (said once until it works)",
                        self._what, err)  # fmt: skip
        return self._backoff.delay_for(err)

    def succeeded(self) -> None:
        if self._failures:
            log.info("could %s again after %d failures", self._what, self._failures)
        self._failures = 0
        self._backoff.reset()


def build(
    config: Config, approver: Approver, now: Callable[[], datetime], open_inbox: Opener | None
) -> CommandListener | None:
    """The listener `commands.channel` asks for; None when it names no channel."""
    spec = config.commands.channel
    if not spec:
        return None
    opener = open_inbox or (lambda vm_id: inbox(spec, config, vm_id))
    return CommandListener(config.commands, opener, approver, now)


def has_scheduled(state: dict[str, object] | None) -> bool:
    """Whether the agent's state holds an event still Scheduled, so a command may come."""
    events = (state or {}).get("events")
    if not isinstance(events, dict):
        return False
    return any(
        isinstance(e, dict) and str(e.get("EventStatus") or "").strip().lower() == "scheduled"
        for e in events.values()
    )

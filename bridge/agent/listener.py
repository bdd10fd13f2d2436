"""The agent's command listener: reads this VM's command channel and acts on approvals.

It reads on its own thread, so a slow Storage Queue never delays an IMDS poll, and only
while it has a reason to: every `commands.poll_interval` while the current document
holds a Scheduled event that affects this VM (or may: AffectsThisVm unknown), every
`commands.others_interval` while its Scheduled events are all other VMs' (Azure shows an
event to every VM of its availability set or placement group, and the consumer sends a
command to one of those only when no affected VM can carry it), every
`commands.idle_interval` otherwise (0: not at all, since each read is a billed transaction
on every VM of the fleet). The agent wakes it the moment such an event appears, and for
FIRST_READS_FOR after an event that affects this VM appears it reads every FIRST_READS_EVERY:
the consumer's command lands within a second of the agent's record of the event, and the next
read a whole poll_interval after the first one left it waiting for nothing (issue 27; benchmark
3's figures are in docs/capacity.md#figures-behind-the-codes-choices). That costs a few more
reads per event, on the VM the event names only, never on its neighbours. It reads once
more when the last Scheduled event leaves (it Started or ended): a command queued since the
last read (the consumer leaves it in the channel a minute past its ExpiresAt) is then read
and refused as Late, so the consumer and its operators learn that the approval never
reached IMDS, instead of the command lying unread until it expires.

Each command is checked (docs/contracts.md#command): its form, signature and VmId here, the
rest by the shared Approver, to which a verified command is handed once (`Approver.consider`)
and which checks the event against a fresh IMDS document. A message is deleted once acted
on or refused; one IMDS could not take is left to reappear after the visibility timeout.

Checks come before anything touches IMDS, in this order, each refusal an Approval record
whose ApprovalDetail starts with its code: Malformed, Unsigned, UnknownKey, BadSignature
(not signed by a key in commands.verify_key), OtherVm (for another VmId), Replayed (its
CommandId was approved, refused or failed here before), Expired (Late when the agent's
last look found the event Started or gone: see below). The first four and
OtherVm come from a sender nobody vouches for: their record leaves CommandId and EventId
empty (the claimed ones are in the detail), so a forged message cannot mark the
consumer's real command as refused. A Replayed record does the same, so it neither
changes the consumer's ledger nor folds into the first record of that CommandId.

A message the channel hands over again after the visibility timeout (dequeue count above
1: this agent read it before and stopped before deleting it) whose CommandId was already
handled is not a replay: its record was written with the seen mark, in one transaction,
so it is deleted without a second record. A fresh message (dequeue count 1) with a
handled CommandId is a replay, whoever sent it: recorded as Replayed and deleted.

Against the fresh document then: the event must be there and Scheduled (Late when it has
Started, or has left the document after this agent saw it: the approval came too late, and
the consumer asks no other VM) and, when the command carries a ResourcesDigest, name the
same VMs (ResourcesChanged otherwise: the consumer decided on other Resources and decides
again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from bridge.agent.approver import Approver, Attempt, untrusted
from bridge.channels import CommandInbox, Received, check_inbox, inbox
from bridge.commands import message as commands
from bridge.commands.message import Command, CommandError
from bridge.commands.signing import SigningError, Verifier, load_signer, load_verifier
from bridge.config import CommandsSettings, Config, ConfigError
from bridge.records import ApprovalOutcome
from bridge.retry import Backoff, DeliveryError, FailureStreak

log = logging.getLogger(__name__)
BATCH = 16  # one command per pending event: a batch this size is never full in practice
MAX_BACKOFF = 60.0
FIRST_BACKOFF = 1.0
FIRST_READS_EVERY = 0.2  # seconds: see the module's docstring
FIRST_READS_FOR = timedelta(seconds=3)
Opener = Callable[[str], CommandInbox]


class CommandListener:
    def __init__(
        self,
        settings: CommandsSettings,
        open_inbox: Opener,
        approver: Approver,
        now: Callable[[], datetime],
        verifier: Verifier | None = None,
    ) -> None:
        self._settings, self._open, self._approver, self._now = settings, open_inbox, approver, now
        self._verifier = verifier  # None: unsigned commands accepted (commands.allow_unsigned)
        self._vm_id: str | None = None
        self._scheduled = False
        self._affects = False  # a Scheduled event affects this VM (not only its neighbours)
        self._own: frozenset[str] = frozenset()  # the EventIds of those
        self._first_reads_until: datetime | None = None
        self._last_read = False  # owed: the last Scheduled event left since the last read
        self._inbox: tuple[str, CommandInbox] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._reads = _Streak("read the command channel")
        self._deletes = _Streak("delete a command message")
        self._thread = threading.Thread(target=self._run, name="commands", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def update(
        self,
        vm_id: str | None,
        scheduled: bool,
        affects: bool = True,
        own: frozenset[str] = frozenset(),
    ) -> None:
        """What the agent knows now: this VM's VmId, whether an event is Scheduled, whether
        one of those affects this VM, and their EventIds (`scheduled_here`, `own_events`)."""
        affects = scheduled and affects
        appeared = bool(own - self._own)
        if appeared:
            self._first_reads_until = self._now() + FIRST_READS_FOR
        if self._scheduled and not scheduled:
            self._last_read = True
        wake = (
            (scheduled != self._scheduled)
            or (affects and not self._affects)
            or appeared
            or vm_id != self._vm_id
        )
        self._vm_id, self._scheduled, self._affects, self._own = vm_id, scheduled, affects, own
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
        if self._affects:
            until = self._first_reads_until
            if until is not None and self._now() < until:
                return min(FIRST_READS_EVERY, self._settings.poll_interval)
            return self._settings.poll_interval
        if self._scheduled:
            return max(self._settings.poll_interval, self._settings.others_interval)
        return self._settings.idle_interval or None

    def read_once(self) -> float | None:
        """One read of the channel, if one is due at all; the wait before the next."""
        interval, vm_id = self.interval(), self._vm_id
        last, self._last_read = self._last_read, False
        if vm_id is None or (interval is None and not last):
            return None
        try:
            channel = self._channel(vm_id)
            messages = channel.receive(BATCH)
        except (DeliveryError, ValueError) as err:
            self._last_read = self._last_read or last  # still owed
            return max(interval or 0.0, self._reads.failed(err))
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
        command = self._trusted(message.text, vm_id)
        if command is None:
            return True
        attempt = self._approver.consider(command, redelivered=message.dequeue_count > 1)
        if attempt.kind in ("Retry", "Busy"):
            level = logging.WARNING if attempt.kind == "Retry" else logging.INFO
            log.log(
                level,
                "command %s for event %s left in the channel for the next read (in %gs): %s",
                command.command_id,
                command.event_id,
                self._settings.visibility_timeout,
                attempt.detail,
            )
            return False
        _log_attempt(command, attempt)
        return True

    def _trusted(self, text: str, vm_id: str) -> Command | None:
        """The command in `text` if it is well formed, signed and for this VM; else refused."""
        try:
            command = commands.parse(text)
        except CommandError as err:
            self._refuse_untrusted(None, "Malformed", f"the message is not a valid command: {err}")
            return None
        refusal = self._verifier.check(command) if self._verifier is not None else None
        if refusal is not None:
            self._refuse_untrusted(command, refusal.code, refusal.why)
            return None
        if command.vm_id.strip().lower() != vm_id.strip().lower():
            self._refuse_untrusted(
                command, "OtherVm", f"it is for VM {command.vm_id}, this VM is {vm_id}"
            )
            return None
        return command

    def _refuse_untrusted(self, command: Command | None, code: str, why: str) -> None:
        """A refusal whose ids nobody vouches for: named in the detail, not in the fields."""
        outcome = untrusted(command, code, why)
        self._approver.record(outcome)
        level = logging.INFO if code in ("Replayed", "OtherVm") else logging.WARNING
        log.log(level, "refused a command: %s", outcome.detail)


def _log_refusal(command: Command, outcome: ApprovalOutcome) -> None:
    if outcome.late is not None:
        log.warning(
            "command %s came too late to approve its event: %s", command.command_id, outcome.detail
        )
    else:
        log.info("refused command %s: %s", command.command_id, outcome.detail)


def _log_attempt(command: Command, attempt: Attempt) -> None:
    outcome = attempt.outcome
    if attempt.kind == "Refused" and outcome is not None:
        _log_refusal(command, outcome)
    elif attempt.kind == "Replayed":
        log.info("refused a command: %s", attempt.detail)
    elif attempt.kind == "Redelivered":
        log.info(
            "command %s came back after the visibility timeout, %s: deleted it (its "
            "record was written the first time)",
            command.command_id,
            attempt.detail,
        )
    elif attempt.kind == "Approved" and outcome is not None:
        log.info(
            "approved event %s (%s) for the fleet: rule %s, %s ms after the consumer issued it",
            command.event_id,
            outcome.event_type,
            command.rule or "(none)",
            outcome.latency_ms,
        )
    elif attempt.kind == "Prepared":
        log.info("command %s: %s", command.command_id, attempt.detail)
    elif attempt.kind == "Failed":
        log.error(
            "could not approve event %s for command %s: %s; the event starts at its NotBefore",
            command.event_id,
            command.command_id,
            attempt.detail,
        )
    else:
        log.info("command %s: %s; deleted the repeat", command.command_id, attempt.detail)


class _Streak:
    """Failures of one kind: a WARNING at the first of a streak, backoff, a line at the end."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._streak = FailureStreak(Backoff(initial=FIRST_BACKOFF, maximum=MAX_BACKOFF))

    def failed(self, err: Exception) -> float:
        first, delay = self._streak.failed(err)
        if first:
            log.warning(
                "cannot %s: %s; retrying with backoff (said once until it works)", self._what, err
            )
        return delay

    def succeeded(self) -> None:
        if ended := self._streak.succeeded():
            log.info("could %s again after %d failures", self._what, ended)


def build(
    config: Config, approver: Approver, now: Callable[[], datetime], open_inbox: Opener | None
) -> CommandListener | None:
    """The listener `commands.channel` asks for; None when it names no channel.

    ConfigError when the verify key cannot be loaded. Whether a key is required at all is
    decided when the settings are loaded (config.load); a Config built in code with none
    gets a listener that accepts unsigned commands, said at WARNING.
    """
    spec = config.commands.channel
    if not spec:
        return None
    try:
        check_inbox(spec)
    except ValueError as err:
        raise ConfigError(f"commands.channel: {err}") from err
    opener = open_inbox or (lambda vm_id: inbox(spec, config, vm_id))
    verifier = verifier_for(config)
    return CommandListener(config.commands, opener, approver, now, verifier)


def verifier_for(config: Config) -> Verifier | None:
    """The agent's Verifier: commands.verify_key, else the public half of signing_key."""
    settings = config.commands
    try:
        if settings.verify_key:
            verifier = load_verifier(settings)
        elif settings.signing_key:
            public = load_signer(settings, config.identity).public_key()
            verifier = Verifier([public])
        else:
            log.warning(
                "commands.verify_key is not set: this agent acts on UNSIGNED commands, "
                "so anyone who can write to its command channel can approve its "
                "events; set commands.verify_key"
            )
            return None
    except SigningError as err:
        raise ConfigError(str(err)) from err
    log.info("acting only on commands signed by key %s", ", ".join(verifier.key_ids))
    return verifier


def _scheduled(state: Mapping[str, object] | None) -> dict[str, Mapping[str, object]]:
    """The events of the current document that are Scheduled, by EventId."""
    events = (state or {}).get("events")
    if not isinstance(events, dict):
        return {}
    return {
        str(event_id): e
        for event_id, e in events.items()
        if isinstance(e, dict) and str(e.get("EventStatus") or "").strip().lower() == "scheduled"
    }


def own_events(state: Mapping[str, object] | None) -> frozenset[str]:
    """The EventIds of the Scheduled events that affect this VM, or may (`scheduled_here`)."""
    return frozenset(i for i, e in _scheduled(state).items() if e.get("AffectsThisVm") is not False)


def scheduled_here(state: Mapping[str, object] | None) -> tuple[bool, bool]:
    """(an event is still Scheduled, so a command may come; one of those affects this VM, or
    may: AffectsThisVm true or unknown)."""
    scheduled = _scheduled(state)
    return bool(scheduled), bool(own_events(state))

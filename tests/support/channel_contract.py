"""The contract every command channel keeps, run against each implementation.

A test module subclasses ChannelContract and gives it a `harness` fixture; pytest then
runs every test below against that module's channel (local files, Storage Queues).
Visibility timeouts and time-to-live are 1 s; a test lets a little more than that pass with
`harness.pass_time`: on the channel's fake clock where it takes one (local files), for real
where the time is the server's (Storage Queues).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Protocol

from bridge.channels import CommandInbox, CommandSender, Received
from bridge.commands import message as commands
from bridge.commands.message import Command

# Past the 1 s visibility timeout or time-to-live, with room for a coarse server clock.
PAST_ONE_SECOND = 1.6


class Harness(Protocol):
    def sender(self) -> CommandSender: ...

    def inbox(self, vm_id: str, visibility_timeout: float = 30.0) -> CommandInbox: ...

    def send_raw(self, vm_id: str, text: str) -> None:
        """Put `text` in the channel of `vm_id` bypassing the sender, as a stray writer could."""

    def pass_time(self, seconds: float) -> None:
        """Let `seconds` pass for the channel."""


def new_vm() -> str:
    return str(uuid.uuid4())


def command(vm_id: str, event_id: str = "C7061BAC-AFDC-4513-B24B-AA5F13A16123") -> Command:
    issued = datetime.now(timezone.utc).replace(microsecond=0)
    return commands.approve(
        vm_id=vm_id,
        event_id=event_id,
        document_incarnation=3,
        issued_at=issued,
        expires_at=issued + timedelta(minutes=15),
        rule="user-initiated",
        reason="User-initiated Reboot: approve at once",
    )


def drain(inbox: CommandInbox) -> list[Received]:
    """Everything readable now, deleted."""
    messages = inbox.receive(32)
    for message in messages:
        inbox.delete(message)
    return messages


class ChannelContract:
    def test_a_sent_command_is_received_intact_and_gone_once_deleted(
        self, harness: Harness
    ) -> None:
        vm = new_vm()
        sent = command(vm)
        harness.sender().send(sent, 60)
        inbox = harness.inbox(vm, visibility_timeout=1)
        [message] = inbox.receive(10)
        assert message.text == sent.to_json()
        assert commands.parse(message.text) == sent
        assert message.dequeue_count == 1
        inbox.delete(message)
        harness.pass_time(PAST_ONE_SECOND)
        assert inbox.receive(10) == []

    def test_a_read_message_is_hidden_until_its_visibility_timeout_passes(
        self, harness: Harness
    ) -> None:
        vm = new_vm()
        harness.sender().send(command(vm), 60)
        first = harness.inbox(vm, visibility_timeout=1)
        restarted = harness.inbox(vm, visibility_timeout=1)
        [held] = first.receive(10)
        assert restarted.receive(10) == []
        assert first.receive(10) == []
        harness.pass_time(PAST_ONE_SECOND)
        [again] = restarted.receive(10)
        assert again.text == held.text
        assert again.dequeue_count == 2

    def test_a_message_whose_time_to_live_passed_is_never_received(self, harness: Harness) -> None:
        vm = new_vm()
        harness.sender().send(command(vm), 1)
        harness.pass_time(PAST_ONE_SECOND + 0.5)
        assert harness.inbox(vm).receive(10) == []

    def test_an_inbox_sees_only_the_commands_of_its_own_vm(self, harness: Harness) -> None:
        vm_a, vm_b = new_vm(), new_vm()
        harness.sender().send(command(vm_a), 60)
        harness.sender().send(command(vm_b), 60)
        got_a = [commands.parse(m.text).vm_id for m in drain(harness.inbox(vm_a))]
        got_b = [commands.parse(m.text).vm_id for m in drain(harness.inbox(vm_b))]
        assert (got_a, got_b) == ([vm_a], [vm_b])

    def test_a_vm_nothing_was_sent_to_has_an_empty_inbox(self, harness: Harness) -> None:
        assert harness.inbox(new_vm()).receive(10) == []

    def test_sending_the_same_command_twice_is_harmless(self, harness: Harness) -> None:
        vm = new_vm()
        sent = command(vm)
        harness.sender().send(sent, 60)
        harness.sender().send(sent, 60)
        inbox = harness.inbox(vm, visibility_timeout=1)
        got = drain(inbox)
        # A queue keeps both copies, files keep one; either way it is the same command.
        assert 1 <= len(got) <= 2
        assert {m.text for m in got} == {sent.to_json()}
        harness.pass_time(PAST_ONE_SECOND)
        assert inbox.receive(10) == []

    def test_receive_returns_at_most_the_number_asked_for(self, harness: Harness) -> None:
        vm = new_vm()
        for event in ("E-1", "E-2", "E-3"):
            harness.sender().send(command(vm, event), 60)
        inbox = harness.inbox(vm)
        first, second = inbox.receive(2), inbox.receive(2)
        assert (len(first), len(second)) == (2, 1)
        events = {commands.parse(m.text).event_id for m in first + second}
        assert events == {"E-1", "E-2", "E-3"}

    def test_garbage_is_handed_over_as_text_and_can_be_deleted(self, harness: Harness) -> None:
        vm = new_vm()
        harness.send_raw(vm, "not a command {")
        inbox = harness.inbox(vm, visibility_timeout=1)
        [message] = inbox.receive(10)
        assert message.text == "not a command {"
        inbox.delete(message)
        inbox.delete(message)  # a second delete of a gone message is no error
        harness.pass_time(PAST_ONE_SECOND)
        assert inbox.receive(10) == []

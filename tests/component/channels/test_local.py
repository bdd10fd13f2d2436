"""The `local:DIR` command channel: the shared contract, then what only files can show."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge import channels
from bridge.channels import CommandInbox, CommandSender, Received
from bridge.channels.local import TEMP_GRACE, LocalInbox, LocalSender
from bridge.config import CommandsSettings, Config
from bridge.retry import PermanentError
from tests.support.channel_contract import ChannelContract, command, new_vm
from tests.support.wait import eventually


class LocalHarness:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._open: list[CommandSender | CommandInbox] = []
        self.now = time.time()  # the channel's clock, moved by pass_time

    def clock(self) -> float:
        return self.now

    def sender(self) -> CommandSender:
        self._open.append(LocalSender(self.directory, clock=self.clock))
        return self._open[-1]  # type: ignore[return-value]

    def inbox(self, vm_id: str, visibility_timeout: float = 30.0) -> CommandInbox:
        self._open.append(LocalInbox(self.directory, vm_id, visibility_timeout, clock=self.clock))
        return self._open[-1]  # type: ignore[return-value]

    def pass_time(self, seconds: float) -> None:
        self.now += seconds

    def send_raw(self, vm_id: str, text: str) -> None:
        folder = self.directory / vm_id.lower()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stray.txt").write_text(text, encoding="utf-8")

    def close(self) -> None:
        for end in self._open:
            end.close()


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[LocalHarness]:
    made = LocalHarness(tmp_path / "commands")
    yield made
    made.close()


class TestLocalChannelContract(ChannelContract):
    pass


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_command_is_one_envelope_file_under_the_lowercased_vm_id(tmp_path: Path) -> None:
    vm = new_vm().upper()
    sent = command(vm)
    LocalSender(tmp_path, clock=lambda: 1000.0).send(sent, 60)
    folder = tmp_path / vm.lower()
    assert files(folder) == [f"{sent.command_id}.json"]
    envelope = json.loads((folder / f"{sent.command_id}.json").read_text(encoding="utf-8"))
    assert envelope == {"ExpiresAt": 1060.0, "Body": sent.to_json()}
    [message] = LocalInbox(tmp_path, vm, 30, clock=lambda: 1001.0).receive(1)
    assert message.text == sent.to_json()


def test_an_expired_message_is_removed_from_disk(tmp_path: Path) -> None:
    vm = new_vm()
    LocalSender(tmp_path, clock=lambda: 1000.0).send(command(vm), 60)
    assert LocalInbox(tmp_path, vm, 30, clock=lambda: 1061.0).receive(5) == []
    assert files(tmp_path / vm) == []


def test_a_read_message_is_renamed_with_its_visibility_time_and_read_count(tmp_path: Path) -> None:
    vm = new_vm()
    sent = command(vm)
    LocalSender(tmp_path, clock=lambda: 1000.0).send(sent, 600)
    LocalInbox(tmp_path, vm, 30, clock=lambda: 1001.0).receive(5)
    assert files(tmp_path / vm) == [f"{sent.command_id}.json.1031000.1.inflight"]
    assert LocalInbox(tmp_path, vm, 30, clock=lambda: 1030.9).receive(5) == []
    [again] = LocalInbox(tmp_path, vm, 30, clock=lambda: 1031.0).receive(5)
    assert again.dequeue_count == 2
    assert files(tmp_path / vm) == [f"{sent.command_id}.json.1061000.2.inflight"]


def test_the_oldest_messages_come_first(tmp_path: Path) -> None:
    vm = new_vm()
    sender = LocalSender(tmp_path)
    for age, event in ((30, "E-new"), (90, "E-old"), (60, "E-mid")):
        sent = command(vm, event)
        sender.send(sent, 600)
        path = tmp_path / vm / f"{sent.command_id}.json"
        os.utime(path, (time.time() - age, time.time() - age))
    got = [json.loads(m.text)["EventId"] for m in LocalInbox(tmp_path, vm, 30).receive(2)]
    assert got == ["E-old", "E-mid"]


def test_a_temp_file_being_written_is_skipped_but_a_stale_one_is_handed_over(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "vm-1"
    folder.mkdir()
    fresh = folder / ".abc.json.00aa11bb.tmp"
    fresh.write_text('{"ExpiresAt": 1', encoding="utf-8")
    inbox = LocalInbox(tmp_path, "vm-1", 30)
    assert inbox.receive(5) == []
    old = time.time() - TEMP_GRACE - 5
    os.utime(fresh, (old, old))
    [message] = inbox.receive(5)
    assert message.text == '{"ExpiresAt": 1'
    inbox.delete(message)
    assert files(folder) == []


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00binary",
        b"",
        b"[1, 2]",
        b'{"Body": 5, "ExpiresAt": 1}',
        b'{"Body": "x", "ExpiresAt": true}',
        b"[" * 100000,
    ],
)
def test_garbage_of_any_shape_is_returned_as_text(tmp_path: Path, content: bytes) -> None:
    folder = tmp_path / "vm-1"
    folder.mkdir()
    (folder / "junk").write_bytes(content)
    [message] = LocalInbox(tmp_path, "vm-1", 30).receive(5)
    assert message.text == content.decode("utf-8", errors="replace")


def test_a_directory_in_the_channel_is_not_a_message(tmp_path: Path) -> None:
    (tmp_path / "vm-1" / "sub").mkdir(parents=True)
    assert LocalInbox(tmp_path, "vm-1", 30).receive(5) == []


def test_a_late_delete_leaves_the_copy_a_later_read_holds(tmp_path: Path) -> None:
    vm = new_vm()
    LocalSender(tmp_path).send(command(vm), 600)
    now = [1000.0]
    first = LocalInbox(tmp_path, vm, 30, clock=lambda: now[0])
    second = LocalInbox(tmp_path, vm, 30, clock=lambda: now[0])
    [stale] = first.receive(1)
    now[0] += 31
    [held] = second.receive(1)
    first.delete(stale)
    second.delete(held)
    assert files(tmp_path / vm) == []
    assert held.handle != stale.handle


def test_racing_readers_each_get_a_message_exactly_once(tmp_path: Path) -> None:
    vm = new_vm()
    sender = LocalSender(tmp_path)
    for n in range(60):
        sender.send(command(vm, f"E-{n}"), 600)
    got: list[Received] = []
    lock = threading.Lock()

    def read() -> None:
        inbox = LocalInbox(tmp_path, vm, 300)
        while batch := inbox.receive(3):
            with lock:
                got.extend(batch)

    readers = [threading.Thread(target=read, daemon=True) for _ in range(6)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(30)
    assert not any(reader.is_alive() for reader in readers)
    events = sorted(json.loads(m.text)["EventId"] for m in got)
    assert events == sorted(f"E-{n}" for n in range(60))


@pytest.mark.parametrize("vm_id", ["..", "../etc", "a/b", "a\\b", "", "c:x"])
def test_a_vm_id_that_could_leave_the_directory_is_refused(tmp_path: Path, vm_id: str) -> None:
    with pytest.raises(ValueError, match="VmId"):
        LocalInbox(tmp_path, vm_id, 30)
    with pytest.raises(PermanentError, match="VmId"):
        LocalSender(tmp_path).send(command(vm_id), 60)
    assert list(tmp_path.iterdir()) == []


def test_a_handle_from_another_channel_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        LocalInbox(tmp_path, "vm-1", 30).delete(Received("x", ("id", "receipt")))


def test_the_builders_make_local_channels_from_the_spec(tmp_path: Path) -> None:
    config = Config(commands=CommandsSettings(visibility_timeout=1))
    vm = new_vm()
    channels.sender(f"local:{tmp_path}", config).send(command(vm), 60)
    inbox = channels.inbox(f"local:{tmp_path}", config, vm)
    assert isinstance(inbox, LocalInbox)
    [first] = inbox.receive(5)
    # Visible again after the configured visibility timeout, long before a default one.
    [again] = eventually(lambda: inbox.receive(5), timeout=10, what="the message visible again")
    assert (first.dequeue_count, again.dequeue_count) == (1, 2)


# --- a hostile neighbour on the same host ---------------------------------------------------

POSIX = pytest.mark.skipif(os.name != "posix", reason="links, owners and modes are POSIX's")


def victim(tmp_path: Path) -> Path:
    """A directory the agent must never empty: what a symlink would point it at."""
    folder = tmp_path / "victim"
    folder.mkdir()
    for name in ("passwd", "shadow.json", "notes.txt"):
        (folder / name).write_text("precious", encoding="utf-8")
    return folder


@POSIX
def test_a_vm_channel_that_is_a_symlink_is_neither_read_nor_emptied(tmp_path: Path) -> None:
    directory, target = tmp_path / "commands", victim(tmp_path)
    directory.mkdir(mode=0o700)
    vm_id = new_vm()
    (directory / vm_id).symlink_to(target, target_is_directory=True)
    inbox = LocalInbox(directory, vm_id, 30.0)
    with pytest.raises(PermanentError, match="symbolic link"):
        inbox.receive(10)
    assert files(target) == ["notes.txt", "passwd", "shadow.json"]
    assert all(p.read_text() == "precious" for p in target.iterdir())


@POSIX
def test_entries_that_are_not_regular_files_are_skipped_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory, target = tmp_path / "commands", victim(tmp_path)
    vm_id = new_vm()
    LocalSender(directory).send(command(vm_id), 60)
    folder = directory / vm_id
    (folder / "link.json").symlink_to(target / "passwd")
    (folder / "sub.json").mkdir()
    os.mkfifo(folder / "pipe.json")
    inbox = LocalInbox(directory, vm_id, 30.0)
    received = inbox.receive(10)
    assert len(received) == 1
    inbox.delete(received[0])
    assert files(folder) == ["link.json", "pipe.json", "sub.json"]
    assert (target / "passwd").read_text() == "precious"
    assert "link.json" in caplog.text
    assert "not a regular file" in caplog.text
    inbox.receive(10)  # reported once, not at every read
    assert caplog.text.count("link.json") == 1


@POSIX
@pytest.mark.parametrize("hostile", ["others may write", "owned by another user", "a symlink"])
def test_a_channel_directory_that_is_not_private_is_refused_at_start(
    tmp_path: Path, hostile: str
) -> None:
    directory = tmp_path / "commands"
    if hostile == "a symlink":
        (tmp_path / "elsewhere").mkdir()
        directory.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    else:
        directory.mkdir(mode=0o700)
    if hostile == "others may write":
        directory.chmod(0o777)
    if hostile == "owned by another user":
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory away")
        os.chown(directory, 12345, 12345)
    with pytest.raises(ValueError, match=str(directory)):
        channels.check_inbox(f"local:{directory}")
    assert LocalInbox(directory, new_vm(), 30.0) is not None  # built, but never reads there
    with pytest.raises(PermanentError):
        LocalInbox(directory, new_vm(), 30.0).receive(1)


@POSIX
def test_a_private_channel_directory_passes_the_start_check(tmp_path: Path) -> None:
    directory = tmp_path / "commands"
    channels.check_inbox(f"local:{directory}")  # not there yet: nothing to refuse
    directory.mkdir(mode=0o750)
    channels.check_inbox(f"local:{directory}")
    channels.check_inbox("storagequeue")

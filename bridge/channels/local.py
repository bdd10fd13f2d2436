"""`local:DIR`: command channels as files in one directory, for runs without Azure.

The consumer and several agents on one machine share DIR; a VM's channel is the
subdirectory named by its VmId in lower case, one file per message:

    DIR/1b1f7c1e-.../3d0c....json                              sent, not yet read
    DIR/1b1f7c1e-.../3d0c....json.1763719201250.2.inflight     read twice, hidden until (ms)
    DIR/1b1f7c1e-.../.3d0c....json.9f2a61c4.tmp                a sender is still writing it

Hiding a message is a rename, which the file system does atomically: of two readers
racing for one message exactly one rename succeeds, so a restarted agent does not see a
message the old process holds until its visibility time has passed, as with Storage
Queues. Only os.replace and plain opens are used, no locks, so it works on Windows too.
Times are wall-clock epoch seconds: every reader and writer is on the same machine.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bridge.channels.base import Received
from bridge.retry import PermanentError, RetryableError

if TYPE_CHECKING:
    from bridge.commands.message import Command

T = TypeVar("T")

_INFLIGHT = re.compile(r"^(?P<base>.+)\.(?P<visible>\d{1,16})\.(?P<count>\d{1,9})\.inflight$")
# VmIds and CommandIds become file names: nothing that could climb out of DIR or that
# Windows refuses in a name.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_TEMP_SUFFIX = ".tmp"
# A temp file older than this was left by a sender that died while writing it: it is
# handed over as garbage (the agent refuses and deletes it) instead of lying there forever.
TEMP_GRACE = 60.0
# Commands are far smaller; this only bounds what a stray huge file can cost a reader.
MAX_READ_BYTES = 1024 * 1024
# On Windows a file another process has open cannot be replaced or removed for a moment.
_BUSY_ATTEMPTS = 20
_BUSY_PAUSE = 0.05


def channel_dir(directory: Path, vm_id: str) -> Path:
    """DIR/<vm_id lowercased>; ValueError when the VmId cannot safely be a directory name."""
    name = vm_id.strip().lower()
    if not _SAFE_NAME.match(name):
        raise ValueError(f"VmId {vm_id!r} cannot name a command channel directory")
    return directory / name


def _message_path(directory: Path, command: Command) -> Path:
    if not _SAFE_NAME.match(command.command_id):
        raise ValueError(f"CommandId {command.command_id!r} cannot name a file")
    return channel_dir(directory, command.vm_id) / f"{command.command_id.lower()}.json"


class LocalSender:
    """The consumer's end: one atomically written file per command."""

    def __init__(self, directory: Path, clock: Callable[[], float] = time.time) -> None:
        self._directory = Path(directory)
        self._clock = clock

    def send(self, command: Command, time_to_live: float) -> None:
        try:
            target = _message_path(self._directory, command)
        except ValueError as err:
            raise PermanentError(str(err)) from err
        envelope = {"ExpiresAt": self._clock() + time_to_live, "Body": command.to_json()}
        folder = target.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _write_atomically(target, json.dumps(envelope, ensure_ascii=False))
        except PermissionError as err:
            raise PermanentError(
                f"cannot write command file {target}: {err.strerror}; "
                f"the consumer needs write access to {self._directory}"
            ) from err
        except OSError as err:
            raise RetryableError(f"cannot write command file {target}: {err}") from err

    def close(self) -> None:
        """Nothing is held open between sends."""


@dataclass(frozen=True)
class _Slot:
    """A message file a reader may claim: where it is, its original name, reads so far."""

    path: Path
    base: str
    count: int
    mtime: float


class LocalInbox:
    """One agent's end: the files of its own VmId's directory."""

    def __init__(
        self,
        directory: Path,
        vm_id: str,
        visibility_timeout: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._folder = channel_dir(Path(directory), vm_id)
        self._visibility_timeout = visibility_timeout
        self._clock = clock

    def receive(self, max_messages: int) -> list[Received]:
        now = self._clock()
        out: list[Received] = []
        for slot in self._claimable(now):
            if len(out) >= max_messages:
                break
            message = self._claim(slot, now)
            if message is not None:
                out.append(message)
        return out

    def delete(self, message: Received) -> None:
        if not isinstance(message.handle, Path):
            raise TypeError("not a message of a local command channel")
        try:
            _when_free(message.handle.unlink)
        except FileNotFoundError:
            pass  # deleted already, or hidden again under a new name by a later read
        except OSError as err:
            raise RetryableError(f"cannot delete command file {message.handle}: {err}") from err

    def close(self) -> None:
        """Nothing is held open between reads."""

    def _claimable(self, now: float) -> list[_Slot]:
        """Messages no read holds, oldest first."""
        try:
            entries = list(os.scandir(self._folder))
        except FileNotFoundError:
            return []  # nothing was ever sent to this VM
        except OSError as err:
            raise RetryableError(f"cannot list command directory {self._folder}: {err}") from err
        slots = [slot for entry in entries if (slot := _slot(entry, now)) is not None]
        return sorted(slots, key=lambda s: (s.mtime, s.path.name))

    def _claim(self, slot: _Slot, now: float) -> Received | None:
        visible_ms = math.ceil((now + self._visibility_timeout) * 1000)
        hidden = slot.path.with_name(f"{slot.base}.{visible_ms}.{slot.count + 1}.inflight")
        try:
            os.replace(slot.path, hidden)
            raw = _read(hidden)
        except OSError:
            # Another reader renamed it first (or, on Windows, has it open): it is theirs.
            return None
        text, expires_at = _unwrap(raw)
        if expires_at is not None and expires_at <= now:
            self.delete(Received(text, hidden))  # a queue's TTL: gone unread
            return None
        return Received(text=text, handle=hidden, dequeue_count=slot.count + 1)


def _slot(entry: os.DirEntry[str], now: float) -> _Slot | None:
    try:
        if not entry.is_file():
            return None
        mtime = entry.stat().st_mtime
    except OSError:
        return None  # gone since the listing
    name, path = entry.name, Path(entry.path)
    if name.startswith(".") and name.endswith(_TEMP_SUFFIX):
        return _Slot(path, name, 0, mtime) if now - mtime > TEMP_GRACE else None
    found = _INFLIGHT.match(name)
    if found is None:
        return _Slot(path, name, 0, mtime)
    if int(found["visible"]) / 1000 > now:
        return None
    return _Slot(path, found["base"], int(found["count"]), mtime)


# An envelope as LocalSender writes it (Body is the command's own JSON text):
#   {"ExpiresAt": 1763719500.25, "Body": "{\"SchemaVersion\":1,\"CommandId\":\"3d0c...\",...}"}
def _unwrap(raw: str) -> tuple[str, float | None]:
    """The message text and when it expires; anything else goes on raw, for the agent to refuse."""
    try:
        envelope = json.loads(raw)
    except (ValueError, RecursionError):
        return raw, None
    if not isinstance(envelope, dict):
        return raw, None
    body, expires_at = envelope.get("Body"), envelope.get("ExpiresAt")
    if not isinstance(body, str) or isinstance(expires_at, bool):
        return raw, None
    if not isinstance(expires_at, (int, float)) or not math.isfinite(expires_at):
        return raw, None
    return body, float(expires_at)


def _read(path: Path) -> str:
    with path.open("rb") as file:
        data = file.read(MAX_READ_BYTES)
    # Garbage must reach the agent as text it can refuse, never as a decoding crash.
    return data.decode("utf-8", errors="replace")


def _write_atomically(target: Path, text: str) -> None:
    """Readers see the whole file or none of it, even if this process dies half-way."""
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}{_TEMP_SUFFIX}")
    try:
        with temp.open("x", encoding="utf-8", newline="") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        _when_free(lambda: os.replace(temp, target))
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _sync_directory(target.parent)


def _sync_directory(folder: Path) -> None:
    """Make the rename itself durable; Windows has no directory handles to flush."""
    if os.name == "nt":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _when_free(operation: Callable[[], T]) -> T:
    """`operation`, retried briefly while Windows reports the file in use by another process."""
    if os.name != "nt":
        return operation()  # elsewhere PermissionError means what it says
    for _ in range(_BUSY_ATTEMPTS - 1):
        try:
            return operation()
        except PermissionError:
            time.sleep(_BUSY_PAUSE)
    return operation()

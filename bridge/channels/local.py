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

Other users of the machine are not trusted. An agent (often root) reads, renames and deletes
files here, so on POSIX it acts only on a channel it can trust: DIR and DIR/<vmid> are
opened without following a symbolic link, and must be directories owned by the agent's user
or root that no other user may write (`check_directory`, at start and at every read); every
rename, read and delete is relative to the opened folder, and an entry that is not a regular
file (a link, a directory, a pipe) is skipped and reported once, never renamed or removed.
Windows has no such handles: there a link or junction as the folder is refused and entries
are taken only if they are plain files, and the directory's ACL is the administrator's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bridge.channels.base import Received
from bridge.retry import PermanentError, RetryableError

if TYPE_CHECKING:
    from bridge.commands.message import Command

T = TypeVar("T")
log = logging.getLogger(__name__)

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
# Opening a channel folder: never through a symbolic link (where the platform can say so).
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_FILE_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
# Relative operations on an opened folder: POSIX has them, Windows does not.
_AT = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and os.name == "posix"
# On Windows a file another process has open cannot be replaced or removed for a moment.
_BUSY_ATTEMPTS = 20
_BUSY_PAUSE = 0.05


def channel_dir(directory: Path, vm_id: str) -> Path:
    """DIR/<vm_id lowercased>; ValueError when the VmId cannot safely be a directory name."""
    name = vm_id.strip().lower()
    if not _SAFE_NAME.match(name):
        raise ValueError(f"VmId {vm_id!r} cannot name a command channel directory")
    return directory / name


def check_directory(directory: Path) -> None:
    """ValueError unless an agent may act on `directory` (see the module's docstring); nothing
    when it does not exist yet, since every read checks it again."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return
    except OSError as err:
        raise ValueError(
            f"cannot inspect the command channel directory {directory}: {err}"
        ) from err
    problem = _untrusted(info)
    if problem is not None:
        raise ValueError(_refusal(directory, problem))


def _untrusted(info: os.stat_result) -> str | None:
    """What makes a folder unsafe for the agent to act in; None when it is not."""
    if stat.S_ISLNK(info.st_mode) or getattr(info, "st_file_attributes", 0) & 0x400:
        return "is a symbolic link (or junction)"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if os.name != "posix":
        return None
    if info.st_uid not in (os.geteuid(), 0):
        return f"belongs to uid {info.st_uid}, neither this agent's user nor root"
    if info.st_mode & stat.S_IWOTH:
        return f"may be written by every user (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _refusal(folder: Path, problem: str) -> str:
    return (
        f"the command channel directory {folder} {problem}: refused, since another user "
        "could make this agent read, rename or delete files elsewhere; use a directory "
        "owned by the agent's user (or root) that others cannot write, such as "
        "/var/lib/se-bridge/commands with mode 0750"
    )


def _message_path(directory: Path, command: Command) -> Path:
    if not _SAFE_NAME.match(command.command_id):
        raise ValueError(f"CommandId {command.command_id!r} cannot name a file")
    return channel_dir(directory, command.vm_id) / f"{command.command_id.lower()}.json"


@dataclass(frozen=True)
class LocalChannel:
    """The channels in `directory`; an inbox hides what it reads for `visibility_timeout` s."""

    directory: Path
    visibility_timeout: float

    def sender(self) -> LocalSender:
        return LocalSender(self.directory)

    def inbox(self, vm_id: str) -> LocalInbox:
        return LocalInbox(self.directory, vm_id, self.visibility_timeout)

    def check_inbox(self) -> None:
        check_directory(self.directory)


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
            if folder.is_symlink():
                raise PermanentError(_refusal(folder, "is a symbolic link"))
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
        self._reported: set[str] = set()  # entries said to be no message, once each

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
        handle = message.handle
        if not isinstance(handle, Path) or handle.parent != self._folder:
            raise TypeError("not a message of this local command channel")
        try:
            with self._opened() as folder:
                if folder is not None:
                    _when_free(lambda: folder.unlink(handle.name))
        except FileNotFoundError:
            pass  # deleted already, or hidden again under a new name by a later read
        except OSError as err:
            raise RetryableError(f"cannot delete command file {message.handle}: {err}") from err

    @contextlib.contextmanager
    def _opened(self) -> Iterator[_Folder | None]:
        """This VM's folder, checked and held open; None when nothing was ever sent to it."""
        if not _AT:
            problem = _lstat_problem(self._folder.parent) or _lstat_problem(self._folder)
            if problem is not None:
                raise PermanentError(problem)
            yield _Folder(self._folder, None) if self._folder.is_dir() else None
            return
        with contextlib.ExitStack() as stack:
            top = _open_dir(self._folder.parent, None)
            if top is None:
                yield None
                return
            stack.callback(os.close, top)
            fd = _open_dir(self._folder, top)
            if fd is None:
                yield None
                return
            stack.callback(os.close, fd)
            yield _Folder(self._folder, fd)

    def close(self) -> None:
        """Nothing is held open between reads."""

    def _claimable(self, now: float) -> list[_Slot]:
        """Messages no read holds, oldest first."""
        try:
            with self._opened() as folder:
                if folder is None:
                    return []  # nothing was ever sent to this VM
                entries = [(name, folder.lstat(name)) for name in folder.names()]
        except FileNotFoundError:
            return []
        except OSError as err:
            raise RetryableError(f"cannot list command directory {self._folder}: {err}") from err
        slots = []
        for name, info in entries:
            if info is None:
                continue  # gone since the listing
            if not stat.S_ISREG(info.st_mode) or getattr(info, "st_file_attributes", 0) & 0x400:
                self._report(name)
                continue
            slot = _slot(self._folder / name, info.st_mtime, now)
            if slot is not None:
                slots.append(slot)
        return sorted(slots, key=lambda s: (s.mtime, s.path.name))

    def _report(self, name: str) -> None:
        if name in self._reported:
            return
        self._reported.add(name)
        log.warning(
            "%s in the command channel %s is not a regular file (a link, a directory "
            "or a device): not a command, left as it is; whoever put it there can "
            "write to this VM's channel",
            name,
            self._folder,
        )

    def _claim(self, slot: _Slot, now: float) -> Received | None:
        visible_ms = math.ceil((now + self._visibility_timeout) * 1000)
        hidden = slot.path.with_name(f"{slot.base}.{visible_ms}.{slot.count + 1}.inflight")
        try:
            with self._opened() as folder:
                if folder is None:
                    return None
                folder.rename(slot.path.name, hidden.name)
                raw = folder.read(hidden.name)
        except OSError:
            # Another reader renamed it first (or, on Windows, has it open): it is theirs.
            return None
        if raw is None:
            return None  # not a regular file after all: left alone
        text, expires_at = _unwrap(raw)
        if expires_at is not None and expires_at <= now:
            self.delete(Received(text, hidden))  # a queue's TTL: gone unread
            return None
        return Received(text=text, handle=hidden, dequeue_count=slot.count + 1)


@dataclass
class _Folder:
    """A channel folder held open (`fd`), or by path where the platform has no `dir_fd`."""

    path: Path
    fd: int | None

    def names(self) -> list[str]:
        return os.listdir(self.fd if self.fd is not None else self.path)

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            if self.fd is None:
                return os.lstat(self.path / name)
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def rename(self, old: str, new: str) -> None:
        if self.fd is None:
            os.replace(self.path / old, self.path / new)
        else:
            os.replace(old, new, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def unlink(self, name: str) -> None:
        if self.fd is None:
            (self.path / name).unlink()
        else:
            os.unlink(name, dir_fd=self.fd)

    def read(self, name: str) -> str | None:
        """The file's text (at most MAX_READ_BYTES), or None when it is not a regular file."""
        if self.fd is None:
            if not stat.S_ISREG(os.lstat(self.path / name).st_mode):
                return None
            descriptor = os.open(self.path / name, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        else:
            descriptor = os.open(name, _FILE_FLAGS, dir_fd=self.fd)
        with os.fdopen(descriptor, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return None
            data = file.read(MAX_READ_BYTES)
        # Garbage must reach the agent as text it can refuse, never as a decoding crash.
        return data.decode("utf-8", errors="replace")


def _open_dir(path: Path, parent: int | None) -> int | None:
    """A descriptor of the directory `path` (relative to `parent` when given), opened without
    following a link and checked with `_untrusted`; None when it does not exist."""
    try:
        if parent is None:
            fd = os.open(path, _DIR_FLAGS)
        else:
            fd = os.open(path.name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise PermanentError(_refusal(path, "is a symbolic link or not a directory")) from err
        raise RetryableError(f"cannot open the command channel directory {path}: {err}") from err
    problem = _untrusted(os.fstat(fd))
    if problem is not None:
        os.close(fd)
        raise PermanentError(_refusal(path, problem))
    return fd


def _lstat_problem(path: Path) -> str | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    problem = _untrusted(info)
    return None if problem is None else _refusal(path, problem)


def _slot(path: Path, mtime: float, now: float) -> _Slot | None:
    name = path.name
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

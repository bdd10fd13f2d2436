"""Running one hook command: spawn, feed stdin, keep a bounded output tail, kill on timeout.

The edge of the hooks stage: everything here touches processes. `run_hook` never raises;
how the hook ended is in the HookOutcome. POSIX and Windows differ only in `spawn_options`
and `kill_tree`, which take the platform name so tests cover both anywhere.
"""

from __future__ import annotations

import logging
import ntpath
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any, TypeAlias

log = logging.getLogger("bridge.agent.hooks")

Command: TypeAlias = str | Sequence[str]
Popen: TypeAlias = "subprocess.Popen[bytes]"

# After the hook exits, how long to wait for the rest of its output: a background process it
# started may hold the pipe open for hours, and the reader thread keeps draining it anyway.
OUTPUT_GRACE_S = 0.5
KILL_WAIT_S = 5.0
READ_CHUNK = 65536
_UTF8_CONTINUATION = bytes(range(0x80, 0xC0))
WINDOWS_NEW_PROCESS_GROUP = 0x00000200  # subprocess.CREATE_NEW_PROCESS_GROUP, Windows only


@dataclass(frozen=True)
class HookOutcome:
    exit_code: int | None
    timed_out: bool = False
    duration_ms: int = 0
    output: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and self.exit_code == 0


class OutputTail:
    """The last `max_chars` characters of a byte stream, kept in bounded memory."""

    def __init__(self, max_chars: int) -> None:
        self._max_chars = max(0, max_chars)
        self._max_bytes = self._max_chars * 4  # a UTF-8 character is at most 4 bytes
        self._data = bytearray()
        self._truncated = False
        self._lock = threading.Lock()

    def feed(self, chunk: bytes) -> None:
        with self._lock:
            self._data += chunk
            excess = len(self._data) - self._max_bytes
            if excess > 0:
                del self._data[:excess]
                self._truncated = True

    def text(self) -> str:
        with self._lock:
            data, truncated = bytes(self._data), self._truncated
        if truncated:
            # The cut may have split a character: drop its orphaned continuation bytes.
            data = data.lstrip(_UTF8_CONTINUATION)
        text = data.decode("utf-8", errors="replace")
        return text[-self._max_chars :] if self._max_chars else ""


def _drain(stream: IO[bytes], tail: OutputTail) -> None:
    try:
        while chunk := os.read(stream.fileno(), READ_CHUNK):
            tail.feed(chunk)
    except OSError:
        pass  # the pipe broke: what was read so far is the output
    finally:
        stream.close()


def _feed_stdin(stream: IO[bytes], data: bytes) -> None:
    # A hook that never reads stdin, or exits early, breaks the pipe: that is its right.
    with suppress(OSError):
        stream.write(data)
    with suppress(OSError):
        stream.close()


def _thread(target: Callable[..., None], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, name="hook-io", daemon=True)
    thread.start()
    return thread


def spawn_options(system: str) -> dict[str, Any]:
    """Put the hook in its own process group so a timeout can end everything it started."""
    if system == "Windows":
        flags = getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", WINDOWS_NEW_PROCESS_GROUP)
        return {"creationflags": flags}
    return {"start_new_session": True}


def kill_tree(proc: Popen, system: str) -> None:
    """Kill the hook and every process it started."""
    if system == "Windows":
        _taskkill(proc.pid)
    else:
        _killpg(proc.pid)
    with suppress(OSError):
        proc.kill()


def _taskkill(pid: int) -> None:
    # Popen.kill ends only the hook itself; taskkill /T also ends the processes it started.
    exe = ntpath.join(os.environ.get("SYSTEMROOT", "C:\\Windows"), "System32", "taskkill.exe")
    with suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [exe, "/T", "/F", "/PID", str(pid)],
            capture_output=True,
            timeout=KILL_WAIT_S,
            check=False,
        )


def _killpg(pgid: int) -> None:
    if sys.platform == "win32":
        return
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _spawn(command: Command, env: Mapping[str, str], system: str) -> Popen:
    shell = isinstance(command, str)
    if not command:
        raise ValueError("empty hook command")
    args: str | list[str] = command if isinstance(command, str) else list(command)
    return subprocess.Popen(
        args,
        shell=shell,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env),
        **spawn_options(system),
    )


def _start_error(command: Command, exc: Exception) -> str:
    name = command if isinstance(command, str) else (command[0] if command else "")
    if isinstance(exc, FileNotFoundError):
        return f"hook command not found: {name}"
    if isinstance(exc, PermissionError):
        return f"hook command not permitted: {name}"
    return f"hook command could not start: {name}: {exc}"


def _elapsed_ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _wait(proc: Popen, timeout: float, system: str) -> bool:
    """Wait for the hook; True when it ran out of time and was killed."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc, system)
        proc.wait()
        return True
    return False


def run_hook(
    command: Command,
    *,
    stdin: bytes,
    env: Mapping[str, str],
    timeout: float,
    max_output: int,
    system: str | None = None,
    on_spawn: Callable[[Popen], None] | None = None,
) -> HookOutcome:
    """Run one hook to the end or its timeout. Never raises: a failure is in the outcome."""
    system = system or platform.system()
    started = time.monotonic()
    try:
        proc = _spawn(command, env, system)
    except (OSError, ValueError) as exc:
        return HookOutcome(None, False, _elapsed_ms(started), "", _start_error(command, exc))
    assert proc.stdout is not None and proc.stdin is not None  # noqa: PT018 - both are PIPE
    if on_spawn is not None:
        on_spawn(proc)
    tail = OutputTail(max_output)
    reader = _thread(_drain, proc.stdout, tail)
    _thread(_feed_stdin, proc.stdin, stdin)
    timed_out = _wait(proc, timeout, system)
    duration = _elapsed_ms(started)
    reader.join(OUTPUT_GRACE_S)
    exit_code = None if timed_out else proc.returncode
    return HookOutcome(exit_code, timed_out, duration, tail.text(), None)

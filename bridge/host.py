"""Facts about the machine the agent runs on, for Windows and POSIX alike.

Every function takes the platform name (`platform.system()`) as an optional argument so the
tests can check each platform's answer on any machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import ntpath
import os
import platform
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

LINUX_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
WINDOWS_PROGRAM_DATA = "C:\\ProgramData"
STATE_DIR_NAME = "se-bridge"
POSIX_STATE_DIR = Path("/var/lib") / STATE_DIR_NAME

# Boot time computed from an uptime counter wobbles by the time between the two clock reads
# and by clock adjustments; rounding keeps the id stable across calls within one boot.
BOOT_TIME_GRANULARITY_S = 10


def _system(system: str | None) -> str:
    return system if system is not None else platform.system()


def default_state_dir(system: str | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """Where the agent keeps its spool and state when --state-dir is not given."""
    if _system(system) != "Windows":
        return POSIX_STATE_DIR
    env = os.environ if environ is None else environ
    program_data = env.get("ProgramData") or env.get("PROGRAMDATA") or WINDOWS_PROGRAM_DATA
    return Path(ntpath.join(program_data, STATE_DIR_NAME))


# Files this process creates: no access for other users of the machine, no writing by the
# group (0640 files, 0750 directories). On Windows the ACL of the state directory decides
# (`se-bridge service install` limits it to SYSTEM and Administrators).
PRIVATE_UMASK = 0o027


def restrict_new_files() -> None:
    """From now on, create files and directories closed to other users (POSIX)."""
    if os.name == "posix":
        os.umask(PRIVATE_UMASK)


def private_directory(path: Path) -> None:
    """Create `path` closed to other users, or close an existing one this process owns."""
    path.mkdir(parents=True, exist_ok=True)
    if os.name != "posix":
        return
    info = path.stat()
    if info.st_uid == os.geteuid() and info.st_mode & 0o007:
        path.chmod(info.st_mode & 0o770)
        log.info(
            "%s was open to every user of this machine: now mode %o", path, info.st_mode & 0o770
        )


def readable_by_others(path: Path) -> bool:
    """Whether every user of this machine may read `path` (POSIX; never on Windows)."""
    return os.name == "posix" and bool(path.stat().st_mode & 0o004)


def host_name() -> str:
    return socket.gethostname()


def boot_id(system: str | None = None) -> str | None:
    """An id that changes on every boot of the machine; None when the platform offers none.

    Never raises: the agent works without it, it only loses the ability to tell that a
    Reboot which vanished while the agent was down really happened.
    """
    name = _system(system)
    try:
        if name == "Linux":
            return linux_boot_id(LINUX_BOOT_ID)
        if name == "Windows":
            return windows_boot_id(_tick_count_ms)
    except (OSError, ValueError, AttributeError) as exc:
        log.debug("boot id unavailable on %s: %s", name, exc)
    return None


def linux_boot_id(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def windows_boot_id(tick_count_ms: Callable[[], int], now: Callable[[], float] = time.time) -> str:
    """The boot moment (Unix seconds, rounded) derived from the milliseconds since boot."""
    booted = now() - tick_count_ms() / 1000.0
    step = BOOT_TIME_GRANULARITY_S
    return f"boot-{round(booted / step) * step}"


def _tick_count_ms() -> int:
    if sys.platform != "win32":
        raise OSError("GetTickCount64 exists only on Windows")
    kernel32 = ctypes.windll.kernel32
    kernel32.GetTickCount64.restype = ctypes.c_uint64
    return int(kernel32.GetTickCount64())


def stop_signals(system: str | None = None) -> tuple[int, ...]:
    """The signals that ask the agent to stop: Ctrl-C, kill, systemd, Ctrl-Break, service stop."""
    signals = [int(signal.SIGINT), int(signal.SIGTERM)]
    sigbreak = getattr(signal, "SIGBREAK", None)
    if _system(system) == "Windows" and sigbreak is not None:
        signals.append(int(sigbreak))
    return tuple(signals)


def install_stop_handler(callback: Callable[[], None], system: str | None = None) -> None:
    """Call `callback` once on the first stop signal; a second signal then stops the process.

    Must be called from the main thread (a rule of Python's signal module). The callback runs
    in the signal handler, so it should only set a flag or an Event.
    """
    signals = stop_signals(system)
    fired = False

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        # Back to the default first, so an impatient second Ctrl-C kills a stuck shutdown.
        for sig in signals:
            signal.signal(sig, signal.SIG_DFL)
        if fired:
            return
        fired = True
        callback()  # first: nothing below may keep the process from stopping
        # A signal that comes while the main thread writes to the same stream makes this a
        # reentrant write, which raises: before, out of the handler and before the stop.
        with contextlib.suppress(RuntimeError):
            log.info("received signal %d: stopping", signum)

    for sig in signals:
        signal.signal(sig, handle)

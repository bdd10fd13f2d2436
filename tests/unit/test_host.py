"""Platform facts: state directory, boot id, stop signals, per platform."""

from __future__ import annotations

import re
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

import pytest

from bridge import host


@pytest.mark.parametrize(
    ("system", "environ", "expected"),
    [
        ("Linux", {}, "/var/lib/se-bridge"),
        ("Darwin", {"ProgramData": "D:\\Data"}, "/var/lib/se-bridge"),
        ("Windows", {"ProgramData": "D:\\Data"}, "D:\\Data\\se-bridge"),
        ("Windows", {"PROGRAMDATA": "E:\\PD"}, "E:\\PD\\se-bridge"),
        ("Windows", {}, "C:\\ProgramData\\se-bridge"),
        ("Windows", {"ProgramData": ""}, "C:\\ProgramData\\se-bridge"),
    ],
)
def test_default_state_dir(system: str, environ: dict[str, str], expected: str) -> None:
    path = host.default_state_dir(system, environ)
    assert isinstance(path, Path)
    flavour = PureWindowsPath if system == "Windows" else PurePosixPath
    assert flavour(str(path)) == flavour(expected)


def test_default_state_dir_for_this_machine() -> None:
    path = host.default_state_dir()
    assert path.name == "se-bridge"


def test_host_name() -> None:
    assert host.host_name() == socket.gethostname()


def test_linux_boot_id_reads_the_kernel_file(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_text("0e0f3b2a-8c1d-4c7e-9a55-61f4d2b1c0aa\n", encoding="ascii")
    assert host.linux_boot_id(path) == "0e0f3b2a-8c1d-4c7e-9a55-61f4d2b1c0aa"


@pytest.mark.parametrize("content", [None, b"", b"\xff\xfe"])
def test_linux_boot_id_unavailable(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "boot_id"
    if content is not None:
        path.write_bytes(content)
    assert host.linux_boot_id(path) is None


@pytest.mark.skipif(not host.LINUX_BOOT_ID.exists(), reason="needs Linux /proc")
def test_boot_id_on_this_linux_is_stable() -> None:
    first = host.boot_id("Linux")
    assert first is not None
    assert re.fullmatch(r"[0-9a-f-]{36}", first)
    assert host.boot_id() == first


def ticking(start_ms: int, clock_start: float) -> tuple[Callable[[], int], Callable[[], float]]:
    """An uptime counter and a wall clock that advance together, a little on every read."""
    ms, wall = start_ms, clock_start

    def ticks() -> int:
        nonlocal ms
        ms += 137
        return ms

    def now() -> float:
        nonlocal wall
        wall += 0.137
        return wall

    return ticks, now


def test_windows_boot_id_stable_within_a_boot() -> None:
    ticks, now = ticking(3_600_000, 1_700_000_000.0)
    ids = {host.windows_boot_id(ticks, now) for _ in range(50)}
    assert len(ids) == 1
    assert ids == {"boot-1699996400"}


def test_windows_boot_id_changes_after_a_reboot() -> None:
    before = host.windows_boot_id(lambda: 3_600_000, lambda: 1_700_000_000.0)
    after = host.windows_boot_id(lambda: 60_000, lambda: 1_700_000_300.0)
    assert before != after


@pytest.mark.parametrize("system", ["Darwin", "FreeBSD", ""])
def test_boot_id_unknown_platforms(system: str) -> None:
    assert host.boot_id(system) is None


@pytest.mark.skipif(sys.platform == "win32", reason="checks the non-Windows fallback")
def test_boot_id_windows_branch_never_raises_elsewhere() -> None:
    assert host.boot_id("Windows") is None


def test_boot_id_missing_kernel_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(host, "LINUX_BOOT_ID", tmp_path / "absent")
    assert host.boot_id("Linux") is None


def test_stop_signals_posix() -> None:
    assert host.stop_signals("Linux") == (signal.SIGINT, signal.SIGTERM)


def test_stop_signals_windows_adds_ctrl_break(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signal, "SIGBREAK", 21, raising=False)
    assert host.stop_signals("Windows") == (signal.SIGINT, signal.SIGTERM, 21)
    assert host.stop_signals("Linux") == (signal.SIGINT, signal.SIGTERM)


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    signals = host.stop_signals()
    saved = {sig: signal.getsignal(sig) for sig in signals}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("saved_handlers")
def test_stop_handler_calls_back_once_then_restores_default() -> None:
    calls: list[int] = []
    host.install_stop_handler(lambda: calls.append(1))
    for sig in host.stop_signals():
        assert signal.getsignal(sig) not in (signal.SIG_DFL, signal.default_int_handler)
    signal.raise_signal(signal.SIGTERM)
    assert calls == [1]
    for sig in host.stop_signals():
        assert signal.getsignal(sig) == signal.SIG_DFL


@pytest.mark.usefixtures("saved_handlers")
def test_stop_handler_on_ctrl_c() -> None:
    calls: list[int] = []
    host.install_stop_handler(lambda: calls.append(1))
    signal.raise_signal(signal.SIGINT)
    assert calls == [1]


@pytest.mark.usefixtures("saved_handlers")
def test_a_signal_during_a_write_to_stderr_still_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen in CI: the stop signal came while the main thread was writing a log line to
    # stderr; the handler's own log line was a reentrant write, which raised out of the
    # handler before it asked for the stop, and the agent never exited.
    def reentrant(*args: object, **kwargs: object) -> None:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    monkeypatch.setattr(host.log, "info", reentrant)
    calls: list[int] = []
    host.install_stop_handler(lambda: calls.append(1))
    signal.raise_signal(signal.SIGTERM)
    assert calls == [1]

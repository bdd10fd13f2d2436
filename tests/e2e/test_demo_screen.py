"""The demo's live view on the smallest terminal it is for, 80 columns by 24 rows (issue 39):
`se-bridge demo` runs in a real pty of that size, a terminal emulator (pyte) reads what it
writes, and the test checks what is on the screen, then runs the approve command it reads
off the screen, as a person would copy it."""

from __future__ import annotations

import fcntl
import os
import pty
import shlex
import signal
import struct
import subprocess
import termios
import threading
from pathlib import Path

import pyte
import pytest

from tests.support.processes import PYTHON, child_env, read_records
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e
COLUMNS, ROWS = 80, 24


class Terminal:
    """A terminal of COLUMNS x ROWS on the leader side of a pty: everything the program on
    the other side writes is drawn on its screen; what scrolls off the top is kept."""

    def __init__(self) -> None:
        self.leader, self.follower = pty.openpty()
        size = struct.pack("HHHH", ROWS, COLUMNS, 0, 0)
        fcntl.ioctl(self.follower, termios.TIOCSWINSZ, size)
        self.screen = pyte.HistoryScreen(COLUMNS, ROWS, history=100_000)
        self.stream = pyte.ByteStream(self.screen)
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)

    def start(self) -> None:
        os.close(self.follower)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.leader, 65536)
            except OSError:  # EIO: the program closed its end
                chunk = b""
            if not chunk:
                return
            with self.lock:
                self.stream.feed(chunk)

    def rows(self) -> list[str]:
        with self.lock:
            return list(self.screen.display)

    def scrolled_off(self) -> int:
        """How many lines went off the top of the screen (to a terminal's scrollback)."""
        with self.lock:
            return len(self.screen.history.top)

    def close(self) -> None:
        self.reader.join(timeout=30)
        os.close(self.leader)

    def everything(self) -> str:
        """What scrolled off, then the screen."""
        with self.lock:
            gone = [
                "".join(line[x].data for x in range(COLUMNS)).rstrip()
                for line in self.screen.history.top
            ]
        return "\n".join([*gone, *self.rows()])


def _asked_event(state: Path) -> str | None:
    records = read_records(state / "decisions.jsonl")
    asks = [d for d in records if d["DecisionAction"] == "Ask"]
    return str(asks[0]["EventId"]) if asks else None


def _command(rows: list[str]) -> list[str] | None:
    """The approve command shown on the screen, as a shell reads it pasted: a backslash at the
    end of a row continues it on the next."""
    start = next((i for i, row in enumerate(rows) if "or approve it:" in row), None)
    if start is None:
        return None
    pasted = "\n".join(row.rstrip() for row in rows[start:]).split("or approve it:", 1)[1]
    pasted = pasted.replace("\\\n", "").split("\n", 1)[0]
    words = shlex.split(pasted)
    return words if "--reason" in words else None


def test_the_live_view_fits_80x24_and_its_approve_command_works(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    terminal = Terminal()
    argv = [PYTHON, "-m", "bridge", "demo", "--duration", "180", "--every", "2",
            "--state-dir", str(state)]  # fmt: skip
    with (tmp_path / "stderr").open("wb") as stderr:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=terminal.follower, stderr=stderr,
            env=child_env(),
        )  # fmt: skip
    terminal.start()
    try:
        event_id = eventually(
            lambda: _asked_event(state), timeout=120, what="the demo's consumer to ask a person"
        )

        def shown() -> list[str] | None:
            rows = terminal.rows()
            return rows if _command(rows) and event_id[:8] in "\n".join(rows) else None

        rows = eventually(
            shown, timeout=60, what="the ask and its command on the screen",
            details=lambda: "\n".join(terminal.rows()),
        )  # fmt: skip
        screen = "\n".join(rows)
        assert rows[0].startswith("se-bridge demo: 8 VMs, time x30, "), screen
        assert "Latest per VM" in screen
        assert "Waiting for a person" in screen
        assert f"  Reboot {event_id} on db-0: asked db-owner at " in screen
        assert terminal.scrolled_off() == 0, screen

        command = _command(rows)
        assert command is not None
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, env=child_env(), check=False
        )
        assert done.returncode == 0, done.stderr
        assert "Accepted: " in done.stdout
        eventually(
            lambda: "Waiting for a person" not in "\n".join(terminal.rows()),
            timeout=60, what="the answered ask to leave the screen",
            details=lambda: "\n".join(terminal.rows()),
        )  # fmt: skip
        # Drawn in place, frame after frame: nothing went to the scrollback.
        assert terminal.scrolled_off() == 0, "\n".join(terminal.rows())
    finally:
        child.send_signal(signal.SIGINT)  # Ctrl-C
        code = child.wait(timeout=120)
        terminal.close()
    assert code == 0, (tmp_path / "stderr").read_text(encoding="utf-8")
    summary = terminal.everything().split("\nSummary\n", 1)[-1]
    assert f"{event_id[:8]} Reboot on db-0: approved by " in summary, summary

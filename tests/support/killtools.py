"""Machinery for test_kill.py: an agent process that a thread kills -9 at chosen random
moments (KILL_MODES), a seeded script of events driven through the simulator's in-process
API, and a follower of the jsonl output that the script waits on.

Timing. The invariant under test is "kill -9 loses nothing that was observed". A state the
agent never had a chance to observe (it was down or restarting for as long as the state
lasted) is not a loss, and a test that sometimes demands it is flaky, not strict. Measured
on a 2-CPU machine, a fresh agent polls IMDS for the first time 0.40-0.55 s after spawn
(imports, spool open, instance metadata, then the 5 requests/s limiter), up to 1.05 s with
the unit tests running alongside. A kill thus blinds the agent for a poll interval (0.2 s)
plus a restart, 0.6-0.8 s when idle, and about twice that when an early kill follows.
Every scripted state therefore lasts 1.0-2.5 s (MIN_HOLD, MAX_HOLD), long enough for
one to three kills and restarts inside one state, and in addition until its record reached
the jsonl file: when a slow machine stretches restarts past the hold, the gate holds the
state longer instead of the test failing. The gate never lets a loss pass: a lost record
never reaches the file, the gate expires after GATE_TIMEOUT, and the final check names
the missing transition. On an idle machine the gate adds 0.02 s at most.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import bridge
from bridge import sqlitewal
from bridge.simulator import Simulator
from bridge.simulator.fleet import EventSpec

REPO_ROOT = Path(bridge.__file__).resolve().parent.parent
AGENT_VM = "vm-0"
OTHER_VM = "vm-1"
POLL_INTERVAL = 0.2  # the lowest the agent accepts: the most observations per lifetime

MIN_HOLD, MAX_HOLD = 1.0, 2.5  # seconds each scripted state lasts at least (see above)
GATE_TIMEOUT = 20.0  # an observed state reaches the file in milliseconds; this is a loss
MAX_LIVE_EVENTS = 3  # events in flight at once, so their changes interleave
# Far beyond the test: the simulator's own clock never starts or ends an event; only the
# script does, so the script alone decides how long each state lasts.
NEVER = 3600.0

# Where each agent's kill lands, in turn. Every moment within a mode is random (seeded);
# the rotation itself is fixed so that every run, short or long, has the same mix.
KILL_MODES = (
    # 0-0.3 s after spawn: imports, spool open or schema creation, the Start heartbeat.
    # The first agent is one, so the kill can land in the creation of the spool.
    "early",
    # 0-1.2 s after the agent's first poll: 0.4-1.6 s of uptime, anywhere in its cycle.
    "after-poll",
    # The moment the spool is next written after the script changed a document: right
    # after the poll that sees the change begins to commit what it observed. A spool that
    # split records and state into two transactions would lose the records here.
    "at-commit",
    # 0-0.4 s after the script changes a document: around the poll that sees the change,
    # its commit and its delivery, where a lost or doubled record would come from.
    "after-change",
    "after-poll",
    # The moment the sink file grows: between the sink's write and the acknowledgement
    # in the spool, so the batch is delivered again; that is where duplicates come from.
    "at-sink-write",
)
EARLY_KILL = (0.0, 0.3)  # the first poll comes 0.4 s after spawn at the earliest
AFTER_POLL_KILL = (0.0, 1.2)
AFTER_CHANGE_KILL = (0.0, 0.4)
MODE_WAIT = 15.0  # for a first poll, a change or a write; then kill anyway

SCHEDULED_EVENTS_GETS = "GET scheduledevents"


def agent_argv(imds_url: str, tmp: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bridge",
        "agent",
        "--imds-url",
        imds_url,
        "--state-dir",
        str(tmp / "state"),
        "--sink",
        f"jsonl:{tmp / 'out.jsonl'}",
        "--poll-interval",
        str(POLL_INTERVAL),
    ]


def agent_env() -> dict[str, str]:
    """The test's environment minus SE_BRIDGE_* settings (they would reconfigure the agent),
    with this checkout first on the path so the agent runs the code the test imported."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SE_BRIDGE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def spawn_agent(argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start an agent whose log is appended to `log_path` (a file, never a pipe: a pipe
    nobody drains would block the agent)."""
    with log_path.open("ab") as stderr:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=agent_env(),
        )


class Changes:
    """Counts document changes so the killer can aim at the moments right after one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    def bump(self) -> None:
        with self._lock:
            self._count += 1

    def count(self) -> int:
        with self._lock:
            return self._count


class OutputWatcher:
    """Follows the jsonl file as the agent appends: which (EventId, Transition) reached it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._seen: set[tuple[str, str]] = set()

    def has(self, event_id: str, transition: str) -> bool:
        self._refresh()
        return (event_id, transition) in self._seen

    def _refresh(self) -> None:
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                data = file.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # the final check reports every bad line; here it only gates
            if isinstance(record, dict) and record.get("RecordType") == "Event":
                self._seen.add((str(record.get("EventId")), str(record.get("Transition"))))


# --- the script ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """A transition the agent must record, with the PreviousStatus it must carry."""

    transition: str
    previous_status: str | None


# Each lifecycle: the actions the script takes after adding the event, and what the agent
# must record for it, in order. IMDS has no Completed or Canceled status: "complete" and
# "cancel" make the event vanish.
LIFECYCLES: dict[str, tuple[tuple[str, ...], tuple[Expected, ...]]] = {
    "completed": (
        ("start", "complete"),
        (Expected("Scheduled", None), Expected("Started", "Scheduled"),
         Expected("Completed", "Started")),
    ),
    "canceled": (
        ("cancel",),
        (Expected("Scheduled", None), Expected("Canceled", "Scheduled")),
    ),
    # First seen as Started, as after a hardware failure.
    "started-directly": (
        ("complete",),
        (Expected("Started", None), Expected("Completed", "Started")),
    ),
}  # fmt: skip
LIFECYCLE_WEIGHTS = {"completed": 5, "canceled": 3, "started-directly": 2}


@dataclass
class ScriptedEvent:
    event_id: str
    lifecycle: str
    resources: tuple[str, ...]
    actions: list[str]
    expected: tuple[Expected, ...]
    done: int = 1  # how many of `expected` the script has brought about so far
    due: float = 0.0  # when the current state may end, gate permitting
    since: float = 0.0  # when the current state began

    @property
    def awaiting(self) -> str:
        return self.expected[self.done - 1].transition


@dataclass
class ScriptStats:
    gate_timeouts: list[str] = field(default_factory=list)
    longest_gate_wait: float = 0.0


class Script:
    """Adds events and moves each through its lifecycle with explicit control calls."""

    def __init__(
        self, sim: Simulator, watcher: OutputWatcher, changes: Changes, rng: random.Random
    ) -> None:
        self.sim, self.watcher, self.changes, self.rng = sim, watcher, changes, rng
        self.events: list[ScriptedEvent] = []
        self.stats = ScriptStats()
        self._live: list[ScriptedEvent] = []
        self._next_start = 0.0
        self._gating = True

    def run(self, more: Callable[[int], bool], deadline: float) -> None:
        """Start events while `more(started)`, finish every one, then return."""
        while time.monotonic() < deadline:
            now = time.monotonic()
            if more(len(self.events)) and len(self._live) < MAX_LIVE_EVENTS:
                if now >= self._next_start:
                    self._add(now)
                    self._next_start = now + self.rng.uniform(0.2, 1.5)
            elif not self._live:
                return
            for event in list(self._live):
                self._advance(event, now)
            time.sleep(0.02)

    def _add(self, now: float) -> None:
        rng = self.rng
        lifecycle = rng.choices(list(LIFECYCLE_WEIGHTS), list(LIFECYCLE_WEIGHTS.values()))[0]
        actions, expected = LIFECYCLES[lifecycle]
        started = lifecycle == "started-directly"
        resources = rng.choice([(AGENT_VM,), (OTHER_VM,), (AGENT_VM, OTHER_VM)])
        spec = EventSpec(
            event_type="Reboot" if started else rng.choice(["Freeze", "Reboot", "Redeploy"]),
            resources=resources,
            # Both VMs see every event, so AffectsThisVm is true for some and false for others.
            audience=(AGENT_VM, OTHER_VM),
            notice=NEVER,
            run_time=NEVER,
            status="Started" if started else "Scheduled",
            description=f"kill -9 test event {len(self.events)} ({lifecycle})",
            duration_in_seconds=rng.choice([-1, 0, 5, 30]),
        )
        event_id = self.sim.add_event(spec)
        self.changes.bump()
        event = ScriptedEvent(event_id, lifecycle, resources, list(actions), expected)
        self._hold(event, now)
        self.events.append(event)
        self._live.append(event)

    def _hold(self, event: ScriptedEvent, now: float) -> None:
        event.since = now
        event.due = now + self.rng.uniform(MIN_HOLD, MAX_HOLD)

    def _advance(self, event: ScriptedEvent, now: float) -> None:
        if now < event.due:
            return
        if self._gating and not self.watcher.has(event.event_id, event.awaiting):
            if now - event.since < GATE_TIMEOUT:
                return
            # A loss. Stop gating so the run ends soon; the final check says what is missing.
            self.stats.gate_timeouts.append(f"{event.event_id} {event.awaiting}")
            self._gating = False
        self.stats.longest_gate_wait = max(self.stats.longest_gate_wait, now - event.due)
        if not event.actions:
            self._live.remove(event)  # its last transition is in the file (or declared lost)
            return
        action = event.actions.pop(0)
        {
            "start": self.sim.start_event,
            "complete": self.sim.complete_event,
            "cancel": self.sim.cancel_event,
        }[action](event.event_id)
        self.changes.bump()
        event.done += 1
        self._hold(event, now)


# --- the killer ---------------------------------------------------------------------------


@dataclass
class KillStats:
    spawns: int = 0
    kills: int = 0  # agents SIGKILLed while running
    before_first_poll: int = 0  # of those, how many had not polled IMDS yet
    by_mode: Counter[str] = field(default_factory=Counter)
    exits: list[str] = field(default_factory=list)  # agents that ended by themselves
    first_poll_seconds: list[float] = field(default_factory=list)  # spawn -> first poll

    def summary(self) -> str:
        startup = self.first_poll_seconds
        return (
            f"{self.spawns} agents, {self.kills} SIGKILLs ({self.before_first_poll} before the "
            f"first poll; by mode {dict(self.by_mode)}); spawn->first poll "
            f"median {statistics.median(startup or [0]):.2f}s max {max(startup or [0]):.2f}s"
        )


class AgentKiller:
    """Runs the agent, kills it with SIGKILL at a random moment, restarts it, repeats.

    `stop()` ends the cycle with an agent running, for the test to stop cleanly.
    """

    def __init__(
        self,
        argv: list[str],
        log_path: Path,
        output: Path,
        spool: Path,
        *,
        sim: Simulator,
        changes: Changes,
        rng: random.Random,
    ) -> None:
        self.argv, self.log_path, self.output = argv, log_path, output
        # SQLite appends every transaction to the WAL first: its writes are the commits.
        self.wal = sqlitewal.wal_path(spool)
        self.sim, self.changes, self.rng = sim, changes, rng
        self.stats = KillStats()
        self.proc: subprocess.Popen[bytes] | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-killer", daemon=True)
        self._spawned_at = 0.0
        self._polls_at_spawn = 0

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def stop(self) -> subprocess.Popen[bytes]:
        """End the kill cycle; the agent then running is returned, still running."""
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.proc is not None
        return self.proc

    def serving(self) -> bool:
        """Whether the current agent is past its start: it has polled IMDS, so it handles
        SIGTERM. Two polls, because one may be a killed predecessor's last request that
        the simulator counted after the kill."""
        return polls(self.sim) - self._polls_at_spawn >= 2

    def close(self) -> None:
        """Leave no process behind, whatever happened (idempotent)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()

    def _run(self) -> None:
        try:
            while True:
                mode = KILL_MODES[(self.stats.spawns - 1) % len(KILL_MODES)]
                if not self._wait_for_kill_moment(mode):
                    return  # told to stop: the agent now running is the test's
                self._kill(mode)
                self._spawn()
        except BaseException as err:  # handed to the test thread by stop()
            self.error = err

    def _spawn(self) -> None:
        self.stats.spawns += 1
        self._note(f"agent #{self.stats.spawns} starts")
        self.proc = spawn_agent(self.argv, self.log_path)
        self._spawned_at = time.monotonic()
        self._polls_at_spawn = polls(self.sim)

    def _wait_for_kill_moment(self, mode: str) -> bool:
        """Sleep until this agent's kill moment; False when told to stop first."""
        rng = self.rng
        if mode == "early":
            return self._sleep_until(self._spawned_at + rng.uniform(*EARLY_KILL))
        if mode == "after-poll":
            offset = rng.uniform(*AFTER_POLL_KILL)
            if not self._wait_for(lambda: polls(self.sim) != self._polls_at_spawn):
                return False
            if polls(self.sim) != self._polls_at_spawn:
                self.stats.first_poll_seconds.append(time.monotonic() - self._spawned_at)
            return self._sleep_until(time.monotonic() + offset)
        if mode == "after-change":
            offset = rng.uniform(*AFTER_CHANGE_KILL)
            return self._wait_for_change() and self._sleep_until(time.monotonic() + offset)
        if mode == "at-commit":
            return self._wait_for_change() and self._wait_for_write(self.wal)
        return self._wait_for_write(self.output)

    def _wait_for_change(self) -> bool:
        seen = self.changes.count()
        return self._wait_for(lambda: self.changes.count() != seen)

    def _wait_for_write(self, path: Path) -> bool:
        before = _signature(path)
        return self._wait_for(lambda: _signature(path) != before)

    def _wait_for(self, condition: Callable[[], bool]) -> bool:
        """Poll `condition` tightly (a sink write is acknowledged within milliseconds) until
        it holds or MODE_WAIT passed; False when told to stop first."""
        deadline = time.monotonic() + MODE_WAIT
        while not condition() and time.monotonic() < deadline:
            if self._stop.wait(0.0005):
                return False
        return not self._stop.is_set()

    def _sleep_until(self, moment: float) -> bool:
        return not self._stop.wait(max(0.0, moment - time.monotonic()))

    def _kill(self, mode: str) -> None:
        proc = self.proc
        assert proc is not None
        uptime = time.monotonic() - self._spawned_at
        polled = polls(self.sim) != self._polls_at_spawn
        if proc.poll() is not None:
            self.stats.exits.append(f"agent #{self.stats.spawns} exited with {proc.returncode}")
            self._note(f"agent #{self.stats.spawns} had exited by itself ({proc.returncode})")
            return
        proc.kill()  # SIGKILL on POSIX
        code = proc.wait()
        if code != -signal.SIGKILL:
            self.stats.exits.append(f"agent #{self.stats.spawns} ended with {code}, not SIGKILL")
        self.stats.kills += 1
        self.stats.before_first_poll += not polled
        self.stats.by_mode[mode] += 1
        self._note(
            f"agent #{self.stats.spawns} SIGKILLed ({mode}) after {uptime:.2f}s"
            + ("" if polled else ", before its first poll")
        )

    def _note(self, text: str) -> None:
        # Between the agents' own lines, so a failure's log reads as one story.
        with self.log_path.open("a", encoding="utf-8") as file:
            file.write(f"--- test: {text} ---\n")


def _signature(path: Path) -> tuple[int, int] | None:
    """Changes whenever the file is written (a WAL is rewritten in place, so size alone
    would miss writes after a checkpoint)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


def polls(sim: Simulator) -> int:
    return sim.counters()[AGENT_VM].get(SCHEDULED_EVENTS_GETS, 0)

"""Real `se-bridge` processes for the end-to-end tests: start, watch, stop, read what they wrote.

Children write stdout and stderr to files, never to pipes: a pipe nobody drains fills up and
stalls the child, and an unclosed pipe is a ResourceWarning (an error in this suite). Every
wait polls a condition against a deadline and, on timeout, fails with what the process wrote,
so a failure explains itself without a rerun.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import requests

from tests.support.records import assert_valid
from tests.support.wait import TIMEOUT, eventually

PYTHON = sys.executable
POLL_INTERVAL = "0.25"
WAIT = 30.0  # generous: a timeout only costs time when something is already wrong
STOP_WAIT = 20.0
INSTANCE_API_VERSION = "2021-02-01"

T = TypeVar("T")
Record = dict[str, Any]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment without SE_BRIDGE_* settings, which would change what is tested."""
    # No PYTHONUNBUFFERED either: output must reach the files as it does for a user.
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SE_BRIDGE_")}
    env.pop("PYTHONUNBUFFERED", None)
    env.update(extra or {})
    return env


def tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


class Proc:
    """One child process with its output in files beside each other under `logdir`."""

    def __init__(self, name: str, argv: Sequence[str], logdir: Path, env: Mapping[str, str]):
        self.name = name
        self.argv = list(argv)
        self.out_path = logdir / f"{name}.stdout"
        self.err_path = logdir / f"{name}.stderr"
        options: dict[str, Any] = {}
        if sys.platform == "win32":
            # CTRL_BREAK_EVENT reaches only a process that leads its own group.
            options["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP
        # The child keeps its own copies of the descriptors; ours close at once.
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(env),
                **options,
            )

    def stdout(self) -> str:
        return self.out_path.read_text(encoding="utf-8", errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(encoding="utf-8", errors="replace")

    def output(self) -> str:
        code = self.popen.poll()
        # A process that died (a signal: a negative code) says so, even with nothing written.
        ended = "" if code is None else f" (exited: {_exit(code)})"
        return (
            f"--- {self.name} {self.argv}{ended}\n--- stdout:\n{tail(self.stdout())}\n"
            f"--- stderr:\n{tail(self.stderr())}"
        )

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def interrupt(self) -> None:
        """Ask the process to stop the way a service manager or Ctrl-Break does."""
        if not self.alive:
            return
        if sys.platform == "win32":
            self.popen.send_signal(signal.CTRL_BREAK_EVENT)
        else:
            self.popen.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = STOP_WAIT) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name} did not exit within {timeout:g} s\n{self.output()}"
            ) from None

    def stop(self, timeout: float = STOP_WAIT) -> int:
        self.interrupt()
        return self.wait(timeout)

    def kill(self) -> None:
        if self.alive:
            self.popen.kill()
        self.popen.wait()


def _exit(code: int) -> str:
    if code >= 0:
        return f"code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class Processes:
    """Every process a test started; `close` kills whatever is still running."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._procs: list[Proc] = []

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Proc:
        proc = Proc(name, argv, self.workdir, child_env(env))
        self._procs.append(proc)
        return proc

    def bridge(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Proc:
        return self.start(name, [PYTHON, "-m", "bridge", *args], env)

    def close(self) -> None:
        for proc in self._procs:
            proc.kill()


def run_bridge(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """A short `python -m bridge ...` run to completion, output captured."""
    return subprocess.run(  # noqa: PLW1510 - callers check the code themselves
        [PYTHON, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        env=child_env(env),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


_ANNOUNCE = re.compile(r"IMDS simulator for \d+ VMs at (\S+) ")


class Simulator:
    """A `se-bridge simulate` process and its control API."""

    def __init__(self, proc: Proc, url: str) -> None:
        self.proc = proc
        self.url = url

    @classmethod
    def launch(cls, procs: Processes, name: str, *args: str) -> Simulator:
        proc = procs.bridge(name, "simulate", "--port", "0", *args)
        return cls.attach(proc)

    @classmethod
    def attach(cls, proc: Proc) -> Simulator:
        """Wait for a launched simulator to say where it listens."""

        def announced() -> str | None:
            if not proc.alive:
                raise AssertionError(f"the simulator exited early\n{proc.output()}")
            match = _ANNOUNCE.search(proc.stdout())
            return match.group(1) if match else None

        url = eventually(announced, what="the simulator's announce line", details=proc.output)
        return cls(proc, url)

    def vm_url(self, vm: str) -> str:
        return f"{self.url}/vm/{vm}"

    def call(self, method: str, path: str, body: Any = None) -> Any:
        # One short-lived session per call: nothing stays open, and no proxy from the
        # environment gets between the test and 127.0.0.1.
        with requests.Session() as session:
            session.trust_env = False
            response = session.request(method, self.url + path, json=body, timeout=10,
                                       headers={"Content-Type": "application/json"})  # fmt: skip
        assert response.ok, f"{method} {path} {body!r}: {response.status_code} {response.text}"
        return response.json()

    # -- the control API -------------------------------------------------------------------

    def fleet(self) -> dict[str, dict[str, Any]]:
        return {vm["name"]: vm for vm in self.call("GET", "/control/fleet")["vms"]}

    def incarnation(self, vm: str) -> int:
        return int(self.fleet()[vm]["documentIncarnation"])

    def scenario(self, name: str, **options: Any) -> list[str]:
        ids: list[str] = self.call("POST", "/control/scenarios", {"name": name, **options})[
            "eventIds"
        ]
        return ids

    def add_event(self, **spec: Any) -> str:
        event_id: str = self.call("POST", "/control/events", spec)["eventId"]
        return event_id

    def act(self, event_id: str, action: str) -> None:
        self.call("POST", f"/control/events/{event_id}/{action}")

    def events(self) -> dict[str, dict[str, Any]]:
        return {ev["eventId"]: ev for ev in self.call("GET", "/control/events")["events"]}

    def counters(self) -> dict[str, dict[str, int]]:
        counters: dict[str, dict[str, int]] = self.call("GET", "/control/counters")["counters"]
        return counters

    def polls(self, vm: str) -> int:
        return self.counters()[vm].get("GET scheduledevents", 0)

    def wait_polls(
        self, minimum: Mapping[str, int], what: str = "agents to poll", timeout: float = TIMEOUT
    ) -> None:
        """Until each VM has answered at least `minimum[vm]` scheduled-events GETs.

        An agent polls one request at a time, so a VM polled by one agent that has received
        request n+1 has finished observing answer n.
        """

        def short() -> dict[str, int]:
            counters = self.counters()
            return {
                vm: counters[vm].get("GET scheduledevents", 0)
                for vm, n in minimum.items()
                if counters[vm].get("GET scheduledevents", 0) < n
            }

        eventually(lambda: not short(), what=what, details=lambda: f"still short: {short()}",
                   timeout=timeout)  # fmt: skip

    def compute(self, vm: str) -> dict[str, Any]:
        """The VM's instance metadata, read the way the agent reads it (only without faults)."""
        with requests.Session() as session:
            session.trust_env = False
            response = session.get(
                f"{self.vm_url(vm)}/metadata/instance",
                params={"api-version": INSTANCE_API_VERSION},
                headers={"Metadata": "true"},
                timeout=10,
            )
        assert response.status_code == 200, response.text
        compute: dict[str, Any] = response.json()["compute"]
        return compute


def read_records(path: Path) -> list[Record]:
    """Complete lines only: the agent may be halfway through appending the next one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")[:-1]
    return [json.loads(line) for line in lines if line.strip()]


class Agent:
    """A `se-bridge agent` for one VM, with its own state directory and jsonl sink.

    `start` again after `stop` restarts it on the same state directory and sink.
    """

    def __init__(
        self,
        procs: Processes,
        name: str,
        imds_url: str,
        *,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.procs = procs
        self.name = name
        self.state_dir = procs.workdir / name
        self.sink = procs.workdir / f"{name}.jsonl"
        self.argv = [
            "agent",
            "--imds-url",
            imds_url,
            "--state-dir",
            str(self.state_dir),
            "--sink",
            f"jsonl:{self.sink}",
            "--poll-interval",
            POLL_INTERVAL,
            *args,
        ]
        self.env = dict(env or {})
        self.runs: list[Proc] = []

    def start(self) -> Agent:
        assert not self.runs or not self.proc.alive, f"{self.name} is already running"
        self.runs.append(
            self.procs.bridge(f"{self.name}.{len(self.runs)}", *self.argv, env=self.env)
        )
        return self

    @property
    def proc(self) -> Proc:
        return self.runs[-1]

    def stderr(self) -> str:
        return "\n".join(run.stderr() for run in self.runs)

    def records(self) -> list[Record]:
        return read_records(self.sink)

    def describe(self) -> str:
        lines = [json.dumps(_brief(r)) for r in self.records()]
        return f"--- {self.sink}:\n" + "\n".join(lines) + "\n" + self.proc.output()

    def wait_for(
        self, predicate: Callable[[list[Record]], object], what: str, timeout: float = WAIT
    ) -> list[Record]:
        """The records once `predicate` holds for them; fails with the file and the log."""

        def check() -> list[Record] | None:
            records = self.records()
            if predicate(records):
                return records
            if not self.proc.alive:
                raise AssertionError(f"{self.name} exited while waiting for {what}")
            return None

        return eventually(
            check, what=f"{self.name}: {what}", timeout=timeout, details=self.describe
        )

    def wait_transition(self, event_id: str, transition: str) -> Record:
        records = self.wait_for(
            lambda rs: any(_is(r, event_id, transition) for r in rs),
            f"{transition} of {event_id}",
        )
        return next(r for r in records if _is(r, event_id, transition))

    def wait_polling(self) -> None:
        """Until the agent's loop runs: it logs this line just before its first poll."""
        eventually(
            lambda: " polling http" in self.proc.stderr(),
            what=f"{self.name} to start polling",
            details=self.describe,
        )

    def stop(self) -> int:
        return self.proc.stop()


def agent_reporting_a_freeze(
    procs: Processes, agents: Processes | None = None
) -> tuple[Simulator, Agent, str]:
    """A one-VM simulator (run by `procs`) and its agent (by `agents`, default `procs`), once
    the agent has reported a Freeze's Scheduled transition; the Freeze's EventId."""
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    agent = Agent(agents or procs, "vm-0", sim.vm_url("vm-0")).start()
    sim.wait_polls({"vm-0": 2})
    event_id = sim.add_event(EventType="Freeze", Resources=["vm-0"], notice=3600.0)
    agent.wait_transition(event_id, "Scheduled")
    return sim, agent, event_id


def _is(record: Record, event_id: str, transition: str) -> bool:
    return bool(
        record["RecordType"] == "Event"
        and record["EventId"] == event_id
        and record["Transition"] == transition
    )


_BRIEF = (
    "RecordType", "TimeGenerated", "EventId", "Transition", "HeartbeatReason", "HookPhase",
    "DocumentIncarnation", "PreviousIncarnation", "AffectsThisVm", "Inferred", "RecordId",
)  # fmt: skip


def _brief(record: Record) -> dict[str, Any]:
    return {k: record[k] for k in _BRIEF if k in record}


def assert_all_valid(records: Iterable[Record]) -> None:
    for record in records:
        try:
            assert_valid(record)
        except AssertionError as err:
            raise AssertionError(f"{err}\nin {json.dumps(record)}") from None


# The line a process logs when its telemetry endpoint listens (bridge/telemetry.py).
PROBES = re.compile(r"metrics and health probes at (http://\S+)/metrics")


def scrape(proc_output: Callable[[], str], timeout: float = WAIT) -> dict[str, float]:
    """The samples of a process's /metrics, found through the address its log names."""
    found = eventually(
        lambda: PROBES.search(proc_output()),
        what="the telemetry endpoint's address",
        timeout=timeout,
    )
    text = requests.get(f"{found.group(1)}/metrics", timeout=min(timeout, 120)).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples

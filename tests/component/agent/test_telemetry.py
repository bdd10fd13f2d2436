"""The agent's telemetry endpoint: metrics that count what the agent did, health probes that
fail and recover with IMDS and a sink, and the systemd notify protocol."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests

import bridge
from bridge.agent.loop import Agent
from bridge.agent.wiring import build_agent
from bridge.config import AgentSettings, Config, ImdsSettings
from bridge.retry import Backoff, PermanentError
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import EventSpec
from bridge.sinks.base import BaseSink, SpooledRecord
from bridge.sinks.jsonl import JsonlSink
from tests.support.wait import eventually

VM = "vm-0"


class FlakySink(BaseSink):
    """A sink that refuses for good (a 403, say) while `broken`."""

    name = "flaky"
    max_batch = 100

    def __init__(self) -> None:
        self.broken = True
        self.got: list[SpooledRecord] = []

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        if self.broken:
            raise PermanentError("403 from the flaky double: not allowed")
        self.got += batch

    def close(self) -> None:
        pass


@pytest.fixture
def made(
    sim: tuple[Simulator, SimulatorServer], tmp_path: Path
) -> Iterator[tuple[Agent, FlakySink, list[datetime]]]:
    _, server = sim
    config = Config(
        agent=AgentSettings(poll_interval=0.2, state_dir=tmp_path, metrics_address="0"),
        imds=ImdsSettings(url=server.vm_url(VM), timeout=2, first_call_timeout=5),
    )
    clock = [datetime.now(timezone.utc)]
    sink = FlakySink()
    agent = build_agent(config, sinks=[sink], now=lambda: clock[0],
                  delivery_backoff=lambda: Backoff(initial=0.05, maximum=0.1))  # fmt: skip
    agent.serve_telemetry()
    agent.start()
    yield agent, sink, clock
    agent.shutdown()


def get(agent: Agent, path: str) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{agent.telemetry_port}{path}", timeout=5)


def test_readiness_fails_and_recovers_with_imds_and_a_sink(
    sim: tuple[Simulator, SimulatorServer], made: tuple[Agent, FlakySink, list[datetime]]
) -> None:
    simulator, _ = sim
    agent, sink, clock = made
    answer = get(agent, "/readyz")
    assert answer.status_code == 503
    assert "IMDS has not answered" in answer.json()["why"]
    agent.cycle()
    # The Start heartbeat reached the sink, which refuses it for good.
    eventually(
        lambda: "flaky fails for good" in get(agent, "/readyz").json()["why"], what="not ready"
    )
    sink.broken = False
    eventually(lambda: get(agent, "/readyz").status_code == 200, what="ready again")
    simulator.set_faults({"rate503": 1.0}, VM)
    clock[0] += timedelta(seconds=15)
    agent.cycle()
    answer = get(agent, "/readyz")
    assert answer.status_code == 503
    assert "IMDS has not answered since" in answer.json()["why"]
    simulator.clear_faults()
    eventually(
        lambda: (agent.cycle(), get(agent, "/readyz").status_code)[1] == 200, what="IMDS back"
    )
    assert get(agent, "/healthz").status_code == 200
    assert get(agent, "/nothing").status_code == 404


@pytest.mark.slow
def test_metrics_count_what_the_agent_did(
    sim: tuple[Simulator, SimulatorServer], made: tuple[Agent, FlakySink, list[datetime]]
) -> None:
    simulator, _ = sim
    agent, sink, _ = made
    agent.cycle()
    event = simulator.add_event(EventSpec("Freeze", (VM,)))
    agent.cycle()
    agent.cycle()
    eventually(lambda: "se_bridge_delivery_failures_total{kind=\"permanent\"" in get(
        agent, "/metrics").text, what="the sink's failure counted")  # fmt: skip
    text = get(agent, "/metrics").text
    samples = dict(_samples(text))
    assert samples['se_bridge_imds_polls_total{outcome="ok"}'] >= 3
    assert samples['se_bridge_records_total{transition="Scheduled",type="Event"}'] == 1
    assert samples['se_bridge_records_total{transition="",type="Heartbeat"}'] == 1
    assert samples['se_bridge_delivery_failures_total{kind="permanent",sink="flaky"}'] >= 1
    assert samples['se_bridge_spool_waiting_records{sink="flaky"}'] >= 2
    assert samples['se_bridge_spool_oldest_waiting_age_seconds{sink="flaky"}'] >= 0
    assert samples["se_bridge_imds_last_success_timestamp_seconds"] > 0
    assert "process_resident_memory_bytes" in text
    assert event not in text  # no label per event
    assert sink.got == []


def _samples(text: str) -> Iterator[tuple[str, float]]:
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            yield name, float(value)


def heard_by_systemd(
    server: SimulatorServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    enough: Callable[[list[str]], bool],
) -> list[str]:
    """What an agent run under systemd with WatchdogSec=0.4 s (a ping at least every 0.2 s)
    says to $NOTIFY_SOCKET: until `enough` of it was heard, then up to STOPPING=1."""
    address = str(tmp_path / "notify")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    config = Config(
        agent=AgentSettings(poll_interval=0.2, state_dir=tmp_path / "state"),
        imds=ImdsSettings(url=server.vm_url(VM), timeout=5, first_call_timeout=5),
    )
    agent = build_agent(config)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    heard: list[str] = []
    try:
        try:
            while not enough(heard):
                assert len(heard) < 100, heard  # a watchdog ping every 0.2 s: 20 s at most
                heard.append(listener.recv(1024).decode())
        finally:
            stop.set()
            runner.join(30)
        while heard[-1] != "STOPPING=1":
            heard.append(listener.recv(1024).decode())
    finally:
        listener.close()
    return heard


def test_systemd_hears_ready_the_watchdog_and_stopping(
    sim: tuple[Simulator, SimulatorServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heard = heard_by_systemd(sim[1], tmp_path, monkeypatch,
                             lambda heard: heard.count("WATCHDOG=1") >= 3)  # fmt: skip
    assert heard[0].startswith("READY=1")
    assert heard.count("WATCHDOG=1") >= 3
    assert heard[-1] == "STOPPING=1"


def test_metrics_label_sinks_by_kind_and_show_the_build_and_the_next_event(
    sim: tuple[Simulator, SimulatorServer], tmp_path: Path
) -> None:
    simulator, server = sim
    config = Config(
        agent=AgentSettings(poll_interval=0.2, state_dir=tmp_path / "state", metrics_address="0"),
        imds=ImdsSettings(url=server.vm_url(VM), timeout=2, first_call_timeout=5),
    )
    first, second = tmp_path / "a" / "records.jsonl", tmp_path / "b" / "records.jsonl"
    agent = build_agent(config, sinks=[JsonlSink(first), JsonlSink(second)])
    agent.serve_telemetry()
    agent.start()
    try:
        agent.cycle()
        samples = dict(_samples(get(agent, "/metrics").text))
        assert "se_bridge_next_event_start_timestamp_seconds" not in samples  # nothing pending
        assert samples["se_bridge_events_pending"] == 0
        event = simulator.add_event(EventSpec("Freeze", (VM,)))
        agent.cycle()
        agent.cycle()
        text = get(agent, "/metrics").text
    finally:
        agent.shutdown()
    samples = dict(_samples(text))
    assert str(tmp_path) not in text  # a sink is named by its kind, not its file
    assert {'se_bridge_spool_waiting_records{sink="jsonl"}',
            'se_bridge_spool_waiting_records{sink="jsonl-2"}'} <= set(samples)  # fmt: skip
    assert samples[f'se_bridge_build_info{{version="{bridge.__version__}"}}'] == 1
    assert samples["se_bridge_events_pending"] == 1
    record = next(json.loads(line) for line in first.read_text().splitlines()
                  if event in line)  # fmt: skip
    start = datetime.fromisoformat(record["NotBefore"].replace("Z", "+00:00")).timestamp()
    assert samples["se_bridge_next_event_start_timestamp_seconds"] == start


def test_systemd_hears_ready_before_instance_metadata_and_the_watchdog_while_it_waits(
    sim: tuple[Simulator, SimulatorServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instance metadata may take 2 minutes to answer (imds.first_call_timeout) and systemd's
    start timeout is 90 s: READY=1 comes first, with the wait in STATUS=, and the watchdog
    hears the loop is alive while it waits."""
    simulator, server = sim
    simulator.set_faults({"latency": 1.5})  # every IMDS answer, instance metadata's too
    try:
        heard = heard_by_systemd(
            server, tmp_path, monkeypatch, lambda heard: any("STATUS=running" in m for m in heard)
        )
    finally:
        simulator.clear_faults()
    assert heard[0].startswith("READY=1\n"), heard
    assert "STATUS=waiting for instance metadata" in heard[0]
    running = next(n for n, message in enumerate(heard) if "STATUS=running" in message)
    assert "WATCHDOG=1" in heard[:running]

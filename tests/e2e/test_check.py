"""`se-bridge check`: a harmless round trip to every configured sink, with advice when it fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.cloud import cloud_env
from tests.support.processes import Processes, Simulator, child_env

pytestmark = pytest.mark.e2e


def check(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bridge", "check", "--sink", "eventhubs",
            "--sink", "loganalytics", "--sink", f"jsonl:{tmp_path / 'out.jsonl'}"]  # fmt: skip
    return subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        argv, env=child_env(env), capture_output=True, text=True, timeout=120
    )


def test_check_says_ok_for_every_sink_and_stores_nothing(
    procs: Processes, broker: EventHubsBroker, logs: LogsIngestionDouble, tmp_path: Path
) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    result = check(cloud_env(broker, logs, sim.vm_url("vm-0")), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["ok", "eventhubs:"],
        ["ok", "loganalytics:"],
        ["ok", f"jsonl:{tmp_path / 'out.jsonl'}:"],
    ]
    assert broker.events() == []
    assert logs.records() == []
    assert not (tmp_path / "out.jsonl").exists()  # check writes nothing, not even an empty file


def test_check_gives_advice_and_exit_1_when_a_role_is_missing(
    procs: Processes, broker: EventHubsBroker, logs: LogsIngestionDouble, tmp_path: Path
) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    logs.script(403)
    result = check(cloud_env(broker, logs, sim.vm_url("vm-0")), tmp_path)
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1
    assert (
        "grant the VM's system-assigned managed identity the Monitoring Metrics Publisher"
        in (failed[0])
    )
    assert broker.key not in result.stdout + result.stderr
    for token in logs.tokens_seen:
        assert token not in result.stdout + result.stderr


def test_unconfigured_sinks_do_not_import_their_sdks(tmp_path: Path) -> None:
    code = (
        "import sys; from bridge import config, sinks; from bridge.agent import wiring; "
        "c = config.load(environ={}, flags={'agent.sinks': ['stdout'], "
        f"'agent.state_dir': {str(tmp_path)!r}}}); "
        "[sinks.build(s, c) for s in c.sink_specs()]; "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('azure.')}))"
    )
    result = subprocess.run(  # noqa: PLW1510
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

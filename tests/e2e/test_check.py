"""`se-bridge check`: a harmless round trip to every configured sink, with advice when it fails."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.cloud import cloud_env
from tests.support.processes import Processes, Simulator, child_env

pytestmark = pytest.mark.e2e


def check(env: dict[str, str], tmp_path: Path, imds_url: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bridge", "check", "--imds-url", imds_url, "--sink", "eventhubs",
            "--sink", "loganalytics", "--sink", f"jsonl:{tmp_path / 'out.jsonl'}"]  # fmt: skip
    return subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        argv, env=child_env(env), capture_output=True, text=True, timeout=120
    )


def test_check_says_ok_for_every_sink_and_stores_nothing(
    procs: Processes, broker: EventHubsBroker, logs: LogsIngestionDouble, tmp_path: Path
) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    result = check(cloud_env(broker, logs, sim.vm_url("vm-0")), tmp_path, sim.vm_url("vm-0"))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["ok", "imds"],
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
    result = check(cloud_env(broker, logs, sim.vm_url("vm-0")), tmp_path, sim.vm_url("vm-0"))
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


# --- issue 39, item 3: the IMDS address is a setting, and check tries it --------------------


def _bridge(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is asserted
        [sys.executable, "-m", "bridge", *args], env=child_env(env), capture_output=True,
        text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("command", ["agent", "check"])
def test_an_imds_url_without_its_scheme_is_a_setting_error_that_says_what_to_write(
    command: str, tmp_path: Path
) -> None:
    sink = f"jsonl:{tmp_path / 'out.jsonl'}"
    flag = _bridge(command, "--imds-url", "127.0.0.1:8080/vm/vm-0", "--sink", sink,
                   "--state-dir", str(tmp_path / "state"))  # fmt: skip
    env = _bridge(command, "--sink", sink, "--state-dir", str(tmp_path / "state"),
                  env={"SE_BRIDGE_IMDS_URL": "169.254.169.254"})  # fmt: skip
    for result, where in ((flag, "command line"), (env, "SE_BRIDGE_IMDS_URL")):
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert "imds.url" in result.stderr, result.stderr
        assert where in result.stderr, result.stderr
    assert "write http://127.0.0.1:8080/vm/vm-0" in flag.stderr, flag.stderr
    assert "write http://169.254.169.254" in env.stderr, env.stderr


def test_check_asks_imds_and_says_what_answered(procs: Processes, tmp_path: Path) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    sink = f"jsonl:{tmp_path / 'out.jsonl'}"
    result = _bridge("check", "--imds-url", sim.vm_url("vm-0"), "--sink", sink)
    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"ok      imds {sim.vm_url('vm-0')}: "), first
    assert "Scheduled Events answered" in first, first
    assert "VM vm-0" in first, first


def test_check_fails_when_nothing_or_something_else_answers_at_the_imds_address(
    procs: Processes, tmp_path: Path
) -> None:
    with socket.socket() as sock:  # a port nothing listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sink = f"jsonl:{tmp_path / 'out.jsonl'}"
    nobody = _bridge("check", "--imds-url", f"http://127.0.0.1:{port}", "--sink", sink)
    assert nobody.returncode == 1, nobody.stdout + nobody.stderr
    first = nobody.stdout.splitlines()[0]
    assert first.startswith(f"FAILED  imds http://127.0.0.1:{port}: "), first
    assert "refused" in first, first

    sim = Simulator.launch(procs, "sim", "--vms", "1")
    # The simulator's control API is a web server, but not a VM's IMDS.
    other = _bridge("check", "--imds-url", f"{sim.url}/control", "--sink", sink)
    assert other.returncode == 1, other.stdout + other.stderr
    first = other.stdout.splitlines()[0]
    assert first.startswith(f"FAILED  imds {sim.url}/control: "), first
    assert "answered 404" in first or "not a Scheduled Events document" in first, first


def test_check_says_when_imds_serves_no_instance_metadata(procs: Processes, tmp_path: Path) -> None:
    # As Microsoft's mock server: Scheduled Events, and 404 for instance metadata.
    sim = Simulator.launch(procs, "sim", "--vms", "1", "--rate-no-instance", "1")
    sink = f"jsonl:{tmp_path / 'out.jsonl'}"
    alone = _bridge("check", "--imds-url", sim.vm_url("vm-0"), "--sink", sink)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    first = alone.stdout.splitlines()[0]
    assert "no instance metadata (IMDS answered 404)" in first, first
    assert "set agent.vm_name (--vm-name)" in first, first
    named = _bridge("check", "--imds-url", sim.vm_url("vm-0"), "--sink", sink,
                    env={"SE_BRIDGE_AGENT_VM_NAME": "vm-0"})  # fmt: skip
    assert "no instance metadata (IMDS answered 404): VM vm-0 (agent.vm_name)" in named.stdout

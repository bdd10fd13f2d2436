"""`se-bridge status` as a monitoring check (Nagios, Icinga, Sensu), run as a user runs it
(issue 39, item 7): the first line of stdout says the level whatever it is, a reader that goes
away after that line ends nothing in a traceback, and what it says of IMDS is what an
operator needs to find why it does not answer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import PYTHON, Agent, Processes, Simulator, child_env, run_bridge
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e


def test_every_level_says_its_first_line_on_stdout(tmp_path: Path) -> None:
    """Nagios reads the first line of stdout: UNKNOWN too, not only OK to CRITICAL."""
    nothing = run_bridge("status", "--state-dir", str(tmp_path / "none"))
    assert nothing.returncode == 3
    assert nothing.stdout.splitlines()[0].startswith("UNKNOWN: there is no spool"), nothing
    for bad in (["--backlog-age", "soon"], ["--no-such-option"]):
        usage = run_bridge("status", "--state-dir", str(tmp_path), *bad)
        assert usage.returncode == 3, bad
        first = usage.stdout.splitlines()[0] if usage.stdout else ""
        assert first.startswith("UNKNOWN: se-bridge status: "), (bad, usage)
        assert bad[0] in first or "soon" in first, (bad, first)
    # The consumer's check too: here, no signing key to verify what people decided with.
    consumer = run_bridge("status", "--consumer", "--state", f"sqlite:{tmp_path / 'fleet.db'}")
    assert consumer.returncode == 3
    assert consumer.stdout.startswith("UNKNOWN: "), consumer
    assert "signing_key" in consumer.stdout.splitlines()[0]


def _into_a_gone_reader(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The command with its stdout into a pipe whose reader has gone, as `| head -1` leaves
    it once it has its line: every write meets EPIPE, so the outcome does not hang on timing."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(  # noqa: PLW1510 - the caller checks the code
            [PYTHON, "-m", "bridge", *args],
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            env=child_env(),
            timeout=60,
        )
    finally:
        os.close(write)


def test_a_reader_that_goes_away_ends_no_traceback(procs: Processes, tmp_path: Path) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    agent = Agent(procs, "vm-0", sim.vm_url("vm-0")).start()
    sim.wait_polls({"vm-0": 2})
    for args in (["--state-dir", str(agent.state_dir)], ["--state-dir", str(tmp_path / "none")]):
        expected = run_bridge("status", *args).returncode
        done = _into_a_gone_reader("status", *args)
        assert done.stderr == b"", done.stderr.decode()
        # The level stays the exit code: `set -o pipefail` scripts read it.
        assert done.returncode == expected, args
    assert agent.stop() == 0
    # Any command's output, help included: no traceback, the shell's code for a broken pipe.
    helped = _into_a_gone_reader("status", "--help")
    assert (helped.returncode, helped.stderr) == (141, b""), helped.stderr.decode()


def test_imds_address_and_last_error_before_it_ever_answered(procs: Processes) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    url = sim.vm_url("vm-0")
    # IMDS refuses every Scheduled Events call: it has never answered this agent.
    agent = Agent(procs, "vm-0", url, env={"SE_BRIDGE_IMDS_API_VERSION": "1999-01-01"}).start()
    eventually(
        lambda: sim.counters()["vm-0"].get("status 400", 0) >= 2,
        what="two refused polls",
        details=agent.describe,
    )

    def said() -> str | None:
        text = run_bridge("status", "--state-dir", str(agent.state_dir)).stdout
        return text if "400" in text else None

    text = eventually(said, what="status to show the refusal", details=agent.describe)
    assert "None" not in text, text
    assert "not yet answered" in text, text
    assert url in text, text
    imds = next(line for line in text.splitlines() if url in line)
    assert "400" in text.split(imds, 1)[1] or "400" in imds, text
    as_json = json.loads(run_bridge("status", "--state-dir", str(agent.state_dir), "--json").stdout)
    assert as_json["heartbeat"]["imds_url"] == url
    assert "400" in as_json["heartbeat"]["last_imds_error"]["error"]
    assert as_json["heartbeat"]["last_imds_error"]["at"]
    assert agent.stop() == 0

"""What the agent leaves on disk is not for every user of the VM (docs/operations.md)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.support.processes import Agent, Processes, Simulator, run_bridge

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.name != "posix", reason="POSIX modes; Windows has ACLs"),
]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("existing", [False, True], ids=["new", "made 0755 by hand"])
def test_the_state_directory_and_files_are_closed_to_other_users(
    procs: Processes, existing: bool
) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")
    agent = Agent(procs, "vm-0", sim.vm_url("vm-0"))
    if existing:
        agent.state_dir.mkdir(mode=0o755)
        agent.state_dir.chmod(0o755)
    agent.start()
    sim.wait_polls({"vm-0": 2})
    assert agent.stop() == 0
    assert mode(agent.state_dir) & 0o077 in (0, 0o050)  # 0700 or 0750: no "other" bits
    assert mode(agent.state_dir) & 0o007 == 0
    for path in [agent.sink, *agent.state_dir.iterdir()]:
        assert mode(path) & 0o007 == 0, f"{path} is {mode(path):o}"
        assert mode(path) & 0o022 == 0, f"{path} is {mode(path):o}"


def test_a_config_file_that_holds_a_secret_and_others_can_read_is_warned_about(
    procs: Processes, tmp_path: Path
) -> None:
    sim = Simulator.launch(procs, "sim", "--vms", "1")  # `check` asks IMDS too
    config = tmp_path / "agent.toml"
    config.write_text(
        '[eventhubs]\nconnection_string = "Endpoint=sb://x/;SharedAccessKeyName=k;'
        'SharedAccessKey=TOPSECRET"\nname = "records"\n',
        encoding="utf-8",
    )
    config.chmod(0o644)
    sink = f"jsonl:{tmp_path / 'r.jsonl'}"
    args = ("check", "--config", str(config), "--sink", sink, "--imds-url", sim.vm_url("vm-0"))
    done = run_bridge(*args)
    assert done.returncode == 0, done.stderr
    assert f"{config} holds eventhubs.connection_string" in done.stderr
    assert "chmod 600" in done.stderr
    assert "TOPSECRET" not in done.stderr
    config.chmod(0o600)
    assert "holds" not in run_bridge(*args).stderr

"""The image built and run: the Dockerfile, built with podman on a base made from Debian's
packages (tests/image/podman.py), runs the consumer on a local hub and the agent against the
simulator, each as it would run on a VM (the host's network, a mounted directory)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import requests

from bridge import __version__, host
from bridge.localhub import LocalHub
from tests.image import podman
from tests.support.fleetrecords import FleetRecords
from tests.support.processes import (
    PROBES,
    Processes,
    Record,
    agent_reporting_a_freeze,
    assert_all_valid,
    read_records,
)
from tests.support.wait import eventually

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(sys.platform != "linux", reason="podman runs Linux images on Linux"),
    # The first test of a session waits for the image: on a fresh machine, a base to make.
    pytest.mark.timeout(podman.BUILD_TIMEOUT + 120),
]

HADOLINT = podman.ROOT / ".venv-image" / "bin" / "hadolint"
EVENT = "5DD55E16-0000-4000-8000-00000000031A"


def test_hadolint_finds_nothing_to_fix_in_the_dockerfile() -> None:
    if not HADOLINT.exists():
        podman.unavailable(f"{HADOLINT} is missing: `./dev test` sets it up "
                           "(tools/requirements-image.txt)")  # fmt: skip
    done = subprocess.run([str(HADOLINT), "--no-color", "Dockerfile"], cwd=podman.ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_runs_the_console_script_as_its_numeric_user(image: str) -> None:
    [inspected] = json.loads(podman.podman("image", "inspect", image))
    assert inspected["Config"]["User"] == f"{podman.IMAGE_UID}:{podman.IMAGE_UID}"
    assert inspected["Config"]["Labels"]["org.opencontainers.image.version"] == __version__
    said = podman.podman("run", "--rm", *podman.RUN_OPTIONS, image, "--version", timeout=60)
    assert said.strip() == f"se-bridge {__version__}"


def test_the_agent_in_the_image_reports_an_event_from_the_simulator_and_stops_cleanly(
    procs: Processes, containers: podman.Containers
) -> None:
    _, agent, _ = agent_reporting_a_freeze(procs, containers)
    assert agent.stop() == 0  # SIGTERM reaches se-bridge through podman
    records = agent.records()
    assert [r.get("Transition") or r["HeartbeatReason"] for r in records] == [
        "Start",
        "Scheduled",
        "Stop",
    ]
    assert_all_valid(records)


def test_the_consumer_in_the_image_answers_its_probes_and_consumes_a_local_hub(
    containers: podman.Containers, tmp_path: Path
) -> None:
    fleet = FleetRecords(now=datetime.now(timezone.utc))
    vm_id = fleet.vm("app-0")
    with LocalHub(tmp_path / "hub") as hub:
        hub.append([(r["VmId"], json.dumps(r)) for r in
                    (fleet.heartbeat("app-0"), fleet.event("app-0", EVENT))])  # fmt: skip
    consumer = containers.bridge(
        "consumer", "consume", "--hub", str(tmp_path / "hub"),
        "--commands", f"local:{tmp_path / 'commands'}", "--state-dir", str(tmp_path / "state"),
        "--metrics-address", "0", env={"SE_BRIDGE_COMMANDS_ALLOW_UNSIGNED": "true"},
    )  # fmt: skip

    def decided() -> list[Record]:
        records = read_records(tmp_path / "state" / "decisions.jsonl")
        return [r for r in records if r.get("EventId") == EVENT]

    found = eventually(decided, what="the consumer's Decision", details=consumer.output)
    assert [d["DecisionAction"] for d in found] == ["Approve"]
    sent = eventually(lambda: list((tmp_path / "commands" / vm_id.lower()).glob("*.json")),
                      what="the approval command", details=consumer.output)  # fmt: skip
    assert len(sent) == 1
    address = eventually(lambda: PROBES.search(consumer.stderr()), what="the probes' address",
                         details=consumer.output).group(1)  # fmt: skip
    assert probe(f"{address}/healthz") == 200
    eventually(lambda: probe(f"{address}/readyz") == 200, what="/readyz to answer 200",
               details=consumer.output)  # fmt: skip
    assert consumer.stop() == 0


def probe(url: str) -> int:
    with requests.Session() as session:
        session.trust_env = False  # no proxy between the test and 127.0.0.1
        return session.get(url, timeout=10).status_code


def test_the_state_directory_in_the_image_is_closed_to_other_users(image: str) -> None:
    """As the agent makes it (bridge.host.private_directory), so it need not say at each
    start that it closed it (issue 39)."""
    said = podman.podman(
        "run", "--rm", *podman.RUN_OPTIONS, "--entrypoint", "python3", image, "-c",
        "import os; print(oct(os.stat('/var/lib/se-bridge').st_mode & 0o777))", timeout=60,
    )  # fmt: skip
    assert said.strip() == oct(0o777 & ~host.PRIVATE_UMASK)

"""`se-bridge consume --shadow` as an operator starts it beside the live consumer: it refuses the
live consumer group's checkpoints, and on a group of its own it reads the hub from the start,
decides, sends nothing and says "shadow" from its first lines."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bridge.localhub import LocalHub
from tests.support.fleetrecords import FleetRecords
from tests.support.processes import Processes, read_records, run_bridge
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

EVENT = "5DD55E16-0000-4000-8000-000000000001"
UNSIGNED = {"SE_BRIDGE_COMMANDS_ALLOW_UNSIGNED": "true"}


def read_by_the_live_consumer(hub_dir: Path) -> None:
    """A hub holding a VM's heartbeat and a user reboot, every partition checkpointed for
    `$Default` as a live consumer reading in the default group leaves it."""
    fleet = FleetRecords(now=datetime.now(timezone.utc))
    fleet.vm("app-0")
    records = [fleet.heartbeat("app-0"), fleet.event("app-0", EVENT)]
    with LocalHub(hub_dir) as hub:
        placed = hub.append([(r["VmId"], json.dumps(r)) for r in records])
        for partition, offset in placed:
            hub.checkpoint("$Default", partition, offset)


def consume_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["consume", "--hub", str(tmp_path / "hub"), "--commands",
            f"local:{tmp_path / 'commands'}", "--state-dir", str(tmp_path / "state"),
            *extra]  # fmt: skip


@pytest.mark.parametrize("how", ["--shadow", "SE_BRIDGE_CONSUMER_MODE=shadow"])
def test_a_shadow_consumer_refuses_the_live_consumer_groups_checkpoints(
    tmp_path: Path, how: str
) -> None:
    read_by_the_live_consumer(tmp_path / "hub")
    flag = [how] if how.startswith("--") else []
    env = {**UNSIGNED, **dict([how.split("=")] if not flag else [])}
    done = run_bridge(*consume_args(tmp_path, *flag), env=env, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "configuration error" in done.stderr
    assert "consumer.consumer_group" in done.stderr
    assert "SE_BRIDGE_CONSUMER_CONSUMER_GROUP" in done.stderr
    assert not (tmp_path / "state" / "decisions.jsonl").exists()


def test_a_shadow_consumer_in_its_own_group_reads_everything_and_says_shadow(
    procs: Processes, tmp_path: Path
) -> None:
    read_by_the_live_consumer(tmp_path / "hub")
    env = {**UNSIGNED, "SE_BRIDGE_CONSUMER_CONSUMER_GROUP": "se-bridge-shadow"}
    shadow = procs.bridge("shadow", *consume_args(tmp_path, "--shadow"), env=env)
    decisions = tmp_path / "state" / "decisions.jsonl"

    def decided() -> list[dict[str, object]]:
        return [d for d in read_records(decisions) if d.get("EventId") == EVENT]

    found = eventually(decided, what="the shadow Decision", details=shadow.output)
    assert shadow.stop() == 0
    assert [(d["DecisionAction"], d["DecisionMode"]) for d in found] == [("Approve", "shadow")]
    assert not list((tmp_path / "commands").rglob("*.json"))  # nothing sent
    said = shadow.stderr()
    banner = [line for line in said.splitlines() if "INFO" in line]
    assert "shadow mode" in banner[0], said
    assert [line for line in banner if "signing commands" in line] == []
    assert [line for line in banner if "consuming from" in line and "shadow" in line], said


def test_a_shadow_consumer_refuses_the_live_fleet_state_table(tmp_path: Path) -> None:
    env = {**UNSIGNED, "SE_BRIDGE_CONSUMER_CONSUMER_GROUP": "se-bridge-shadow",
           "SE_BRIDGE_STORAGE_ACCOUNT": "contoso"}  # fmt: skip
    done = run_bridge(*consume_args(tmp_path, "--shadow", "--state", "tables"), env=env)
    assert done.returncode == 2, done.stderr
    assert "consumer.table_name" in done.stderr
    assert "SE_BRIDGE_CONSUMER_TABLE_NAME" in done.stderr


def test_policy_explain_reads_with_a_shadow_consumers_settings(tmp_path: Path) -> None:
    fleet = FleetRecords(now=datetime.now(timezone.utc))
    fleet.vm("app-0")
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps(fleet.event("app-0", EVENT)) + "\n", encoding="utf-8")
    done = run_bridge("policy", "explain", "--records", str(records),
                      env={"SE_BRIDGE_CONSUMER_MODE": "shadow"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "user-initiated" in done.stdout

"""`se-bridge status --consumer`: the pauses in force, the asks pending and the overrides of the
last day, read from a real consumer's SQLite fleet state and verified as the consumer verifies
them, with the monitoring exit codes of `status` (docs/contracts.md#command-line)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge import cli
from bridge.commands import signing
from bridge.commands.signing import Signer
from bridge.config import PatchRunSettings, load
from bridge.consumer import wiring
from bridge.consumer.people.operatorlog import (
    KEEP_OPERATOR_ACTIONS,
    OPERATOR,
    OperatorAction,
    OperatorLog,
)
from bridge.consumer.state import Doc
from bridge.policy import file as policyfile
from tests.component.consumer import test_patch_runs as patchrig
from tests.component.consumer.test_core import E1, E2
from tests.component.consumer.test_people import ALICE, BOB, People

POLICY = """\
version: 1
rules:
  - name: primary
    match: {}
    action: {ask: {target: dba, deadline: 2h, on_deadline: hold}}
"""


@dataclass
class Checked:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        found = json.loads(self.out)
        assert isinstance(found, dict)
        return found


class Rig:
    """A consumer with a policy file and a key file, and `status --consumer` over its state."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        key, policy = tmp_path / "signing.pem", tmp_path / "policy.yaml"
        signing.keygen(key)
        policy.write_text(POLICY, encoding="utf-8")
        monkeypatch.setenv("SE_BRIDGE_COMMANDS_SIGNING_KEY", f"file:{key}")
        signer = wiring.load_signer(load(environ={"SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{key}"}))
        self.db = tmp_path / "fleet.db"
        self.people = People(self.db, policyfile.load(policy), signer)
        self.policy = policy
        # The check reads the time as the consumer does: the rig's clock.
        monkeypatch.setattr("bridge.consumer.status.utc_now", lambda: self.people.fleet.now)
        self.capsys: pytest.CaptureFixture[str] | None = None

    def status(self, *extra: str) -> Checked:
        assert self.capsys is not None
        self.capsys.readouterr()
        code = cli.main(["status", "--consumer", "--state", f"sqlite:{self.db}",
                         "--policy", str(self.policy), *extra])  # fmt: skip
        said = self.capsys.readouterr()
        return Checked(code, said.out, said.err)


@pytest.fixture
def rig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Iterator[Rig]:
    made = Rig(tmp_path, monkeypatch)
    made.capsys = capsys
    yield made
    made.people.store.close()


def test_an_ask_pending_past_the_threshold_warns(rig: Rig) -> None:
    rig.people.event("db_0", E1)
    fresh = rig.status("--json")
    assert fresh.code == 0, fresh.out + fresh.err
    body = fresh.json()
    assert body["status"] == "OK"
    (ask,) = body["asks"]
    assert (ask["event_id"], ask["target"], ask["age_seconds"], ask["vms"]) == (
        E1, "dba", 0, ["db_0"]
    )  # fmt: skip
    rig.people.later(20 * 60)
    late = rig.status("--ask-age", "600")
    assert late.code == 1, late.out + late.err
    assert late.out.startswith("WARNING")
    assert f"an ask about {E1} (dba) is pending for 20 min" in late.out
    assert rig.status("--ask-age", "3600").code == 0


def test_a_pause_warns_while_it_holds_and_overrides_show_for_a_day(rig: Rig) -> None:
    rig.people.event("db_0", E1)
    rig.people.event("web_0", E2)
    assert rig.people.decide("approve", E2, ALICE, reason="3 a.m. fix", override_budget=True)
    assert rig.people.pause(until=rig.people.fleet.now + timedelta(hours=2), scope="scale_set:db",
                            reason="launch week").accepted  # fmt: skip
    checked = rig.status("--json")
    assert checked.code == 1
    body = checked.json()
    assert body["status"] == "WARNING"
    assert body["pauses"] == [{
        "scope": "scale_set:db", "until": "2026-11-21T12:00:00.000Z", "by": "Bob",
        "by_object_id": BOB.object_id, "reason": "launch week", "at": "2026-11-21T10:00:00.000Z",
    }]  # fmt: skip
    (override,) = body["overrides"]
    assert (override["event_id"], override["by"], override["reason"]) == (E2, "Alice", "3 a.m. fix")
    text = rig.status().out
    assert "paused: scale_set:db until 2026-11-21T12:00:00.000Z by Bob: launch week" in text
    assert f"override: {E2} by Alice (oid-alice) at 2026-11-21T10:00:00.000Z: 3 a.m. fix" in text

    rig.people.later(3 * 3600)  # the pause has lapsed, the override is 3 h old
    assert rig.status("--json").json()["pauses"] == []
    rig.people.later(22 * 3600)  # and now more than a day
    assert rig.status("--json").json()["overrides"] == []


def test_what_was_not_signed_by_the_consumer_is_left_out_and_said(rig: Rig) -> None:
    forged = OperatorAction("pause", BOB, "not me", rig.people.fleet.now)
    OperatorLog(rig.people.store, Signer(Ed25519PrivateKey.generate())).record(forged)
    rig.people.store.write(OPERATOR, Doc("by-hand", {"Action": {"Kind": "pause"}}))
    checked = rig.status("--json")
    body = checked.json()
    assert body["pauses"] == []
    assert body["forged"] == 2
    assert checked.code == 1
    assert any("2 operator documents do not verify" in p for p in body["problems"])


def test_a_forgotten_pause_put_back_is_refused_and_said(rig: Rig) -> None:
    people = rig.people
    people.consumer.process(people.heartbeats())
    assert people.pause(reason="launch week").accepted
    (pause,) = [d for d in people.store.scan(OPERATOR) if "Action" in d.value]
    people.fleet.advance(60)
    assert people.pause(kind="resume", reason="launch over").accepted
    people.fleet.advance(KEEP_OPERATOR_ACTIONS.total_seconds() + 3600)
    people.later(60)
    people.store.write(OPERATOR, Doc(pause.key, pause.value))
    checked = rig.status("--json")
    body = checked.json()
    assert body["pauses"] == []
    assert (body["refused"], checked.code) == ({"reappeared": 1}, 1)
    assert any("1 operator documents in the state are refused" in p for p in body["problems"])


def test_while_the_key_rotates_what_the_old_key_signed_is_shown_and_left_as_it_is(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status --consumer verifies as the consumer does, with the previous key(s) of
    commands.verify_key, and never writes: it says what still needs the old key."""
    old = rig.people.signer
    old_action = OperatorAction("pause", BOB, "signed with the old key", rig.people.fleet.now)
    OperatorLog(rig.people.store, old).record(old_action)
    new = rig.policy.parent / "new.pem"
    signing.keygen(new)
    monkeypatch.setenv("SE_BRIDGE_COMMANDS_SIGNING_KEY", f"file:{new}")
    monkeypatch.setenv("SE_BRIDGE_COMMANDS_VERIFY_KEY", signing.verify_key_text(old.public_key()))
    checked = rig.status("--json")
    body = checked.json()
    assert [p["reason"] for p in body["pauses"]] == ["signed with the old key"]
    assert (body["forged"], body["on_previous_key"], checked.code) == (0, 1, 1)
    assert any("1 operator actions are signed with a previous key only" in p
               for p in body["problems"])  # fmt: skip
    assert [d.value["KeyId"] for d in rig.people.store.scan(OPERATOR)
            if "Action" in d.value] == [old.key_id]  # fmt: skip


def test_what_keeps_it_from_looking_is_unknown(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SE_BRIDGE_COMMANDS_SIGNING_KEY")
    checked = rig.status("--json")
    assert checked.code == 3
    assert checked.json()["status"] == "UNKNOWN"
    assert "signing_key" in checked.json()["problems"][0]
    monkeypatch.setenv("SE_BRIDGE_COMMANDS_SIGNING_KEY", "file:/nowhere/key.pem")
    assert rig.status().code == 3


def test_the_patch_runs_asked_about_are_listed_apart_from_the_event_asks(
    rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: the approval page listed them, `status --consumer` did not (issue 40 leftover 4).
    runs = patchrig.Rig(rig.db, PatchRunSettings(enabled=True, on_breach="ask", ask_target="ops"))
    runs.runs.take([patchrig.pre()])  # 4 VMs of a scale set under max_vms 1: asked
    rig.people.event("db_0", E1)
    monkeypatch.setenv("SE_BRIDGE_EVENTGRID_ENABLED", "true")
    monkeypatch.setenv("SE_BRIDGE_EVENTGRID_HUB", "eventgrid")
    monkeypatch.setenv("SE_BRIDGE_EVENTGRID_SUBSCRIPTIONS", patchrig.SUB)
    monkeypatch.setenv("SE_BRIDGE_PATCHRUNS_ENABLED", "true")
    monkeypatch.setenv("SE_BRIDGE_PATCHRUNS_ON_BREACH", "ask")
    monkeypatch.setenv("SE_BRIDGE_PATCHRUNS_ASK_TARGET", "ops")
    body = rig.status("--json").json()
    assert [a["event_id"] for a in body["asks"]] == [E1], body
    (run,) = body["patch_runs"]
    assert run["run"] == "(patch:tuesday/20261208020000)"
    assert run["configuration"] == patchrig.CONFIG
    assert (run["start"], run["end"], run["cutoff"]) == (
        "2026-12-08T02:00:00.000Z", "2026-12-08T05:00:00.000Z", "2026-12-08T01:50:00.000Z"
    )  # fmt: skip
    assert (run["target"], run["deadline"], run["on_deadline"], run["vms"]) == (
        "ops", "2026-12-08T01:46:00.000Z", "run", 4
    )  # fmt: skip
    assert len(run["breaches"]) == 1
    assert "more than the 1 allowed" in run["breaches"][0]
    text = rig.status().out
    assert "patch runs asked about: 1" in text
    assert (
        "  (patch:tuesday/20261208020000) 2026-12-08T02:00:00.000Z to 2026-12-08T05:00:00.000Z, "
        "cut-off 2026-12-08T01:50:00.000Z: asked ops until 2026-12-08T01:46:00.000Z, then run; "
        "4 VMs; breaks budget one-at-a-time"
    ) in text
    # Without [patchruns] nothing of them is read.
    monkeypatch.delenv("SE_BRIDGE_PATCHRUNS_ENABLED")
    assert rig.status("--json").json()["patch_runs"] == []

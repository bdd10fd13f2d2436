"""A standing decision cannot vanish quietly (issue 37), on the real consumer over SQLite:
whoever can write the fleet state but does not hold the signing key cannot lift a pause or a
hold by deleting its document, bring back one the consumer forgot, or have a retired key's
action dated after the rotation signed again."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.commands.signing import Signer
from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.people.operatorlog import KEEP_OPERATOR_ACTIONS, OPERATOR, OperatorAction
from bridge.consumer.state import Doc
from bridge.policy.model import Policy
from tests.component.consumer.test_core import E1
from tests.component.consumer.test_people import APPROVE_ALL, BOB, People
from tests.support.records import Sender, assert_valid


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[People]:
    made = People(tmp_path / "fleet.db", Policy((APPROVE_ALL,)))
    yield made
    for decision in made.decisions:
        assert_valid(decision)
    made.store.close()


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def fresh(rig: People, signer: Signer | None = None, **trust: Any) -> Consumer:
    """A consumer that starts now on the rig's state (a restart, or another consumer)."""
    return Consumer(rig.store, Sender(), rig.consumer.policy, lambda _: None, ConsumerSettings(),
                    now=lambda: rig.fleet.now, signer=signer or rig.signer, **trust)  # fmt: skip


def operator_docs(rig: People, kind: str) -> list[Doc]:
    return [d for d in rig.store.scan(OPERATOR) if d.value.get("Action", {}).get("Kind") == kind]


@pytest.mark.parametrize("kind", ["pause", "hold"])
def test_a_standing_pause_or_hold_deleted_from_the_state_is_refused_said_and_counted(
    rig: People, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    rig.consumer.process(rig.heartbeats())
    assert rig.pause(reason="launch week").accepted
    rig.fleet.advance(60)
    assert rig.pause(reason="still launch week").accepted  # the newest: deleting it leaves one
    if kind == "hold":
        assert rig.pause(kind="resume", reason="done").accepted
        rig.event("web_0", E1)
        assert rig.decide("hold", E1, reason="primary failing over").accepted
    (newest,) = [
        d
        for d in operator_docs(rig, kind)
        if d.value["Action"]["Reason"] in ("still launch week", "primary failing over")
    ]
    rig.store.delete(OPERATOR, newest)
    with caplog.at_level(logging.ERROR):
        rig.later(120)
    said = [e for e in errors(caplog) if newest.key in e]
    assert said, errors(caplog)
    assert "deleted before its time" in said[0]
    assert rig.consumer.desk.counts().refused == {"deleted": 1}
    # Written back: a consumer that starts now stands on it too.
    assert [d.key for d in rig.store.scan(OPERATOR) if d.key == newest.key] == [newest.key]
    again = fresh(rig)
    if kind == "pause":
        assert [p.reason for p in again.desk.pauses(rig.fleet.now)] == ["still launch week"]
    else:
        (event,) = again.desk.open_events(rig.fleet.now)
        assert event.person is not None
        assert event.person.kind == "hold"
    rig.later(60)
    assert rig.consumer.desk.counts().refused == {"deleted": 1}  # said and counted once


def test_a_forgotten_pause_put_back_is_refused_said_and_counted(
    rig: People, caplog: pytest.LogCaptureFixture
) -> None:
    rig.consumer.process(rig.heartbeats())
    assert rig.pause(reason="launch week").accepted
    (pause,) = operator_docs(rig, "pause")
    rig.fleet.advance(60)
    assert rig.pause(kind="resume", reason="launch over").accepted
    rig.fleet.advance(KEEP_OPERATOR_ACTIONS.total_seconds() + 3600)
    rig.later(60)
    assert operator_docs(rig, "pause") == []  # forgotten
    # Put back as it was, under its own key and under a new one.
    rig.store.write(OPERATOR, Doc(pause.key, pause.value))
    rig.store.write(OPERATOR, Doc("20991231T000000.000000-000001-aaaaaaaaaaaa", pause.value))
    with caplog.at_level(logging.ERROR):
        rig.later(60)
        again = fresh(rig)
        assert again.desk.pauses(rig.fleet.now) == []
    assert rig.consumer.desk.pauses(rig.fleet.now) == []
    assert any("forgotten" in e for e in errors(caplog)), errors(caplog)
    assert rig.consumer.desk.counts().refused == {"reappeared": 2}
    assert again.desk.counts().refused == {"reappeared": 2}


def test_a_pause_in_force_longer_than_a_week_still_applies_after_a_restart(rig: People) -> None:
    rig.consumer.process(rig.heartbeats())
    assert rig.pause(reason="change freeze").accepted
    for _ in range(3):
        rig.fleet.advance(KEEP_OPERATOR_ACTIONS.total_seconds() / 2)
        rig.later(60)
    again = fresh(rig)
    assert [p.reason for p in again.desk.pauses(rig.fleet.now)] == ["change freeze"]
    assert again.desk.counts().refused == {}


def test_a_rotation_signs_again_only_what_the_old_key_signed_before_the_new_one_took_over(
    rig: People, caplog: pytest.LogCaptureFixture
) -> None:
    rig.consumer.process(rig.heartbeats())
    assert rig.pause(scope="scale_set:db", reason="before the rotation").accepted
    old = rig.signer
    new = Signer(Ed25519PrivateKey.generate())
    rig.fleet.advance(60)
    rotated = fresh(rig, new, trusted=[old.public_key()])
    assert [p.reason for p in rotated.desk.pauses(rig.fleet.now)] == ["before the rotation"]
    # Someone who kept the old key signs a pause dated after the new key took over.
    rig.fleet.advance(60)
    rig.consumer.operators.record(OperatorAction("pause", BOB, "after the rotation",
                                                 rig.fleet.now))  # fmt: skip
    (late,) = [
        d
        for d in operator_docs(rig, "pause")
        if d.value["Action"]["Reason"] == "after the rotation"
    ]
    with caplog.at_level(logging.ERROR):
        assert [p.reason for p in rotated.desk.pauses(rig.fleet.now)] == ["before the rotation"]
    assert rotated.desk.counts().refused == {"signed_after_rotation": 1}
    assert any(late.key in e and "took over" in e for e in errors(caplog)), errors(caplog)
    stored = {d.key: d.value["KeyId"] for d in rig.store.scan(OPERATOR) if "Action" in d.value}
    assert stored[late.key] == old.key_id  # not signed again

"""People in the loop on the real consumer over SQLite: asks, a person's approve or hold,
overrides, pauses, and the signed operator actions (issue 29, docs/people.md)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.commands import signing
from bridge.commands.message import resources_digest
from bridge.commands.signing import Signer
from bridge.config import ConfigError, ConsumerSettings, load
from bridge.consumer import wiring
from bridge.consumer.core import Consumer
from bridge.consumer.explain import last_decision, render
from bridge.consumer.people.desk import PeopleCounts
from bridge.consumer.people.operatorlog import (
    KEEP_OPERATOR_ACTIONS,
    MARK,
    OPERATOR,
    OperatorAction,
    OperatorLog,
    action_body,
)
from bridge.consumer.state import Doc
from bridge.consumer.state.sqlite import SqliteStore
from bridge.notify import kinds as notify_kinds
from bridge.notify.notice import Notice
from bridge.policy.model import Action, Budget, Match, Person, Policy, Rule
from bridge.retry import PermanentError, RetryableError
from tests.component.consumer.test_core import E1, E2, T0
from tests.doubles.webhook import WebhookReceiver
from tests.support.fleetrecords import FleetRecords
from tests.support.records import Sender, assert_valid
from tests.support.wait import eventually

ALICE = Person("oid-alice", "Alice")
BOB = Person("oid-bob", "Bob")
HOLD_ALL = Rule("everything-else", Match(), Action("hold"))
APPROVE_ALL = Rule("approve-all", Match(), Action("approve"))
ONE_AT_A_TIME = (Budget("one", "fleet", max_vms=1),)


def asking(on_deadline: str = "hold") -> Policy:
    ask = Action("ask", timedelta(minutes=10), on_deadline, target="dba")  # type: ignore[arg-type]
    return Policy((Rule("primary", Match(), ask),))


class Notices:
    """A notifier that keeps what it is told; `broken` targets say they keep failing."""

    def __init__(self) -> None:
        self.told: list[Notice] = []
        self.broken: tuple[str, ...] = ()
        self.closed: float | None = None

    @property
    def targets(self) -> tuple[str, ...]:
        return ("dba", "ops")

    def notify(self, notice: Notice) -> None:
        self.told.append(notice)

    def failing(self) -> tuple[str, ...]:
        return self.broken

    def close(self, timeout: float) -> None:
        self.closed = timeout

    def kinds(self) -> list[tuple[str, str | None]]:
        return [(n.kind, n.event_id) for n in self.told]


class People:
    """A consumer with a signing key and a notifier, over a real SQLite fleet state."""

    def __init__(self, path: Path, policy: Policy, signer: Signer | None = None) -> None:
        self.fleet = FleetRecords(T0)
        self.store = SqliteStore(path)
        self.sender = Sender()
        self.decisions: list[Mapping[str, Any]] = []
        self.notices = Notices()
        self.signer = signer or Signer(Ed25519PrivateKey.generate())
        self.consumer = Consumer(self.store, self.sender, policy, self.decisions.extend,
                                 ConsumerSettings(), now=lambda: self.fleet.now,
                                 signer=self.signer, notifier=self.notices)  # fmt: skip
        for name in ("web_0", "web_1"):
            self.fleet.vm(name, scale_set="web")
        self.fleet.vm("db_0", scale_set="db")

    def heartbeats(self) -> list[dict[str, Any]]:
        return [self.fleet.heartbeat(name) for name in ("web_0", "web_1", "db_0")]

    def event(self, name: str, event_id: str, **fields: Any) -> None:
        not_before = self.fleet.now + timedelta(hours=1)
        record = self.fleet.event(name, event_id, source="Platform", not_before=not_before,
                                  **fields)  # fmt: skip
        self.consumer.process([*self.heartbeats(), record])

    def later(self, seconds: float) -> None:
        self.fleet.advance(seconds)
        self.consumer.process(self.heartbeats())
        self.consumer.tick()

    def decide(self, kind: str, event_id: str, by: Person = ALICE, **fields: Any) -> Any:
        digest = fields.pop("digest", None) or self.digest(event_id)
        action = OperatorAction(kind, by, fields.pop("reason", "because"), self.fleet.now,  # type: ignore[arg-type]
                                event_id=event_id, resources_digest=digest, **fields)  # fmt: skip
        return self.consumer.desk.operate(action)

    def pause(self, kind: str = "pause", **fields: Any) -> Any:
        action = OperatorAction(kind, BOB, fields.pop("reason", "launch week"), self.fleet.now,  # type: ignore[arg-type]
                                **fields)  # fmt: skip
        return self.consumer.desk.operate(action)

    def digest(self, event_id: str) -> str:
        found = {e.event_id: e for e in self.consumer.desk.open_events(self.fleet.now)}
        return found[event_id].resources_digest if event_id in found else "-"

    def last(self, event_id: str) -> Mapping[str, Any]:
        return [d for d in self.decisions if d["EventId"] == event_id][-1]

    def approved(self) -> list[str]:
        return [c.event_id for c in self.sender.sent]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    made: list[People] = []

    def build(policy: Policy) -> People:
        made.append(People(tmp_path / f"fleet{len(made)}.db", policy))
        return made[-1]

    yield build
    for rig in made:
        for decision in rig.decisions:
            assert_valid(decision)
        rig.store.close()


@pytest.mark.parametrize("on_deadline", ["hold", "approve"])
def test_an_ask_is_said_notified_and_times_out(make: Any, on_deadline: str) -> None:
    rig = make(asking(on_deadline))
    rig.event("db_0", E1)
    asked = rig.last(E1)
    assert (asked["DecisionAction"], asked["AskedTarget"]) == ("Ask", "dba")
    assert asked["AskDeadline"] == "2026-11-21T10:10:00.000Z"
    assert rig.notices.kinds() == [("asked", E1)]
    (open_event,) = rig.consumer.desk.open_events(rig.fleet.now)
    assert open_event.asked is not None
    assert open_event.asked.since == T0
    assert (
        open_event.ask
        == "dba since 2026-11-21T10:00:00.000Z, waiting until 2026-11-21T10:10:00.000Z"
    )
    rig.later(300)  # still waiting: said once
    assert [d["DecisionAction"] for d in rig.decisions] == ["Ask"]
    assert rig.consumer.desk.counts().asks_pending == 1
    rig.later(301)
    timed_out = rig.last(E1)
    assert timed_out["DecisionAction"] == ("Hold" if on_deadline == "hold" else "Approve")
    assert timed_out["AskedTarget"] == "dba"
    assert rig.approved() == ([] if on_deadline == "hold" else [E1])
    assert rig.notices.kinds() == [("asked", E1), ("timed_out", E1)]


def test_a_persons_approval_waits_on_a_full_budget_and_an_override_goes_over_it(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rig = make(Policy((HOLD_ALL,), budgets=ONE_AT_A_TIME))
    rig.event("web_0", E1)
    rig.event("web_1", E2)
    first = rig.decide("approve", E1, reason="patch window")
    assert (first.accepted, first.code) == (True, "Accepted")
    assert rig.approved() == [E1]
    record = rig.last(E1)
    assert (record["DecisionAction"], record["DecisionRule"]) == ("Approve", "(person)")
    assert (record["DecidedBy"], record["DecidedByName"]) == ("oid-alice", "Alice")
    assert (record["OperatorReason"], record["BudgetOverride"]) == ("patch window", False)
    waiting = rig.decide("approve", E2, by=BOB)
    assert waiting.accepted
    assert "budget one" in waiting.detail
    assert rig.approved() == [E1]
    record = rig.last(E2)
    assert (record["DecisionAction"], record["DecidedBy"]) == ("Defer", "oid-bob")
    # Break-glass: a reason, recorded as an override, told and logged as a warning.
    assert rig.decide("approve", E2, by=BOB, override_budget=True, reason="").code == "NoReason"
    with caplog.at_level(logging.WARNING):
        over = rig.decide("approve", E2, by=BOB, override_budget=True, reason="3 a.m. fix")
    assert over.accepted
    assert rig.approved() == [E1, E2]
    record = rig.last(E2)
    assert (record["DecisionAction"], record["BudgetOverride"]) == ("Approve", True)
    assert ("override", E2) in rig.notices.kinds()
    assert any("OVER A FULL BUDGET" in r.getMessage() for r in caplog.records)


def test_explain_says_an_override_once_the_event_has_started(make: Any) -> None:
    # Issue 37: --json said BudgetOverride false once the event had started, while the
    # Decision record and the text said the approval went over the budget.
    rig = make(Policy((HOLD_ALL,), budgets=ONE_AT_A_TIME))
    rig.event("web_1", E2)
    rig.event("web_0", E1)
    assert rig.decide("approve", E2, reason="first").accepted
    assert rig.decide("approve", E1, override_budget=True, reason="3 a.m. fix").accepted
    assert rig.last(E1)["BudgetOverride"] is True
    rig.fleet.advance(30)
    rig.event("web_0", E1, transition="Started")
    said, text = explained(rig)
    assert said["EventStatus"] == "Started"
    assert said["DecisionAction"] == "Approve"
    assert said["BudgetOverride"] is True
    assert "over the budget" in text
    # Explained from an export of the records (--records), as the Decision record says.
    found = rig.consumer.explain(E1)
    taken = last_decision(rig.decisions, E1)
    from_records = json.loads(render(replace(found, taken=taken), rig.consumer.policy,
                                     as_json=True))  # fmt: skip
    assert from_records["BudgetOverride"] is True


def test_a_persons_hold_holds_what_the_policy_approves(make: Any) -> None:
    rig = make(Policy((HOLD_ALL,)))
    rig.event("web_0", E1)
    assert rig.decide("hold", E1, reason="incident").accepted
    record = rig.last(E1)
    assert (record["DecisionAction"], record["DecisionRule"]) == ("Hold", "(person)")
    assert record["OperatorReason"] == "incident"
    assert "changed from Hold by everything-else" in record["DecisionExplanation"]
    assert "Alice (oid-alice) decided: hold" in record["DecisionExplanation"]
    assert ("held", E1) in rig.notices.kinds()


def test_a_pause_stops_the_policy_and_the_people_until_its_time(make: Any) -> None:
    rig = make(Policy((APPROVE_ALL,)))
    rig.consumer.process(rig.heartbeats())
    assert rig.pause(reason="").code == "NoReason"
    until = T0 + timedelta(minutes=10)
    assert rig.pause(until=until).accepted
    pause = rig.decisions[-1]
    assert (pause["DecisionAction"], pause["EventId"], pause["PauseScope"]) == (
        "Pause", "(fleet)", "fleet")  # fmt: skip
    assert pause["PauseUntil"] == "2026-11-21T10:10:00.000Z"
    assert [p.by for p in rig.consumer.desk.pauses(rig.fleet.now)] == [BOB]
    rig.event("web_0", E1)
    deferred = rig.last(E1)
    assert (deferred["DecisionAction"], deferred["PauseScope"]) == ("Defer", "fleet")
    refused = rig.decide("approve", E1)
    assert (refused.accepted, refused.code) == (False, "Paused")
    assert rig.approved() == []
    rig.later(600)
    assert rig.approved() == [E1]
    assert rig.consumer.desk.pauses(rig.fleet.now) == []


def test_a_scoped_pause_lifts_on_resume(make: Any) -> None:
    rig = make(Policy((APPROVE_ALL,)))
    rig.consumer.process(rig.heartbeats())
    assert rig.pause(scope="scale_set:nosuchkind:x").code == "BadScope"
    # fleet takes no value: "fleet:x" would be listed as in force and never cover an event.
    assert rig.pause(scope="fleet:x").code == "BadScope"
    assert rig.pause(kind="resume", scope="scale_set:web").code == "NotPaused"
    assert rig.pause(scope="scale_set:web").accepted
    rig.event("web_0", E1)
    rig.event("db_0", E2)
    assert rig.approved() == [E2]
    assert rig.last(E1)["PauseScope"] == "scale_set:web"
    resumed = rig.pause(kind="resume", scope="scale_set:web", reason="launched")
    assert resumed.accepted
    assert [d["DecisionAction"] for d in rig.decisions if d["EventId"] == "(scale_set:web)"] == [
        "Pause", "Resume"]  # fmt: skip
    assert rig.approved() == [E2, E1]
    assert ("resumed", None) in rig.notices.kinds()


def test_a_scope_reads_its_kind_case_blind_as_a_policy_reads_a_budget_group(make: Any) -> None:
    rig = make(Policy((APPROVE_ALL,)))
    rig.consumer.process(rig.heartbeats())
    assert rig.pause(scope="Scale_Set:web").accepted
    rig.event("web_0", E1)
    rig.event("db_0", E2)
    assert rig.approved() == [E2]
    assert rig.pause(kind="resume", scope="scale_set:WEB", reason="launched").accepted
    assert rig.approved() == [E2, E1]
    # One scope however it is spaced: a resume lifts the pause it names.
    assert rig.pause(scope=" scale_set : db ").accepted
    assert [p.scope for p in rig.consumer.desk.pauses(rig.fleet.now)] == ["scale_set:db"]
    assert rig.pause(kind="resume", scope="scale_set:db", reason="done").accepted
    assert rig.consumer.desk.pauses(rig.fleet.now) == []


def test_a_decision_on_changed_resources_a_closed_event_or_bad_input_is_refused(make: Any) -> None:
    rig = make(Policy((HOLD_ALL,)))
    rig.event("web_0", E1, resources=["web_0"])
    shown = rig.digest(E1)
    rig.event("web_1", E1, resources=["web_0", "web_1"])
    refused = rig.decide("approve", E1, digest=shown)
    assert (refused.accepted, refused.code) == (False, "ResourcesChanged")
    assert shown != resources_digest(["web_0", "web_1"])
    assert rig.decide("approve", E2, digest="0" * 16).code == "NotOpen"
    assert rig.decide("hold", E1, reason="x" * 1001).code == "Invalid"
    assert rig.pause(until=datetime(2026, 11, 21, 11)).code == "Invalid"
    assert rig.pause(until=T0).code == "Invalid"  # passed
    assert rig.approved() == []


def test_operate_without_a_signing_key_is_refused(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "fleet.db")
    consumer = Consumer(store, Sender(), Policy((HOLD_ALL,)), lambda _: None, ConsumerSettings())
    answer = consumer.desk.operate(OperatorAction("pause", ALICE, "why", T0))
    assert (answer.accepted, answer.code) == (False, "NoSigningKey")
    store.close()


def test_a_forged_operator_action_in_the_state_is_ignored(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rig = make(Policy((HOLD_ALL,)))
    rig.event("web_0", E1)
    digest = rig.digest(E1)
    approve = OperatorAction("approve", ALICE, "", T0, event_id=E1, resources_digest=digest)
    # Written straight into the state: unsigned, and signed with another key.
    rig.store.write(OPERATOR, Doc("forged-unsigned", {"Action": action_body(approve)}))
    OperatorLog(rig.store, Signer(Ed25519PrivateKey.generate())).record(
        replace(approve, at=T0 + timedelta(seconds=1))
    )
    with caplog.at_level(logging.ERROR):
        rig.later(5)
    assert rig.approved() == []
    assert rig.consumer.desk.counts().forged == 2
    assert rig.last(E1)["DecisionRule"] == "everything-else"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("forged-unsigned" in e and "not signed" in e for e in errors)
    assert any("does not verify" in e for e in errors)


class FailingWrites:
    """The rig's store, whose next `failures` writes of operator actions (not the marks)
    fail as Table Storage's would when it is down (RetryableError) or refuses
    (PermanentError)."""

    def __init__(self, store: Any, failures: list[Exception]) -> None:
        self._store, self.failures = store, failures

    def write(self, collection: str, doc: Doc) -> Doc:
        if collection == OPERATOR and self.failures and not doc.key.startswith(MARK):
            raise self.failures.pop(0)
        return self._store.write(collection, doc)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def key_of(rig: People) -> list[str]:
    """The KeyId every operator action of the state is signed with now (not the marks)."""
    return [doc.value["KeyId"] for doc in rig.store.scan(OPERATOR) if "Action" in doc.value]


def test_after_the_signing_key_rotates_a_pause_signed_with_the_old_key_still_applies(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rig = make(Policy((APPROVE_ALL,)))
    rig.consumer.process(rig.heartbeats())
    assert rig.pause().accepted
    new = Signer(Ed25519PrivateKey.generate())

    def consumer(store: Any = None, **trust: Any) -> Consumer:
        return Consumer(store or rig.store, rig.sender, Policy((APPROVE_ALL,)),
                        rig.decisions.extend, ConsumerSettings(), now=lambda: rig.fleet.now,
                        signer=new, **trust)  # fmt: skip

    # A read-only look (status, explain) applies it as the consumer would and rewrites nothing.
    looking = consumer(trusted=[rig.signer.public_key()], sign_again=False)
    assert [p.by for p in looking.desk.pauses(rig.fleet.now)] == [BOB]
    assert looking.desk.counts().on_previous_key == 1
    assert key_of(rig) == [rig.signer.key_id]
    # While it rotates, the consumer on the new key is told the old public key. Its first
    # attempts to sign the action again fail (the state down, then refusing); it applies all
    # the same and tries again at each look, saying so once.
    failing = FailingWrites(rig.store, [RetryableError("down"), PermanentError("403")])
    rotated = consumer(failing, trusted=[rig.signer.public_key()])
    with caplog.at_level(logging.INFO):
        for _ in range(2):
            assert [p.by for p in rotated.desk.pauses(rig.fleet.now)] == [BOB]
            assert rotated.desk.counts().on_previous_key == 1
        assert [p.by for p in rotated.desk.pauses(rig.fleet.now)] == [BOB]
    assert rotated.desk.counts().forged == 0
    assert rotated.desk.counts().on_previous_key == 0
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "could not be signed again" in m]) == 1
    assert any("re-signed with key " + new.key_id in m for m in said)
    assert key_of(rig) == [new.key_id]
    # Re-signed in place: once the old key is gone the pause still stands, in its place.
    after = consumer()
    assert [p.by for p in after.desk.pauses(rig.fleet.now)] == [BOB]
    assert after.desk.counts().forged == 0
    after.process([*rig.heartbeats(), rig.fleet.event("web_0", E1, source="Platform")])
    assert rig.approved() == []
    assert [p.reason for p in after.desk.pauses(rig.fleet.now)] == ["launch week"]


def test_of_two_consumers_signing_an_old_action_again_one_does_and_both_apply_it(
    make: Any,
) -> None:
    rig = make(Policy((APPROVE_ALL,)))
    assert rig.pause().accepted
    new = Signer(Ed25519PrivateKey.generate())
    first, second = (Consumer(rig.store, rig.sender, Policy((APPROVE_ALL,)), lambda _: None,
                              ConsumerSettings(), now=lambda: rig.fleet.now, signer=new,
                              trusted=[rig.signer.public_key()]) for _ in range(2))  # fmt: skip
    # Both read the action as the old key signed it before either signs it again.
    first.operators.store, held = FailingWrites(rig.store, [RetryableError("down")]), rig.store
    assert [p.by for p in first.desk.pauses(rig.fleet.now)] == [BOB]
    assert [p.by for p in second.desk.pauses(rig.fleet.now)] == [BOB]  # second signs it again
    first.operators.store = held
    assert [p.by for p in first.desk.pauses(rig.fleet.now)] == [BOB]  # its write conflicts
    assert [p.by for p in first.desk.pauses(rig.fleet.now)] == [BOB]  # and it reads the new one
    assert key_of(rig) == [new.key_id]
    assert [c.desk.counts() for c in (first, second)] == [
        PeopleCounts(0, 1, {}, 0, 0), PeopleCounts(0, 1, {}, 0, 0)]  # fmt: skip


def test_the_consumer_is_told_its_previous_key_by_commands_verify_key(
    make: Any, tmp_path: Path
) -> None:
    rig = make(Policy((APPROVE_ALL,)))
    assert rig.pause().accepted
    rig.store.close()
    new = tmp_path / "new.pem"
    signing.keygen(new)
    environ = {
        "SE_BRIDGE_COMMANDS_CHANNEL": f"local:{tmp_path / 'queues'}",
        "SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{new}",
        "SE_BRIDGE_CONSUMER_STATE": f"sqlite:{rig.store.path}",
        "SE_BRIDGE_COMMANDS_VERIFY_KEY": signing.verify_key_text(rig.signer.public_key()),
    }
    consumer = wiring.build_consumer(load(environ=environ), lambda _: None)
    try:
        assert [p.by for p in consumer.desk.pauses(rig.fleet.now)] == [BOB]
    finally:
        consumer.close()
    with pytest.raises(ConfigError, match="not base64"):
        wiring.build_consumer(load(environ={**environ, "SE_BRIDGE_COMMANDS_VERIFY_KEY": "no!"}),
                              lambda _: None)  # fmt: skip


def test_decisions_name_the_failing_notification_targets(make: Any) -> None:
    rig = make(asking())
    rig.notices.broken = ("teams",)
    rig.event("db_0", E1)
    assert rig.last(E1)["NotifyFailing"] == ["teams"]


def test_a_persons_approval_builds_the_events_situation_once(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One situation per action (issue 38): what the desk checked the approval on is what the
    decision pass starts from; it was built three times."""
    rig = make(Policy((HOLD_ALL,)))
    rig.event("web_0", E1)
    digest = rig.digest(E1)
    built: list[str] = []
    situation = rig.consumer.decider.situation

    def counting(state: Any, doc: Doc, *args: Any) -> Any:
        built.append(doc.key)
        return situation(state, doc, *args)

    monkeypatch.setattr(rig.consumer.decider, "situation", counting)
    assert rig.decide("approve", E1, digest=digest).accepted
    assert rig.approved() == [E1]
    assert len(built) == 1


def test_a_persons_approval_decided_on_a_ledger_changed_since_is_decided_again(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another consumer takes the budget's one slot between the desk's look at the event and
    its decision: the approval's write conflicts, the event is decided again on the ledger
    read again, and waits."""
    rig = make(Policy((HOLD_ALL,), budgets=ONE_AT_A_TIME))
    rig.event("web_0", E1)
    rig.event("web_1", E2)
    policy = Policy((HOLD_ALL,), budgets=ONE_AT_A_TIME)
    other = Consumer(
        rig.store,
        rig.sender,
        policy,
        rig.decisions.extend,
        ConsumerSettings(),
        now=lambda: rig.fleet.now,
        signer=rig.signer,
    )
    (shown,) = [e for e in other.desk.open_events(rig.fleet.now) if e.event_id == E2]
    situation = rig.consumer.situation

    def meanwhile(event_id: str, now: datetime) -> Any:
        seen = situation(event_id, now)
        digest = shown.resources_digest
        action = OperatorAction("approve", BOB, "first", now, E2, digest)
        assert other.desk.operate(action).accepted
        return seen

    monkeypatch.setattr(rig.consumer, "situation", meanwhile)
    read_again = rig.consumer.ledger.read_again
    again: list[str] = []

    def reading_again(key: str, *args: Any) -> Any:
        again.append(key)
        return read_again(key, *args)

    monkeypatch.setattr(rig.consumer.ledger, "read_again", reading_again)
    answer = rig.decide("approve", E1)
    assert answer.accepted
    assert again  # the write conflicted
    assert "budget one" in answer.detail
    assert rig.approved() == [E2]
    assert rig.last(E1)["DecisionAction"] == "Defer"


def test_another_consumer_of_the_state_applies_a_persons_decision(make: Any) -> None:
    rig = make(Policy((HOLD_ALL,)))
    rig.event("web_0", E1)
    other = Consumer(rig.store, rig.sender, Policy((HOLD_ALL,)), rig.decisions.extend,
                     ConsumerSettings(), now=lambda: rig.fleet.now,
                     signer=rig.signer)  # fmt: skip
    assert rig.decide("approve", E1).accepted
    other.tick()
    (listed,) = other.desk.open_events(rig.fleet.now)
    assert listed.person is not None
    assert listed.person.by == ALICE


def explained(rig: People) -> tuple[dict[str, Any], str]:
    """`policy explain --json` and its text, of E1 on the rig's consumer."""
    found = rig.consumer.explain(E1)
    assert found is not None
    said = json.loads(render(found, rig.consumer.policy, as_json=True))
    return said, render(found, rig.consumer.policy, as_json=False)


def test_policy_explain_shows_the_ask_the_persons_decision_and_the_pause(make: Any) -> None:
    rig = make(asking())
    rig.event("db_0", E1)
    said, text = explained(rig)
    assert (said["AskedTarget"], said["AskedSince"], said["AskDeadline"]) == (
        "dba", "2026-11-21T10:00:00.000Z", "2026-11-21T10:10:00.000Z")  # fmt: skip
    assert "asked: dba since 2026-11-21T10:00:00.000Z" in text
    assert rig.decide("hold", E1, reason="primary failed over").accepted
    assert rig.pause(until=T0 + timedelta(minutes=5)).accepted
    said, text = explained(rig)
    assert (said["DecisionAction"], said["PersonDecision"]["DecidedByName"]) == ("Hold", "Alice")
    assert "person: hold by Alice (oid-alice)" in text
    assert rig.decide("approve", E1).code == "Paused"
    # An approval recorded before the pause was seen (by another consumer) waits for it.
    rig.fleet.advance(1)
    rig.consumer.operators.record(
        OperatorAction("approve", ALICE, "", rig.fleet.now, E1, rig.digest(E1))
    )
    said, text = explained(rig)
    assert (said["DecisionAction"], said["Pause"]["PauseUntil"]) == (
        "Defer", "2026-11-21T10:05:00.000Z")  # fmt: skip
    assert "paused: fleet by Bob (oid-bob) until 2026-11-21T10:05:00.000Z: launch week" in text


def test_a_shadow_consumer_asks_nobody(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "fleet.db")
    fleet, notices = FleetRecords(T0), Notices()
    decisions: list[Mapping[str, Any]] = []
    fleet.vm("db_0")
    shadow = Consumer(store, Sender(), asking(), decisions.extend,
                      ConsumerSettings(mode="shadow"), now=lambda: fleet.now,
                      notifier=notices)  # fmt: skip
    shadow.process([fleet.heartbeat("db_0"), fleet.event("db_0", E1, source="Platform")])
    assert [d["DecisionAction"] for d in decisions] == ["Ask"]
    assert notices.told == []
    store.close()


def test_an_ask_and_a_pause_reach_the_webhooks_of_the_configured_notifier(tmp_path: Path) -> None:
    with WebhookReceiver() as receiver:
        config = load(environ={
            "SE_BRIDGE_NOTIFY_TARGETS": json.dumps([
                {"name": "dba", "kind": "generic", "url": receiver.url("/dba")},
                {"name": "ops", "kind": "generic", "url": receiver.url("/ops")},
            ]),
            "SE_BRIDGE_NOTIFY_PAGE_URL": "https://bridge.example/",
        })  # fmt: skip
        store = SqliteStore(tmp_path / "fleet.db")
        fleet = FleetRecords(T0)
        fleet.vm("db_0")
        consumer = Consumer(store, Sender(), asking(), lambda _: None, ConsumerSettings(),
                            now=lambda: fleet.now, signer=Signer(Ed25519PrivateKey.generate()),
                            notifier=notify_kinds.build(config))  # fmt: skip
        consumer.process([fleet.heartbeat("db_0"), fleet.event("db_0", E1, source="Platform")])
        assert consumer.desk.operate(OperatorAction("pause", BOB, "incident", fleet.now)).accepted
        (asked,) = eventually(lambda: receiver.bodies("/dba")[:1], what="the ask's notice")
        assert (asked["Kind"], asked["EventId"], asked["Vms"]) == ("asked", E1, ["db_0"])
        assert asked["Link"] == f"https://bridge.example/events/{E1}"

        # A pause concerns every target.
        def paused(path: str) -> list[Any]:
            return [b for b in receiver.bodies(path) if b["Kind"] == "paused"]

        assert eventually(lambda: paused("/dba") and paused("/ops"), what="the pause's notices")
        consumer.close()


def test_a_persons_approval_of_a_kubernetes_node_grants_its_drain_first(make: Any) -> None:
    rig = make(Policy((HOLD_ALL,), budgets=ONE_AT_A_TIME))
    rig.fleet.vm("aks-0", scale_set="aks-pool1")
    node = rig.fleet.node("aks-0", "pool1")
    rig.consumer.process([node, rig.fleet.event("aks-0", E1, source="Platform")])
    assert rig.decide("approve", E1, reason="node first").accepted
    assert [c.type for c in rig.sender.sent] == ["Prepare"]
    granted = rig.last(E1)
    assert (granted["DecisionAction"], granted["DecisionRule"]) == ("Defer", "(person)")
    assert "drain granted on aks-0" in granted["DecisionReason"]
    assert granted["DecidedBy"] == "oid-alice"
    rig.fleet.advance(20)
    drained = rig.fleet.drain("aks-0", E1, "Drained", exit_code=0)
    rig.consumer.process([rig.fleet.node("aks-0", "pool1"), drained])
    assert [c.type for c in rig.sender.sent] == ["Prepare", "Approve"]
    assert (rig.last(E1)["DecisionAction"], rig.last(E1)["DecisionRule"]) == ("Approve", "(person)")


def test_a_waiting_approval_lapses_when_the_events_resources_change(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    rig = make(Policy((HOLD_ALL,), budgets=ONE_AT_A_TIME))
    rig.event("web_0", E1)
    rig.event("db_0", E2)
    assert rig.decide("approve", E1).accepted
    assert rig.decide("approve", E2, by=BOB).accepted  # waits: the budget is E1's
    assert rig.last(E2)["DecisionAction"] == "Defer"
    # E2 grows to a VM Bob was not shown: his approval no longer applies when a slot frees.
    with caplog.at_level(logging.INFO):
        rig.event("web_1", E2, resources=["db_0", "web_1"])
        rig.event("web_0", E1, transition="Completed")
        rig.later(5)
    assert rig.approved() == [E1]
    assert (rig.last(E2)["DecisionAction"], rig.last(E2)["DecisionRule"]) == (
        "Hold", "everything-else")  # fmt: skip
    assert any("Bob" in r.getMessage() and "Resources changed" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    # A hold stands whatever the Resources become: it only lets NotBefore come.
    assert rig.decide("hold", E2, by=BOB).accepted
    rig.event("web_0", E2, resources=["db_0", "web_1", "web_0"])
    rig.later(5)
    assert (rig.last(E2)["DecisionAction"], rig.last(E2)["DecisionRule"]) == ("Hold", "(person)")


def test_operator_documents_are_forgotten_once_spent_and_kept_for_a_week(make: Any) -> None:
    """The Decision records are the audit trail; the operator documents only decide, so those
    of events that ended and of pauses that lifted go after KEEP_OPERATOR_ACTIONS."""
    rig = make(Policy((HOLD_ALL,)))
    rig.event("web_0", E1)
    rig.event("web_1", E2)
    assert rig.decide("approve", E1, ALICE, reason="failover done").accepted
    assert rig.decide("hold", E2, ALICE).accepted
    assert rig.pause(scope="scale_set:db", until=rig.fleet.now + timedelta(hours=1)).accepted
    assert rig.pause(scope="fleet").accepted
    assert rig.pause(kind="resume", scope="fleet", reason="over").accepted
    assert rig.pause(scope="zone:1").accepted  # until resumed: in force however old
    rig.event("web_0", E1, transition="Completed")

    def stored() -> list[tuple[str, str | None]]:
        return [(d.value["Action"]["Kind"], d.value["Action"]["EventId"] or
                 d.value["Action"]["Scope"]) for d in rig.store.scan(OPERATOR)
                if "Action" in d.value]  # fmt: skip

    everything = stored()
    assert len(everything) == 6
    rig.fleet.advance(KEEP_OPERATOR_ACTIONS.total_seconds() - 3600)
    rig.event("web_1", E2, transition="Updated")  # E2 is still reported on: open
    rig.later(60)
    assert stored() == everything  # younger than KEEP_OPERATOR_ACTIONS: all kept

    rig.fleet.advance(2 * 3600)
    rig.event("web_1", E2, transition="Updated")
    rig.later(60)
    assert sorted(stored()) == [("hold", E2), ("pause", "zone:1")]
    assert [p.scope for p in rig.consumer.desk.pauses(rig.fleet.now)] == ["zone:1"]
    assert rig.consumer.desk.open_events(rig.fleet.now)[0].person is not None  # E2's hold stands
    # A consumer that starts now reads the same: the fleet is not paused.
    again = Consumer(rig.store, Sender(), rig.consumer.policy, lambda _: None, ConsumerSettings(),
                     now=lambda: rig.fleet.now, signer=rig.signer)  # fmt: skip
    assert [p.scope for p in again.desk.pauses(rig.fleet.now)] == ["zone:1"]
    assert again.desk.counts().forged == 0
    # The audit trail stays whole.
    people = [(d["DecisionAction"], d["DecidedByName"]) for d in rig.decisions if d["DecidedBy"]]
    assert ("Approve", "Alice") in people
    assert ("Resume", "Bob") in people

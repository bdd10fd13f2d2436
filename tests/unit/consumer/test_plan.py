"""What deciding one event would do (bridge.consumer.decide.plan), as decision tables: each
row a situation, built from records folded in memory (no store), and the Step it needs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest

from bridge.config import ConsumerSettings
from bridge.consumer import documents as fs
from bridge.consumer.decide import (
    Apply,
    Ended,
    Grant,
    Grow,
    NoteStarted,
    Release,
    Resend,
    Rules,
    Shrink,
    Situation,
    Step,
    Unrelease,
    ended,
    locks_first,
    plan,
)
from bridge.consumer.drains import with_grants
from bridge.consumer.ledger import LedgerEntry, LedgerState, lock_of
from bridge.consumer.state import Doc
from bridge.policy.groups import group_key
from bridge.policy.model import DEFAULT_POLICY, FleetView
from bridge.records import iso
from tests.support.fleetrecords import FleetRecords

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
E1 = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
KEY = fs.event_key(E1)
SETTINGS = ConsumerSettings()
RULES = Rules(DEFAULT_POLICY, SETTINGS, ("scale_set",), T0 - timedelta(hours=1), "consumer-0")
ALIVE_WITHIN = timedelta(seconds=SETTINGS.alive_within)


class Scene:
    """Two VMs of scale set `web` and one event, folded as the consumer folds them."""

    def __init__(self) -> None:
        self.records = FleetRecords(T0)
        for name in ("web_0", "web_1"):
            self.records.vm(name, scale_set="web")
        self.vms: dict[str, fs.VmDocument] = {}
        self.event: fs.EventDocument = {}
        self.entry: LedgerEntry | None = None
        self.heard("web_0", "web_1")

    def id(self, name: str) -> str:
        return self.records.vm_id(name)

    def heard(self, *names: str) -> None:
        for name in names:
            value = self.vms.setdefault(self.id(name), {})
            fs.merge_vm(value, self.records.heartbeat(name), iso(self.records.now))

    def told(self, name: str, **fields: object) -> None:
        record = self.records.event(name, E1, **fields)  # type: ignore[arg-type]
        fs.merge_event(self.event, record, iso(self.records.now))

    def later(self, seconds: float) -> None:
        self.records.advance(seconds)

    def node(self, name: str) -> None:
        """`name`'s agent drains its node on a grant."""
        value = self.vms.setdefault(self.id(name), {})
        fs.merge_vm(value, self.records.node(name, "pool1"), iso(self.records.now))

    def granted(self, *names: str, prepared: bool = True) -> None:
        self.entry = {
            "event_id": E1,
            "origin": "granted",
            "vms": [self.id(n) for n in names],
            "rule": "user-initiated",
            "issued_at": iso(self.records.now),
            "granted": [self.id(n) for n in names],
            "prepared": prepared,
        }

    def approved(self, *names: str, sent: bool = True) -> None:
        target = self.id(names[0])
        self.entry = {
            "event_id": E1,
            "origin": "approved",
            "vms": [self.id(n) for n in names],
            "target": target,
            "attempt": 1,
            "tried": [target],
            "rule": "user-initiated",
            "command_id": "c-1",
            "command": "{}",
            "issued_at": iso(self.records.now),
            "sent": sent,
        }

    def situation(self) -> Situation:
        now = self.records.now
        vms = {vm_id: fs.vm_view(vm_id, value) for vm_id, value in self.vms.items()}
        tried = tuple(self.entry.get("tried", ())) if self.entry else ()
        unknown_for = timedelta(seconds=SETTINGS.unknown_names_for)
        view = fs.event_view(
            self.event, vms, fs.Names.of(vms.values()), tried, now, unknown_for=unknown_for
        )
        view = with_grants(view, self.entry)
        impacted = {KEY: frozenset(self.entry["vms"])} if self.entry else {}
        fleet = FleetView(vms, impacted, ALIVE_WITHIN)
        doc = Doc(KEY, dict(self.event), "etag-1")
        return Situation(doc, view, fleet, self.entry, FleetView(vms, {}, ALIVE_WITHIN))


def web_lock() -> frozenset[str]:
    """The lock of scale set `web`'s budget group."""
    scene = Scene()
    vm = fs.vm_view(scene.id("web_0"), scene.vms[scene.id("web_0")])
    group = group_key("scale_set", vm)
    assert group is not None
    return frozenset({lock_of("scale_set", group)})


@dataclass(frozen=True)
class Row:
    name: str
    given: Callable[[Scene], None]
    step: type[Step] | None
    check: Callable[[Scene, Step], bool] = lambda scene, step: True


def user_reboot(scene: Scene) -> None:
    scene.told("web_0")


def platform_reboot(scene: Scene) -> None:
    scene.told("web_0", source="Platform")


def started_uncounted(scene: Scene) -> None:
    scene.told("web_0", transition="Started", source="Platform")


def started_counted(scene: Scene) -> None:
    started_uncounted(scene)
    scene.entry = {"event_id": E1, "origin": "started", "vms": [scene.id("web_0")]}


def sent_and_waiting(scene: Scene) -> None:
    scene.told("web_0")
    scene.approved("web_0")


def written_not_sent(scene: Scene) -> None:
    scene.told("web_0")
    scene.approved("web_0", sent=False)


def reported_gone(scene: Scene) -> None:
    sent_and_waiting(scene)
    scene.later(5)
    scene.told("web_0", transition="Completed")


def silent_past_due(scene: Scene) -> None:
    sent_and_waiting(scene)
    scene.later(15 * 60 + SETTINGS.alive_within + 1)  # due at NotBefore (15 min), then silent
    scene.heard("web_1")


def started_claim_not_stood_by(scene: Scene) -> None:
    scene.told("web_0")
    scene.entry = {"event_id": E1, "origin": "started", "vms": [scene.id("web_0")]}


def released_and_quiet(scene: Scene) -> None:
    scene.told("web_0")
    scene.event["released"] = iso(scene.records.now)


def released_then_heard(scene: Scene) -> None:
    released_and_quiet(scene)
    scene.later(60)
    scene.told("web_0", transition="Updated")


def unknown_name_lapsed(scene: Scene) -> None:
    scene.told("web_0", resources=["web_0", "web_9"])
    scene.approved("web_0")
    assert scene.entry is not None
    scene.entry["vms"].append("web_9")
    scene.later(SETTINGS.unknown_names_for + 1)
    scene.heard("web_0")
    scene.told("web_0", resources=["web_0", "web_9"], transition="Updated")
    scene.entry["issued_at"] = iso(scene.records.now)


def grown(scene: Scene) -> None:
    scene.told("web_0", resources=["web_0"])
    scene.approved("web_0")
    scene.told("web_0", resources=["web_0", "web_1"], transition="Updated")


def approves_web_0(scene: Scene, step: Step) -> bool:
    assert isinstance(step, Apply)
    wanted = ("Approve", scene.id("web_0"), web_lock())
    return (step.verdict.kind, step.verdict.target, step.locks) == wanted


def holds(scene: Scene, step: Step) -> bool:
    assert isinstance(step, Apply)
    return step.verdict.kind == "Hold" and step.locks is None


def notes_under_web_lock(scene: Scene, step: Step) -> bool:
    assert isinstance(step, NoteStarted)
    return step.locks == web_lock()


def resends_the_entry(scene: Scene, step: Step) -> bool:
    assert isinstance(step, Resend)
    return step.entry is scene.entry


def frees_as_reported(scene: Scene, step: Step) -> bool:
    assert isinstance(step, Release)
    return step.said is None and not step.again and "reported it gone" in step.why


def frees_and_says(scene: Scene, step: Step) -> bool:
    assert isinstance(step, Release)
    return step.said is not None and "no VM of the event has been heard from" in step.why


def drops_and_decides_again(scene: Scene, step: Step) -> bool:
    assert isinstance(step, Release)
    return step.again and step.said is None


def keeps_only_web_0(scene: Scene, step: Step) -> bool:
    assert isinstance(step, Shrink)
    return step.vms == (scene.id("web_0"),) and "web_9" in step.why


def counts_web_1_too(scene: Scene, step: Step) -> bool:
    assert isinstance(step, Grow)
    both = tuple(sorted([scene.id("web_0"), scene.id("web_1")]))
    return step.vms == both and step.locks == web_lock()


def node_reboot(scene: Scene) -> None:
    scene.later(1)
    scene.node("web_0")
    scene.told("web_0")


def granted_not_sent(scene: Scene) -> None:
    node_reboot(scene)
    scene.granted("web_0", prepared=False)


def granted_and_drained(scene: Scene) -> None:
    node_reboot(scene)
    scene.granted("web_0")
    scene.later(30)
    drained = scene.records.drain("web_0", E1, "Drained", exit_code=0)
    fs.merge_event(scene.event, drained, iso(scene.records.now))


def grants_web_0(scene: Scene, step: Step) -> bool:
    return (
        isinstance(step, Grant)
        and step.verdict.grant == (scene.id("web_0"),)
        and not step.again
        and step.locks == web_lock()
    )


def sends_the_grant_again(scene: Scene, step: Step) -> bool:
    return isinstance(step, Grant) and step.again and step.verdict.grant == (scene.id("web_0"),)


ROWS = [
    Row("a user's reboot is approved", user_reboot, Apply, approves_web_0),
    Row("a platform reboot is held, said once", platform_reboot, Apply, holds),
    Row(
        "a Started event not counted yet is noted",
        started_uncounted,
        NoteStarted,
        notes_under_web_lock,
    ),
    Row("a Started event counted needs nothing", started_counted, None),
    Row("an approval sent and not yet due needs nothing", sent_and_waiting, None),
    Row("an approval written but not sent is sent", written_not_sent, Resend, resends_the_entry),
    Row("an event its VMs report gone frees its slot", reported_gone, Release, frees_as_reported),
    Row(
        "an event past due whose VMs fell silent is released and said",
        silent_past_due,
        Release,
        frees_and_says,
    ),
    Row(
        "a Started entry no VM that can see the event stands by is dropped",
        started_claim_not_stood_by,
        Release,
        drops_and_decides_again,
    ),
    Row("a released event no VM spoke of since needs nothing", released_and_quiet, None),
    Row("a released event a VM speaks of again is unreleased", released_then_heard, Unrelease),
    Row(
        "a name no VM has stops counting once it lapsed",
        unknown_name_lapsed,
        Shrink,
        keeps_only_web_0,
    ),
    Row("an approved event that grew counts its new VM", grown, Grow, counts_web_1_too),
    Row("a node's drain is granted before any approval", node_reboot, Grant, grants_web_0),
    Row("a grant written but not sent is sent", granted_not_sent, Grant, sends_the_grant_again),
    Row("a granted node once drained is approved", granted_and_drained, Apply, approves_web_0),
]


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_plan_names_the_step_each_situation_needs(row: Row) -> None:
    scene = Scene()
    row.given(scene)
    s = scene.situation()
    before = copy.deepcopy((s.doc.value, s.entry))
    step = plan(s, RULES, scene.records.now)
    assert (type(step) if step is not None else None) is row.step, step
    if step is not None:
        assert row.check(scene, step), step
    assert (s.doc.value, s.entry) == before  # a plan changes nothing


def test_a_decision_already_standing_is_not_said_again() -> None:
    scene = Scene()
    platform_reboot(scene)
    step = plan(scene.situation(), RULES, scene.records.now)
    assert isinstance(step, Apply)
    verdict = step.verdict
    scene.event["decision"] = {
        "kind": verdict.kind,
        "rule": verdict.rule,
        "reason": verdict.reason,
        "at": iso(T0),
        "explanation": [],
    }
    assert plan(scene.situation(), RULES, scene.records.now) is None


def test_the_release_rule_waits_a_whole_alive_within_after_a_restart() -> None:
    scene = Scene()
    silent_past_due(scene)
    just_started = Rules(DEFAULT_POLICY, SETTINGS, ("scale_set",), scene.records.now, "consumer-0")
    step = plan(scene.situation(), just_started, scene.records.now)
    # Not released: the approval went unanswered, so the event is decided again (no live VM
    # to carry it now).
    assert isinstance(step, Apply), step
    assert step.verdict.kind != "Approve"


@pytest.mark.parametrize(("counted", "expected"), [(True, Ended(KEY)), (False, None)])
def test_an_ended_event_drops_its_entry_only_where_it_has_one(
    counted: bool, expected: Ended | None
) -> None:
    state = LedgerState()
    if counted:
        state.events[KEY] = {"event_id": E1, "origin": "started", "vms": ["vm-0"]}
    assert ended(Doc(KEY, {}), state) == expected


@pytest.mark.parametrize(
    ("step", "locks"),
    [
        (NoteStarted(KEY, None, frozenset({"l"})), frozenset({"l"})),  # type: ignore[arg-type]
        (Release(KEY, "why"), None),
        (Grow(KEY, ("a",), [], frozenset({"l"})), None),
    ],
    ids=["noting-a-start-takes-its-locks", "a-release-takes-none", "growing-reads-none-first"],
)
def test_only_a_step_that_adds_impact_reads_its_locks_first(
    step: Step, locks: frozenset[str] | None
) -> None:
    assert locks_first(step) == locks


def test_an_approval_step_carries_its_entry_command_and_record_as_one_decision() -> None:
    scene = Scene()
    granted_and_drained(scene)
    step = plan(scene.situation(), RULES, scene.records.now)
    assert isinstance(step, Apply)
    assert step.approval is not None
    entry, command, record = step.approval.entry, step.approval.command, step.said.record
    web_0 = scene.id("web_0")
    assert (command.type, command.vm_id, command.event_id) == ("Approve", web_0, E1)
    assert entry["command_id"] == record["CommandId"] == command.command_id
    assert (entry["target"], entry["sent"], entry["decision"]) == (web_0, False, record)
    # The slot the drain was granted becomes the approval's.
    assert (entry["granted"], entry.get("prepared")) == ([web_0], True)
    assert (record["DecisionAction"], record["TargetVmId"]) == ("Approve", web_0)
    assert (record["HostName"], record["PolicySource"]) == ("consumer-0", DEFAULT_POLICY.source)


def test_a_grant_step_carries_its_entry_and_one_prepare_a_vm() -> None:
    scene = Scene()
    node_reboot(scene)
    step = plan(scene.situation(), RULES, scene.records.now)
    assert isinstance(step, Grant)
    assert step.entry is not None
    assert step.said is not None
    web_0 = scene.id("web_0")
    assert [(c.type, c.vm_id) for c in step.prepares] == [("Prepare", web_0)]
    assert (step.entry["origin"], step.entry["granted"], step.entry["prepared"]) == (
        "granted", [web_0], False)  # fmt: skip
    assert step.said.record["DecisionAction"] == "Defer"

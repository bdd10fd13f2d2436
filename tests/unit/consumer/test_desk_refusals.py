"""The people desk's refusals, as decision tables: each case breaks one check (bridge.consumer.
people.desk: `refusal` on the action alone, `scope_refusal` on the pauses in force,
`event_refusal` on the event as the consumer sees it). No storage: the situations are values."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

import pytest

from bridge.commands.message import resources_digest
from bridge.consumer.people.desk import (
    MAX_REASON,
    REFUSALS,
    event_refusal,
    refusal,
    scope_refusal,
)
from bridge.consumer.people.operatorlog import OperatorAction
from bridge.policy.model import EventView, FleetView, Pause, Person, VmView

NOW = datetime(2026, 12, 2, 10, 0, tzinfo=timezone.utc)
ALICE = Person("oid-alice", "Alice")
WEB = VmView(
    vm_id="id0",
    name="web_0",
    resource_group="rg",
    location="westeurope",
    scale_set="web",
    last_seen=NOW,
)
EVENT = EventView(
    event_id="E1",
    event_type="Reboot",
    event_source="Platform",
    duration=-1,
    status="Scheduled",
    not_before=NOW + timedelta(minutes=15),
    first_seen=NOW,
    affected=("id0",),
    reporters=("id0",),
    resources=("web_0",),
)
SHOWN = resources_digest(EVENT.resources)
FLEET_PAUSE = Pause(None, None, Person("oid-bob", "Bob"), "launch week", NOW)
WEB_PAUSE = replace(FLEET_PAUSE, scope="scale_set:web")


@dataclass(frozen=True)
class Seen:
    view: EventView
    fleet: FleetView
    asked: datetime | None = None


def approve(**fields: object) -> OperatorAction:
    base = OperatorAction("approve", ALICE, "", NOW, event_id="E1", resources_digest=SHOWN)
    return replace(base, **fields)  # type: ignore[arg-type]


def pause(kind: str = "pause", **fields: object) -> OperatorAction:
    base = OperatorAction(kind, ALICE, "incident 4711", NOW)  # type: ignore[arg-type]
    return replace(base, **fields)  # type: ignore[arg-type]


ON_THE_ACTION = [
    ("an approval", approve(), True, None),
    ("a hold", approve(kind="hold"), True, None),
    ("a pause", pause(), True, None),
    ("no object id", approve(by=Person(" ", "Nobody")), True, "Invalid"),
    ("a time without its zone", approve(at=NOW.replace(tzinfo=None)), True, "Invalid"),
    ("an until without its zone", pause(until=NOW.replace(tzinfo=None)), True, "Invalid"),
    ("a reason too long", approve(reason="x" * (MAX_REASON + 1)), True, "Invalid"),
    ("no signing key", approve(), False, "NoSigningKey"),
    ("an override without a reason", approve(override_budget=True), True, "NoReason"),
    ("an override with one", approve(override_budget=True, reason="P1"), True, None),
    ("a pause without a reason", pause(reason=" "), True, "NoReason"),
    ("a resume without a reason", pause("resume", reason=""), True, "NoReason"),
    ("an approval of no event", approve(event_id=None), True, "Invalid"),
    (
        "a hold that overrides",
        approve(kind="hold", override_budget=True, reason="P1"),
        True,
        "Invalid",
    ),
]


@pytest.mark.parametrize(
    ("action", "can_sign", "code"),
    [case[1:] for case in ON_THE_ACTION],
    ids=[case[0] for case in ON_THE_ACTION],
)
def test_refusals_on_the_action_alone(
    action: OperatorAction, can_sign: bool, code: str | None
) -> None:
    answer = refusal(action, can_sign=can_sign)
    assert (answer.code if answer else None) == code
    assert answer is None or (not answer.accepted and answer.code in REFUSALS)


ON_THE_PAUSES = [
    ("a fleet pause", pause(), (), None),
    ("a scoped pause", pause(scope="zone:2"), (), None),
    ("a scope that names no budget group", pause(scope="rack:2:3"), (), "BadScope"),
    ("a pause until a time passed", pause(until=NOW), (), "Invalid"),
    ("a pause until later", pause(until=NOW + timedelta(hours=2)), (), None),
    ("a resume of the fleet paused", pause("resume"), (FLEET_PAUSE,), None),
    ("a resume of the fleet not paused", pause("resume"), (WEB_PAUSE,), "NotPaused"),
    (
        "a resume of a group as its pause spells it",
        pause("resume", scope="Scale_Set : web"),
        (WEB_PAUSE,),
        None,
    ),
]


@pytest.mark.parametrize(
    ("action", "pauses", "code"),
    [case[1:] for case in ON_THE_PAUSES],
    ids=[case[0] for case in ON_THE_PAUSES],
)
def test_refusals_of_a_pause_or_a_resume(
    action: OperatorAction, pauses: tuple[Pause, ...], code: str | None
) -> None:
    answer = scope_refusal(action, pauses, NOW)
    assert (answer.code if answer else None) == code


def seen(*pauses: Pause, **fields: object) -> Seen:
    view = replace(EVENT, **fields)  # type: ignore[arg-type]
    return Seen(view, FleetView({"id0": WEB}, {}, pauses=pauses))


ON_THE_EVENT = [
    ("an open event as shown", approve(), seen(), None),
    ("no such event", approve(), None, "NotOpen"),
    ("an event that started", approve(), seen(status="Started"), "NotOpen"),
    ("VMs changed since shown", approve(), seen(resources=("web_0", "web_1")), "ResourcesChanged"),
    ("a hold of VMs changed", approve(kind="hold"), seen(resources=()), "ResourcesChanged"),
    ("an approval under a fleet pause", approve(), seen(FLEET_PAUSE), "Paused"),
    ("an approval under its group's pause", approve(), seen(WEB_PAUSE), "Paused"),
    (
        "an approval under another group's pause",
        approve(),
        seen(replace(WEB_PAUSE, scope="scale_set:db")),
        None,
    ),
    ("an approval after the pause's time", approve(), seen(replace(FLEET_PAUSE, until=NOW)), None),
    ("a hold under a pause", approve(kind="hold"), seen(FLEET_PAUSE), None),
]


@pytest.mark.parametrize(
    ("action", "event", "code"),
    [case[1:] for case in ON_THE_EVENT],
    ids=[case[0] for case in ON_THE_EVENT],
)
def test_refusals_on_the_event(
    action: OperatorAction, event: Seen | None, code: str | None
) -> None:
    answer = event_refusal(action, event, NOW)
    assert (answer.code if answer else None) == code

"""Shadow mode (consumer.mode = shadow): the same decisions as normal mode, and nothing sent.

Two consumers with their own state get the same records; the normal one's commands are
answered as a cooperative agent would (an Approval record, then the platform starts the
event), the shadow one's are never sent. Their Decision records must say the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bridge.policy.model import Action, Budget, Match, Policy, Rule
from tests.component.consumer.test_core import Rig
from tests.support.records import assert_valid

POLICY = Policy(
    rules=(
        Rule("users", Match(event_sources=frozenset({"user"})), Action("approve")),
        Rule("rest", Match(), Action("hold")),
    ),
    budgets=(Budget("one-per-set", "scale_set", max_vms=1),),
)
EVENTS = [f"00000000-0000-4000-8000-00000000000{n}" for n in range(4)]


def decided(rig: Rig) -> list[tuple[Any, ...]]:
    return [
        (d["EventId"], d["DecisionAction"], d["DecisionRule"], d["TargetVmId"], d["Attempt"])
        for d in rig.decisions
    ]


def test_shadow_mode_decides_as_normal_mode_and_sends_nothing(tmp_path: Path) -> None:
    normal = Rig(tmp_path / "normal.db", POLICY)
    shadow = Rig(tmp_path / "shadow.db", POLICY, mode="shadow")
    both = (normal, shadow)
    for rig in both:
        for n in range(4):
            rig.fleet.vm(f"web_{n}", scale_set="web")

    def give(make: Any) -> None:
        for rig in both:
            rig.consumer.process(make(rig))

    give(lambda rig: [rig.fleet.heartbeat(f"web_{n}") for n in range(4)])
    for n, event in enumerate(EVENTS):  # four user reboots, one slot: one at a time
        give(lambda rig, n=n, event=event: [rig.fleet.event(f"web_{n}", event)])
    platform = "00000000-0000-4000-8000-0000000000ff"
    give(lambda rig: [rig.fleet.event("web_3", platform, source="Platform")])
    for n, event in enumerate(EVENTS):
        for rig in both:
            rig.fleet.advance(10)
        # The normal consumer's command is answered; the platform starts, then ends, the event.
        for command in list(normal.sender.sent):
            if command.event_id == event:
                normal.consumer.process([normal.fleet.approval(command)])
        for rig in both:  # longer than approval_timeout: an unconfirmed approval would move on
            rig.fleet.advance(40)
            rig.consumer.tick()
        give(lambda rig, n=n, event=event: [rig.fleet.event(f"web_{n}", event,
                                                            transition="Started")])  # fmt: skip
        give(lambda rig, n=n, event=event: [rig.fleet.event(f"web_{n}", event,
                                                            transition="Completed")])  # fmt: skip
        for rig in both:
            rig.consumer.tick()
    assert [c.event_id for c in normal.sender.sent] == EVENTS
    assert shadow.sender.sent == []
    assert decided(shadow) == decided(normal)
    assert ("Hold", "rest") in shadow.actions()
    for record in shadow.decisions:
        assert_valid(record)
        assert record["DecisionMode"] == "shadow"
    assert {d["DecisionMode"] for d in normal.decisions} == {"normal"}
    for rig in both:
        rig.store.close()

"""Decisions people can follow (issue 27, item 6), on the real consumer over a real SQLite state:
approve_when_ready says which VM has no prepare hook, a decision that changes says why, and
`policy explain` on a finished event explains the decision as it was taken."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from bridge.policy.model import Action, Match, Policy, Rule
from tests.component.consumer.test_core import E1, Rig
from tests.support import assert_valid


def when_ready(on_deadline: Literal["approve", "hold"] = "hold") -> Policy:
    action = Action("approve_when_ready", deadline=timedelta(minutes=10), on_deadline=on_deadline)
    return Policy(rules=(Rule("drain", Match(), action),))


def web(rig: Rig, **hooks: bool | None) -> list[dict[str, Any]]:
    """A scale set web with one VM per keyword, each saying whether it has a prepare hook."""
    beats = []
    for name, hook in hooks.items():
        rig.fleet.vm(name, scale_set="web")
        beats.append(rig.fleet.heartbeat(name, prepare_hook=hook))
    return beats


def reasons(rig: Rig) -> list[tuple[str, str]]:
    return [(d["DecisionAction"], d["DecisionReason"]) for d in rig.decisions]


# --- approve_when_ready and VMs without a prepare hook ---------------------------------------


def test_a_vm_without_a_prepare_hook_is_held_at_once_and_named(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", when_ready())
    beats = web(rig, web_0=False)
    for beat in beats:
        assert_valid(beat)
    rig.consumer.process([*beats, rig.fleet.event("web_0", E1)])
    [(action, reason)] = reasons(rig)
    # Its readiness never comes: waiting out the deadline only to hold then helps nobody.
    assert action == "Hold"
    assert "no prepare hook on VM web_0" in reason
    assert "no prepare hook on VM web_0" in rig.decisions[0]["DecisionExplanation"]
    assert rig.sender.sent == []


def test_on_deadline_approve_does_not_wait_for_a_vm_without_a_prepare_hook(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", when_ready("approve"))
    both = ["web_0", "web_1"]
    rig.consumer.process(web(rig, web_0=False, web_1=True))
    rig.consumer.process([rig.fleet.event(n, E1, resources=both) for n in both])
    # web_1's hook may still drain it: waited for; web_0 has nothing to wait for.
    [(action, reason)] = reasons(rig)
    assert action == "Defer"
    assert "prepare hook not yet succeeded on web_1" in reason
    assert "no prepare hook on VM web_0" in reason
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.hook_ready("web_1", E1)])
    assert [d["DecisionAction"] for d in rig.decisions] == ["Defer", "Approve"]
    assert "no prepare hook on VM web_0" in rig.decisions[-1]["DecisionExplanation"]
    assert len(rig.sender.sent) == 1


def test_an_agent_that_does_not_say_is_waited_for_until_the_deadline(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", when_ready())
    beats = web(rig, web_0=None)  # an agent from before HasPrepareHook
    assert "HasPrepareHook" not in beats[0]
    assert_valid(beats[0])
    rig.consumer.process([*beats, rig.fleet.event("web_0", E1)])
    rig.fleet.advance(601)
    rig.consumer.process([rig.fleet.heartbeat("web_0")])
    rig.consumer.tick()
    assert [action for action, _ in reasons(rig)] == ["Defer", "Hold"]
    for _, reason in reasons(rig):
        assert "VM web_0 has not said whether it has a prepare hook" in reason


def test_a_vm_that_installs_a_prepare_hook_is_waited_for_again(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", when_ready())
    rig.consumer.process([*web(rig, web_0=False), rig.fleet.event("web_0", E1)])
    rig.fleet.advance(5)
    rig.consumer.process([rig.fleet.heartbeat("web_0", "Start", prepare_hook=True)])
    rig.consumer.tick()
    assert [action for action, _ in reasons(rig)] == ["Hold", "Defer"]
    assert "prepare hook not yet succeeded on web_0" in reasons(rig)[-1][1]
    rig.consumer.process([rig.fleet.hook_ready("web_0", E1)])
    assert len(rig.sender.sent) == 1


@pytest.mark.parametrize("hook", [True, False])
def test_a_heartbeat_without_the_field_forgets_what_an_earlier_one_said(
    tmp_path: Path, hook: bool
) -> None:
    # The VM's agent was replaced by an older one: what the newer one said no longer holds.
    rig = Rig(tmp_path / "fleet.db", when_ready())
    rig.consumer.process([*web(rig, web_0=hook)])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.heartbeat("web_0", "Start"), rig.fleet.event("web_0", E1)])
    [(action, reason)] = reasons(rig)
    assert (action, "VM web_0 has not said whether it has a prepare hook" in reason) == (
        "Defer",
        True,
    )

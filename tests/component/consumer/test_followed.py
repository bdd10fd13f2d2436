"""Decisions people can follow (issue 27, item 6), on the real consumer over a real SQLite state:
approve_when_ready says which VM has no prepare hook, a decision that changes says why, and
`policy explain` on a finished event explains the decision as it was taken."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from bridge.cli import build_parser
from bridge.policy.model import Action, Budget, Match, Policy, Rule
from tests.component.consumer.test_core import E1, E2, Rig
from tests.support.records import assert_valid


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
    why = rig.decisions[-1]["DecisionExplanation"].splitlines()[0]
    assert why.endswith("): web_0 no longer says it has no prepare hook")
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


# --- a decision that changes says why ---------------------------------------------------------

DRAIN_WEB = Policy(
    rules=(
        Rule("drain-web", Match(scale_sets=frozenset({"web"})),
             Action("approve_when_ready", deadline=timedelta(minutes=10))),
        Rule("everything-else", Match(), Action("hold")),
    )
)  # fmt: skip


def test_a_decision_changed_by_the_affected_vms_own_record_says_why(tmp_path: Path) -> None:
    # The neighbour web_1 is read first: web_0, which the event names, has not been heard
    # from yet (its records are behind on another partition), so the rule about scale set
    # web cannot match and the event is held; web_0's records follow within milliseconds.
    rig = Rig(tmp_path / "fleet.db", DRAIN_WEB)
    rig.fleet.vm("web_0", scale_set="web")
    rig.fleet.vm("web_1", scale_set="web")
    rig.consumer.process([rig.fleet.heartbeat("web_1", prepare_hook=True),
                          rig.fleet.event("web_1", E1, resources=["web_0"])])  # fmt: skip
    rig.consumer.process([rig.fleet.heartbeat("web_0", prepare_hook=True),
                          rig.fleet.event("web_0", E1, resources=["web_0"])])  # fmt: skip
    assert rig.actions() == [("Hold", "everything-else"), ("Defer", "drain-web")]
    why = rig.decisions[-1]["DecisionExplanation"].splitlines()
    assert why[0].startswith("changed from Hold by everything-else (decided at ")
    assert "web_0 now resolves to a known VM" in why[0]
    assert "rule drain-web matches now, everything-else did then" in why[0]
    assert why[1:] == [
        "rule drain-web: matches; its action is approve when ready (deadline 0:10:00, then hold)",
        "approve when ready: waiting for prepare hooks: 1 of 1 VMs not ready: "
        "prepare hook not yet succeeded on web_0",
    ]
    for decision in rig.decisions:
        assert_valid(decision)


def test_a_hook_that_succeeds_turns_a_defer_into_an_approval_that_says_so(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", when_ready())
    rig.consumer.process([*web(rig, web_0=True), rig.fleet.event("web_0", E1)])
    rig.fleet.advance(2)
    rig.consumer.process([rig.fleet.hook_ready("web_0", E1)])
    assert [d["DecisionAction"] for d in rig.decisions] == ["Defer", "Approve"]
    first = rig.decisions[-1]["DecisionExplanation"].splitlines()[0]
    assert first.startswith("changed from Defer by drain (decided at 2026-11-21T10:00:00.000Z)")
    assert "the prepare hook succeeded on web_0" in first


def test_a_decision_changed_by_the_budgets_says_nothing_its_vms_said_changed(
    tmp_path: Path,
) -> None:
    policy = Policy(
        rules=(Rule("all", Match(), Action("approve")),),
        budgets=(Budget("one-web", "scale_set", max_vms=1),),
    )
    rig = Rig(tmp_path / "fleet.db", policy)
    batch = [*web(rig, web_0=None, web_1=None), rig.fleet.event("web_0", E1)]
    rig.fleet.advance(1)
    rig.consumer.process([*batch, rig.fleet.event("web_1", E2)])
    rig.fleet.advance(60)
    rig.consumer.process([rig.fleet.event("web_0", E1, transition="Completed")])
    rig.consumer.tick()
    assert rig.actions() == [("Approve", "all"), ("Defer", "all"), ("Approve", "all")]
    first = rig.decisions[-1]["DecisionExplanation"].splitlines()[0]
    assert first == (
        "changed from Defer by all (decided at 2026-11-21T10:00:01.000Z): nothing the event's "
        "VMs said changed: the budgets, the live VMs or the time did"
    )


# --- policy explain on an event that is over ---------------------------------------------------


def explain(*argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    """`se-bridge policy explain ARGV` through the command line's parser, in this process."""
    args = build_parser().parse_args(["policy", "explain", *argv])
    assert args.func(args) == 0
    out: str = capsys.readouterr().out
    return out


def approved_then_completed(rig: Rig) -> list[dict[str, Any]]:
    """A user reboot of web_0, approved through it, then completed."""
    records = [*web(rig, web_0=True), rig.fleet.event("web_0", E1)]
    rig.consumer.process(records)
    rig.fleet.advance(1)
    records += [rig.fleet.approval(rig.sender.sent[0])]
    rig.fleet.advance(60)
    records += [rig.fleet.event("web_0", E1, transition="Started")]
    rig.fleet.advance(120)
    records += [rig.fleet.event("web_0", E1, transition="Completed")]
    rig.consumer.process(records[2:])
    return records


def test_explain_on_a_finished_event_explains_the_decision_it_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = Rig(tmp_path / "fleet.db")
    approved_then_completed(rig)
    [decision] = rig.decisions
    state = f"sqlite:{tmp_path / 'fleet.db'}"
    text = explain("--state", state, "--event", E1, capsys=capsys)
    assert "Ignore" not in text
    assert (
        "decision: Approve by user-initiated: rule user-initiated (approve); approval sent "
        "through web_0" in text
    )
    assert f"taken at {decision['TimeGenerated']}; the event is over" in text
    assert decision["DecisionExplanation"] in text.replace("\n  ", "\n")
    said = json.loads(explain("--state", state, "--event", E1, "--json", capsys=capsys))
    assert (said["DecisionAction"], said["TargetVmId"]) == ("Approve", rig.fleet.vm_id("web_0"))
    assert said["DecidedAt"] == decision["TimeGenerated"]
    assert said["EventStatus"] is None  # as records say of an event that is gone
    assert said["DecisionExplanation"] == decision["DecisionExplanation"].splitlines()


def test_explain_on_an_event_first_seen_started_says_none_was_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = Rig(tmp_path / "fleet.db")
    rig.consumer.process(
        [*web(rig, web_0=True), rig.fleet.event("web_0", E1, transition="Started")]
    )
    state = f"sqlite:{tmp_path / 'fleet.db'}"
    text = explain("--state", state, "--event", E1, capsys=capsys)
    assert "Ignore" not in text
    assert "decision: none: the event had started when it was first read" in text
    said = json.loads(explain("--state", state, "--event", E1, "--json", capsys=capsys))
    assert (said["EventStatus"], said["DecisionAction"]) == ("Started", None)


def test_explain_from_records_of_a_finished_event_decides_as_a_consumer_would_have(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = Rig(tmp_path / "fleet.db")
    records = approved_then_completed(rig)
    sink = tmp_path / "records.jsonl"
    sink.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    text = explain("--records", str(sink), capsys=capsys)
    assert "Ignore" not in text
    assert "decision: Approve by user-initiated" in text
    assert "the event is over" in text
    # With the consumer's own Decision record in the file, that one is the decision taken.
    sink.write_text("".join(json.dumps(r) + "\n" for r in [*records, *rig.decisions]),
                    encoding="utf-8")  # fmt: skip
    text = explain("--records", str(sink), capsys=capsys)
    assert f"taken at {rig.decisions[0]['TimeGenerated']}; the event is over" in text


def test_explain_and_the_decision_name_the_vm_without_a_prepare_hook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nrules:\n  - name: drain\n    action: "
                      "{approve_when_ready: {deadline: 10m}}\n", encoding="utf-8")  # fmt: skip
    rig = Rig(tmp_path / "fleet.db", when_ready())
    rig.consumer.process([*web(rig, web_0=False), rig.fleet.event("web_0", E1)])
    state = f"sqlite:{tmp_path / 'fleet.db'}"
    text = explain("--policy", str(policy), "--state", state, "--event", E1, capsys=capsys)
    assert "decision: Hold by drain: no prepare hook on VM web_0" in text

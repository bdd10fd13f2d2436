"""The pure evaluator with people in it: asks, a person's decision, pauses (issue 29)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from bridge.policy.evaluation import evaluate
from bridge.policy.gates.pause import covers
from bridge.policy.model import (
    PERSON_RULE,
    Action,
    Budget,
    Match,
    Pause,
    Person,
    PersonDecision,
    Rule,
    group_kind,
    parse_scope,
)
from tests.unit.policy.test_model import APPROVE_ALL, NOW, event, fleet, node, vm, with_rules

ASK = Rule("primary", Match(), Action("ask", timedelta(minutes=30), target="dba"))
ASK_OR_APPROVE = replace(ASK, action=replace(ASK.action, on_deadline="approve"))
ONE_AT_A_TIME = (Budget("one", "fleet", max_vms=1),)
ALICE = PersonDecision("approve", Person("oid-alice", "Alice"), "failover done", NOW)
BOB = Person("oid-bob", "Bob")


def test_an_ask_waits_for_a_person_until_its_deadline_from_the_first_ask() -> None:
    later_start = NOW + timedelta(hours=1)
    first = evaluate(with_rules(ASK), fleet(vm(0)), event(not_before=later_start), NOW)
    assert (first.kind, first.rule, first.asked) == ("Ask", "primary", "dba")
    assert first.ask_deadline == NOW + timedelta(minutes=30) == first.recheck_at
    # Later passes count from when it was first asked, and say the same (said once).
    later = evaluate(with_rules(ASK), fleet(vm(0)), event(asked_at=NOW, not_before=later_start),
                     NOW + timedelta(minutes=10))  # fmt: skip
    assert (later.kind, later.reason, later.ask_deadline) == (
        "Ask",
        first.reason,
        first.ask_deadline,
    )


def test_an_ask_times_out_to_hold() -> None:
    asked = event(asked_at=NOW - timedelta(minutes=31), not_before=NOW + timedelta(hours=1))
    verdict = evaluate(with_rules(ASK), fleet(vm(0)), asked, NOW)
    assert (verdict.kind, verdict.rule, verdict.asked) == ("Hold", "primary", "dba")
    assert "nobody answered dba" in verdict.reason


def test_an_ask_times_out_to_approve_and_the_budgets_still_apply() -> None:
    asked = event(asked_at=NOW - timedelta(minutes=31), not_before=NOW + timedelta(hours=1))
    verdict = evaluate(with_rules(ASK_OR_APPROVE), fleet(vm(0)), asked, NOW)
    assert (verdict.kind, verdict.target, verdict.asked) == ("Approve", "id0", "dba")
    full = fleet(vm(0), vm(1), impacted={"other": frozenset({"id1"})})
    waiting = evaluate(with_rules(ASK_OR_APPROVE, budgets=ONE_AT_A_TIME), full, asked, NOW)
    assert waiting.kind == "Defer"
    assert "budget one" in waiting.reason


def test_an_ask_never_waits_past_not_before() -> None:
    soon = event(not_before=NOW + timedelta(minutes=5))
    verdict = evaluate(with_rules(ASK_OR_APPROVE), fleet(vm(0)), soon, NOW)
    assert verdict.ask_deadline == NOW + timedelta(minutes=5)
    # At NotBefore the platform starts it: on_deadline approve has nothing left to approve.
    after = evaluate(with_rules(ASK_OR_APPROVE), fleet(vm(0)), replace(soon, asked_at=NOW),
                     NOW + timedelta(minutes=5))  # fmt: skip
    assert after.kind == "Hold"


def test_a_persons_approval_comes_before_the_rules_and_waits_on_a_full_budget() -> None:
    full = fleet(vm(0), vm(1), impacted={"other": frozenset({"id1"})})
    mine = event(person=ALICE)
    waiting = evaluate(with_rules(ASK, budgets=ONE_AT_A_TIME), full, mine, NOW)
    assert (waiting.kind, waiting.rule, waiting.person) == ("Defer", PERSON_RULE, ALICE)
    assert "approved by Alice, and the budgets still apply" in waiting.reason
    free = evaluate(with_rules(ASK, budgets=ONE_AT_A_TIME), fleet(vm(0), vm(1)), mine, NOW)
    assert (free.kind, free.rule, free.target, free.override) == (
        "Approve", PERSON_RULE, "id0", False)  # fmt: skip


def test_an_override_approves_over_the_budget_and_says_so() -> None:
    full = fleet(vm(0), vm(1), impacted={"other": frozenset({"id1"})})
    mine = event(person=replace(ALICE, override_budget=True))
    verdict = evaluate(with_rules(budgets=ONE_AT_A_TIME), full, mine, NOW)
    assert (verdict.kind, verdict.rule, verdict.override) == ("Approve", PERSON_RULE, True)
    assert "over the budget" in verdict.reason
    assert any("budget overridden by Alice (oid-alice)" in line for line in verdict.explanation)


def test_a_persons_hold_holds_what_the_policy_would_approve() -> None:
    held = event(person=replace(ALICE, kind="hold", reason="incident"))
    verdict = evaluate(with_rules(APPROVE_ALL), fleet(vm(0)), held, NOW)
    assert (verdict.kind, verdict.rule) == ("Hold", PERSON_RULE)
    assert "held by Alice" in verdict.reason


def test_a_pause_stops_the_policys_approvals_and_the_peoples_until_its_time() -> None:
    until = NOW + timedelta(minutes=5)
    pause = Pause(None, until, BOB, "launch week", NOW)
    paused = replace(fleet(vm(0)), pauses=(pause,))
    by_policy = evaluate(with_rules(APPROVE_ALL), paused, event(), NOW)
    assert (by_policy.kind, by_policy.recheck_at, by_policy.pause) == ("Defer", until, pause)
    assert "paused (fleet) by Bob" in by_policy.reason
    by_person = evaluate(with_rules(), paused, event(person=ALICE), NOW)
    assert (by_person.kind, by_person.rule, by_person.pause) == ("Defer", PERSON_RULE, pause)
    lifted = evaluate(with_rules(APPROVE_ALL), paused, event(), until)
    assert lifted.kind == "Approve"


def test_a_scoped_pause_covers_only_its_budget_group() -> None:
    web, db = vm(0, scale_set="web"), vm(1, scale_set="db")
    pause = Pause("scale_set:web", None, BOB, "web release", NOW)
    paused = replace(fleet(web, db), pauses=(pause,))
    assert evaluate(with_rules(APPROVE_ALL), paused, event("id0"), NOW).kind == "Defer"
    assert evaluate(with_rules(APPROVE_ALL), paused, event("id1"), NOW).kind == "Approve"
    tagged = replace(fleet(vm(2, tags={"tier": "db"})),
                     pauses=(Pause("tag:tier:db", None, BOB, "r", NOW),))  # fmt: skip
    assert evaluate(with_rules(APPROVE_ALL), tagged, event("id2"), NOW).kind == "Defer"


def test_a_pause_of_a_node_pool_covers_the_nodes_that_name_it_and_those_tagged_with_it() -> None:
    """A pool's budget group within a scale set ignores what a heartbeat says (issue 37), but
    a pause errs on the side of stopping: `node_pool:pool1` covers a node that says pool1."""
    pause = Pause("node_pool:pool1", None, BOB, "cluster upgrade", NOW)
    said = vm(0, scale_set="aks-pool1-vmss", node_pool="pool1")
    tagged = vm(1, scale_set="vmss-7", tags={"aks-managed-poolName": "pool1"})
    apart = vm(2, node_pool="pool1")
    other = vm(3, scale_set="aks-pool2-vmss", node_pool="pool2")
    assert [covers(pause, [v]) for v in (said, tagged, apart, other)] == [True, True, True, False]


# --- with drains (issue 30): a node is drained before any approval, a person's too --------


def test_a_persons_approval_of_a_node_grants_its_drain_first_within_the_budgets() -> None:
    nodes = fleet(node(0), node(1))
    mine = event("id0", person=ALICE)
    first = evaluate(with_rules(budgets=ONE_AT_A_TIME), nodes, mine, NOW)
    assert (first.kind, first.rule, first.grant) == ("Defer", PERSON_RULE, ("id0",))
    assert first.reason == "drain granted on aks-0; waiting for it"
    drained = replace(mine, granted=frozenset({"id0"}), ready=frozenset({"id0"}))
    assert evaluate(with_rules(budgets=ONE_AT_A_TIME), nodes, drained, NOW).kind == "Approve"
    busy = replace(nodes, impacted={"other": frozenset({"id1"})})
    full = evaluate(with_rules(budgets=ONE_AT_A_TIME), busy, mine, NOW)
    assert (full.kind, full.grant) == ("Defer", ())
    over = replace(mine, person=replace(ALICE, override_budget=True))
    forced = evaluate(with_rules(budgets=ONE_AT_A_TIME), busy, over, NOW)
    assert (forced.kind, forced.grant, forced.override) == ("Defer", ("id0",), True)


def test_a_pause_stops_a_drains_grant_and_an_ask_timed_out_to_approve_grants_it() -> None:
    nodes = fleet(node(0))
    paused = replace(nodes, pauses=(Pause(None, None, BOB, "incident", NOW),))
    stopped = evaluate(with_rules(APPROVE_ALL), paused, event(), NOW)
    assert (stopped.kind, stopped.grant, stopped.pause is not None) == ("Defer", (), True)
    asked = event(asked_at=NOW - timedelta(minutes=31), not_before=NOW + timedelta(hours=1))
    granted = evaluate(with_rules(ASK_OR_APPROVE), nodes, asked, NOW)
    assert (granted.kind, granted.grant, granted.asked) == ("Defer", ("id0",), "dba")


@pytest.mark.parametrize(
    ("scope", "parsed"),
    [
        (None, None),
        ("fleet", None),
        (" FLEET ", None),
        ("scale_set:web", ("scale_set", "web")),
        ("Scale_Set:web", ("scale_set", "web")),
        ("ZONE:2", ("zone", "2")),
        ("tag:tier:db", ("tag:tier", "db")),
        ("TAG:Tier:db", ("tag:Tier", "db")),
        ("tag:env:prod:eu", ("tag:env", "prod:eu")),
        (" scale_set : web ", ("scale_set", "web")),
    ],
)
def test_a_scope_reads_its_kind_as_a_policy_reads_a_budget_group(
    scope: str | None, parsed: tuple[str, str] | None
) -> None:
    assert parse_scope(scope) == parsed
    if parsed is not None:
        assert group_kind(parsed[0]) == parsed[0]


@pytest.mark.parametrize(
    "scope",
    [
        "fleet:x",
        "scale_set",
        "scale_set:",
        "pool:x",
        "tag::db",
        ":x",
        "tag:tier",
        "x:y:z",
        "scale_set:a:b",
    ],
)
def test_a_scope_that_names_no_group_says_what_would(scope: str) -> None:
    with pytest.raises(ValueError, match=r"is not KIND:VALUE with KIND one of scale_set, zone"):
        parse_scope(scope)


def test_a_pause_whose_scope_cannot_be_read_covers_every_event() -> None:
    pause = Pause("pool:x", None, BOB, "incident", NOW)
    assert covers(pause, [vm(0)])

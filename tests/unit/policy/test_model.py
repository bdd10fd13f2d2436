"""The pure evaluator: the same fleet, event and clock always give the same verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, time, timedelta, timezone
from typing import Literal

import pytest

from bridge.policy.carrier import UNREPORTED_CARRIER_WITHIN
from bridge.policy.evaluation import evaluate
from bridge.policy.groups import can_hold, group_key
from bridge.policy.model import (
    ARM_CARRIER,
    DEFAULT_POLICY,
    Action,
    Blocker,
    Budget,
    DrainView,
    EventView,
    FleetView,
    Match,
    Policy,
    Range,
    Rule,
    Scope,
    VmView,
    Window,
)

UTC = timezone.utc
NOW = datetime(2024, 6, 12, 10, 0, tzinfo=UTC)  # a Wednesday
HOLD_ALL = Rule("everything-else", Match(), Action("hold"))
APPROVE_ALL = Rule("approve-all", Match(), Action("approve"))


def vm(n: int, **fields: object) -> VmView:
    base = VmView(vm_id=f"id{n}", name=f"vm{n}", resource_group="rg", location="westeurope",
                  last_seen=NOW - timedelta(minutes=1))  # fmt: skip
    return replace(base, **fields)  # type: ignore[arg-type]


def fleet(*vms: VmView, impacted: Mapping[str, frozenset[str]] | None = None) -> FleetView:
    return FleetView(vms={v.vm_id: v for v in vms}, impacted=impacted or {})


def event(*affected: str, **fields: object) -> EventView:
    """A Scheduled platform Reboot affecting (and reported by) `affected` (default id0)."""
    ids = affected or ("id0",)
    base = EventView(
        event_id="e1", event_type="Reboot", event_source="Platform", duration=-1,
        status="Scheduled", not_before=NOW + timedelta(minutes=15),
        first_seen=NOW - timedelta(minutes=1), affected=ids, reporters=ids,
    )  # fmt: skip
    return replace(base, **fields)  # type: ignore[arg-type]


def with_rules(*rules: Rule, budgets: tuple[Budget, ...] = ()) -> Policy:
    return Policy(rules=(*rules, HOLD_ALL), budgets=budgets)


@dataclass(frozen=True)
class Case:
    name: str
    policy: Policy
    fleet: FleetView
    event: EventView
    kind: str
    rule: str
    target: str | None = None
    recheck_at: datetime | None = None
    reason: str = ""
    now: datetime = NOW


def check(case: Case) -> None:
    verdict = evaluate(case.policy, case.fleet, case.event, case.now)
    got = (verdict.kind, verdict.rule, verdict.target, verdict.recheck_at)
    assert got == (case.kind, case.rule, case.target, case.recheck_at), verdict.reason
    assert case.reason in verdict.reason


ONE = fleet(vm(0))

DEFAULT_CASES = [
    Case("user reboot", DEFAULT_POLICY, ONE, event(event_source="User"), "Approve",
         "user-initiated", "id0"),
    Case("user in any case", DEFAULT_POLICY, ONE, event(event_source="USER"), "Approve",
         "user-initiated", "id0"),
    Case("platform reboot", DEFAULT_POLICY, ONE, event(), "Hold", "everything-else"),
    Case("no source (old api)", DEFAULT_POLICY, ONE, event(event_source=None), "Hold",
         "everything-else"),
    Case("started is ignored", DEFAULT_POLICY, ONE, event(event_source="User", status="Started"),
         "Ignore", "(no rule)", reason="Started"),
    *(
        Case(f"freeze {d}", DEFAULT_POLICY, ONE, event(event_type="Freeze", duration=d),
             kind, rule, "id0" if kind == "Approve" else None)
        for d, kind, rule in [(-1, "Hold", "everything-else"), (0, "Approve", "short-freeze"),
                              (8, "Approve", "short-freeze"), (9, "Hold", "everything-else"),
                              (None, "Hold", "everything-else")]
    ),
    Case("started freeze", DEFAULT_POLICY, ONE, event(event_type="Freeze", duration=0,
         status="Started"), "Ignore", "(no rule)"),
    Case("no rules at all", Policy(rules=()), ONE, event(), "Hold", "(no rule)"),
]  # fmt: skip


DB = Rule("db", Match(tags=(("Tier", "db"),)), Action("approve"))
GLOB = Rule("db-names", Match(names=("DB-*",)), Action("approve"))
DB_FLEET = fleet(
    vm(0, name="db-0", tags={"tier": "db"}),
    vm(1, name="db-1", tags={"TIER": "db"}),
    vm(2, name="web-0", tags={"tier": "web"}),
    vm(3, name="DB-3", tags={"tier": "DB"}),
)
VM_CASES = [
    Case("all affected match", with_rules(DB), DB_FLEET, event("id0", "id1"), "Approve", "db",
         "id0"),
    Case("one affected does not", with_rules(DB), DB_FLEET, event("id0", "id2"), "Hold",
         "everything-else"),
    Case("tag values compare exactly", with_rules(DB), DB_FLEET, event("id3"), "Hold",
         "everything-else"),
    Case("an unresolved name fails", with_rules(DB), DB_FLEET,
         event("id0", unresolved=("db-9",)), "Hold", "everything-else"),
    Case("no affected VM fails", with_rules(DB), DB_FLEET, event(affected=(), reporters=("id0",)),
         "Hold", "everything-else"),
    Case("names glob case-blind", with_rules(GLOB), DB_FLEET, event("id0", "id3"), "Approve",
         "db-names", "id0"),
    Case("glob fails for one", with_rules(GLOB), DB_FLEET, event("id0", "id2"), "Hold",
         "everything-else"),
    Case("scale set case-blind",
         with_rules(Rule("web", Match(scale_sets=frozenset({"web"})), Action("approve"))),
         fleet(vm(0, scale_set="Web")), event(), "Approve", "web", "id0"),
    Case("event and vm conditions together",
         with_rules(Rule("r", Match(event_types=frozenset({"redeploy"}), zones=frozenset({"1"})),
                         Action("approve"))),
         fleet(vm(0, zone="1")), event(), "Hold", "everything-else"),
    Case("duration range open below",
         with_rules(Rule("unknown", Match(duration=Range(below=0)), Action("approve"))),
         ONE, event(duration=-1), "Approve", "unknown", "id0"),
]  # fmt: skip


def ready(deadline: timedelta | None, on_deadline: Literal["approve", "hold"] = "hold") -> Policy:
    action = Action("approve_when_ready", deadline=deadline, on_deadline=on_deadline)
    return with_rules(Rule("drain", Match(), action))


TWO = fleet(vm(0), vm(1))
FIRST_SEEN = NOW - timedelta(minutes=1)
READY_CASES = [
    Case("all ready", ready(timedelta(minutes=10)), TWO,
         event("id0", "id1", ready=frozenset({"id0", "id1"})), "Approve", "drain", "id0"),
    Case("one not ready before the deadline", ready(timedelta(minutes=10)), TWO,
         event("id0", "id1", ready=frozenset({"id0"})), "Defer", "drain",
         recheck_at=FIRST_SEEN + timedelta(minutes=10), reason="1 of 2 VMs not ready"),
    Case("unresolved counts as not ready", ready(timedelta(minutes=10)), TWO,
         event("id0", ready=frozenset({"id0"}), unresolved=("ghost",)), "Defer", "drain",
         recheck_at=FIRST_SEEN + timedelta(minutes=10), reason="1 of 2 VMs not ready"),
    Case("deadline passed, then hold", ready(timedelta(seconds=30)), TWO,
         event("id0", "id1", ready=frozenset({"id0"})), "Hold", "drain",
         reason="deadline passed"),
    Case("deadline passed, then approve", ready(timedelta(seconds=30), "approve"), TWO,
         event("id0", "id1", ready=frozenset({"id0"})), "Approve", "drain", "id0"),
    Case("no deadline waits for NotBefore", ready(None), TWO,
         event("id0", ready=frozenset()), "Defer", "drain", now=NOW + timedelta(days=1)),
    Case("exactly at the deadline", ready(timedelta(minutes=1)), TWO,
         event("id0", ready=frozenset()), "Hold", "drain"),
    Case("ready approval still obeys budgets",
         replace(ready(timedelta(minutes=10)), budgets=(Budget("b", "fleet", max_vms=1),)), TWO,
         event("id0", "id1", ready=frozenset({"id0", "id1"})), "Hold", "drain",
         reason="budget b"),
]  # fmt: skip


def windowed(*windows: Window, zone: str = "UTC") -> Policy:
    action = Action("approve_in_window", windows=windows, timezone=zone)
    return with_rules(Rule("nights", Match(), action))


DAILY = frozenset(range(7))
WEEKDAYS = frozenset(range(5))
NIGHT = Window(DAILY, time(1), time(5))
LATE = Window(WEEKDAYS, time(23), time(2))  # wraps past midnight
# 2024-03-31: Europe/Berlin moves from +01:00 to +02:00 at 01:00 UTC.
SAT_BEFORE_DST = datetime(2024, 3, 30, 12, 0, tzinfo=UTC)
MONDAY = frozenset({0})
NY_SECOND_PASS = datetime(2024, 11, 3, 6, 30, tzinfo=UTC)  # 01:30 EST, the hour's second pass
NY_SPRING = datetime(2024, 3, 10, 5, 0, tzinfo=UTC)  # midnight EST; 02:00-03:00 will not exist


def at(day: int, hour: int, minute: int = 0) -> datetime:
    """A UTC time in the week of 2024-06-10 (a Monday = day 0)."""
    return datetime(2024, 6, 10 + day, hour, minute, tzinfo=UTC)


def far(now: datetime) -> EventView:
    return event(not_before=now + timedelta(days=9))


WINDOW_CASES = [
    Case("inside", windowed(NIGHT), ONE, far(at(2, 3)), "Approve", "nights", "id0", now=at(2, 3)),
    Case("at the opening", windowed(NIGHT), ONE, far(at(2, 1)), "Approve", "nights", "id0",
         now=at(2, 1)),
    Case("at the close", windowed(NIGHT), ONE, far(at(2, 5)), "Defer", "nights",
         recheck_at=at(3, 1), now=at(2, 5)),
    Case("before, same day", windowed(NIGHT), ONE, far(at(2, 0, 30)), "Defer", "nights",
         recheck_at=at(2, 1), now=at(2, 0, 30), reason="outside the maintenance window"),
    Case("earliest of two windows", windowed(NIGHT, Window(DAILY, time(12), time(13))), ONE,
         far(at(2, 10)), "Defer", "nights", recheck_at=at(2, 12), now=at(2, 10)),
    Case("wraps: Friday night into Saturday", windowed(LATE), ONE, far(at(5, 1)), "Approve",
         "nights", "id0", now=at(5, 1)),
    Case("wraps: Friday 23:30", windowed(LATE), ONE, far(at(4, 23, 30)), "Approve", "nights",
         "id0", now=at(4, 23, 30)),
    Case("wraps: Monday 01:00 opened on Sunday", windowed(LATE), ONE, far(at(0, 1)), "Defer",
         "nights", recheck_at=at(0, 23), now=at(0, 1)),
    Case("wraps: Saturday 23:00 is not a weekday", windowed(LATE), ONE, far(at(5, 23)), "Defer",
         "nights", recheck_at=at(7, 23), now=at(5, 23)),
    Case("local time zone", windowed(NIGHT, zone="Europe/Istanbul"), ONE, far(at(2, 3)), "Defer",
         "nights", recheck_at=at(2, 22), now=at(2, 3)),  # 06:00 +03:00; opens 01:00 +03:00
    Case("DST: the next opening is after the change", windowed(Window(MONDAY, time(1), time(2)),
         zone="Europe/Berlin"), ONE, far(SAT_BEFORE_DST), "Defer", "nights",
         recheck_at=datetime(2024, 3, 31, 23, 0, tzinfo=UTC), now=SAT_BEFORE_DST),
    Case("DST: inside by summer time", windowed(Window(MONDAY, time(2), time(3)),
         zone="Europe/Berlin"), ONE, far(SAT_BEFORE_DST),
         "Approve", "nights", "id0", now=datetime(2024, 4, 1, 0, 30, tzinfo=UTC)),
    # 2024-11-03: New York repeats 01:00-02:00 (EDT, then EST). At 01:30 EST the 01:45 EDT
    # start is past; the next opening is 01:45 EST, not a time before now.
    Case("DST: the repeated hour opens twice", windowed(Window(DAILY, time(1, 45), time(1, 50)),
         zone="America/New_York"), ONE, far(NY_SECOND_PASS), "Defer", "nights",
         recheck_at=datetime(2024, 11, 3, 6, 45, tzinfo=UTC), now=NY_SECOND_PASS),
    Case("DST: a start in the skipped hour", windowed(Window(DAILY, time(2, 30), time(4)),
         zone="America/New_York"), ONE, far(NY_SPRING), "Defer", "nights",
         recheck_at=datetime(2024, 3, 10, 7, 30, tzinfo=UTC), now=NY_SPRING),  # 03:30 EDT
    Case("next window after NotBefore", windowed(NIGHT), ONE,
         event(not_before=at(2, 12)), "Hold", "nights", now=at(2, 10), reason="before NotBefore"),
    Case("next window exactly at NotBefore", windowed(NIGHT), ONE, event(not_before=at(3, 1)),
         "Hold", "nights", now=at(2, 10)),
    Case("no NotBefore", windowed(NIGHT), ONE, event(not_before=None), "Defer", "nights",
         recheck_at=at(3, 1), now=at(2, 10)),
]  # fmt: skip
# These run at other times than NOW; the target must be alive at each case's own clock.
WINDOW_CASES = [replace(c, fleet=fleet(vm(0, last_seen=c.now))) for c in WINDOW_CASES]


def budgeted(*budgets: Budget) -> Policy:
    return Policy(rules=(APPROVE_ALL,), budgets=budgets)


WEB = fleet(*(vm(n, scale_set="web", fault_domain=n % 2) for n in range(4)),
            vm(4, scale_set="api"), vm(5))  # fmt: skip
PER_SET = budgeted(Budget("one-per-set", "scale_set", max_vms=1))
QUARTER = budgeted(Budget("quarter", "scale_set", max_percent=25))
FIVE = fleet(*(vm(n, scale_set="s") for n in range(5)))
HALF = budgeted(Budget("half", "scale_set", max_percent=50))  # floor(2.5) = 2 of FIVE
TIERS = fleet(vm(0, tags={"tier": "db"}), vm(1, tags={"Tier": "db"}), vm(2, tags={"tier": "web"}),
              vm(3))  # fmt: skip
PER_TIER = budgeted(Budget("one-per-tier", "tag:TIER", max_vms=1))
PER_FD = budgeted(Budget("one-per-fd", "fault_domain", max_vms=1))
# Fault domain 0 four times over: two scale sets, and availability sets in two resource groups.
FD0 = fleet(vm(0, scale_set="web", fault_domain=0), vm(1, scale_set="api", fault_domain=0),
            vm(2, fault_domain=0), vm(3, fault_domain=0, resource_group="rg2"),
            vm(4, fault_domain=0))  # fmt: skip
FLEET_ONE = budgeted(Budget("one", "fleet", max_vms=1))
# WEB in a subscription: where a name no VM is known by may be is the reporters' scope.
WEB_S = fleet(*(replace(v, subscription_id="s") for v in WEB.vms.values()))
WEB_SCOPE, API_SCOPE = ("s", "rg", "web"), ("s", "rg", "api")


def busy(**events: tuple[str, ...]) -> dict[str, frozenset[str]]:
    return {event_id: frozenset(vms) for event_id, vms in events.items()}


BUDGET_CASES = [
    Case("room in the set", PER_SET, WEB, event("id0"), "Approve", "approve-all", "id0"),
    Case("set busy with another event", PER_SET, replace(WEB, impacted=busy(e2=("id1",))),
         event("id0"), "Defer", "approve-all", reason="has 1 of 4 VMs impacted"),
    Case("another set busy", PER_SET, replace(WEB, impacted=busy(e2=("id4",))), event("id0"),
         "Approve", "approve-all", "id0"),
    Case("VMs outside any group are not limited", PER_SET,
         replace(WEB, impacted=busy(e2=("id4",))), event("id5"), "Approve", "approve-all", "id5"),
    Case("event alone bigger than the limit", PER_SET, WEB, event("id0", "id1"), "Hold",
         "approve-all", reason="the event alone impacts 2 VMs"),
    Case("own impact not double counted", PER_SET, replace(WEB, impacted=busy(e1=("id0",))),
         event("id0"), "Approve", "approve-all", "id0"),
    Case("own earlier impact gives way to its current Resources", PER_SET,
         replace(WEB, impacted=busy(e1=("id1",))), event("id0"), "Approve", "approve-all", "id0"),
    Case("a VM busy with this and another event counts once", PER_SET,
         replace(WEB, impacted=busy(e2=("id0",))), event("id0"), "Approve", "approve-all", "id0"),
    Case("25% of 4 is 1", QUARTER, WEB, event("id0"), "Approve", "approve-all", "id0"),
    Case("25% of 4: 2 is too many", QUARTER, WEB, event("id0", "id1"), "Hold", "approve-all"),
    Case("25% of 1 rounds to 0 but allows 1", QUARTER, WEB, event("id4"), "Approve",
         "approve-all", "id4"),
    Case("50% of 5 is 2: one busy", HALF, replace(FIVE, impacted=busy(e2=("id1",))),
         event("id0"), "Approve", "approve-all", "id0"),
    Case("50% of 5 is 2: two busy", HALF, replace(FIVE, impacted=busy(e2=("id1",), e3=("id2",))),
         event("id0"), "Defer", "approve-all", reason="2 of 5 VMs impacted"),
    Case("tag group busy", PER_TIER, replace(TIERS, impacted=busy(e2=("id1",))), event("id0"),
         "Defer", "approve-all", reason="TIER=db"),
    Case("other tag group busy", PER_TIER, replace(TIERS, impacted=busy(e2=("id2",))),
         event("id0"), "Approve", "approve-all", "id0"),
    Case("untagged VM not limited", PER_TIER, replace(TIERS, impacted=busy(e2=("id1",))),
         event("id3"), "Approve", "approve-all", "id3"),
    Case("same fault domain busy", PER_FD, replace(WEB, impacted=busy(e2=("id2",))),
         event("id0"), "Defer", "approve-all", reason="fault domain 0"),
    Case("other fault domain busy", PER_FD, replace(WEB, impacted=busy(e2=("id1",))),
         event("id0"), "Approve", "approve-all", "id0"),
    Case("fault domains are per scale set", PER_FD, replace(FD0, impacted=busy(e2=("id1",))),
         event("id0"), "Approve", "approve-all", "id0"),
    Case("fault domains are per resource group", PER_FD,
         replace(FD0, impacted=busy(e2=("id3",))), event("id2"), "Approve", "approve-all", "id2"),
    Case("availability set fault domain busy", PER_FD, replace(FD0, impacted=busy(e2=("id4",))),
         event("id2"), "Defer", "approve-all", reason="rg/availability set/fault domain 0"),
    Case("one VM in each fault domain", PER_FD, WEB, event("id0", "id1"), "Approve",
         "approve-all", "id0"),
    Case("unresolved names count against the fleet", FLEET_ONE, WEB,
         event("id0", unresolved=("ghost",), unknown=("ghost",)), "Hold", "approve-all"),
    Case("an unknown name counts in every group (worst case)", PER_SET, WEB,
         event("id4", unresolved=("ghost",), unknown=("ghost",)), "Hold", "approve-all"),
    Case("another event's unknown name is busy in every group", PER_SET,
         replace(WEB, impacted=busy(e2=("ghost",))), event("id4"), "Defer", "approve-all",
         reason="api has 1 of 1"),
    Case("an unknown name counts only where its reporters' scope can hold it", PER_SET, WEB_S,
         event("id4", unresolved=("ghost",), unknown=("ghost",), scopes=(WEB_SCOPE,)),
         "Approve", "approve-all", "id4"),
    Case("an unknown name of a set's own scope is one more of the set", PER_SET, WEB_S,
         event("id4", unresolved=("ghost",), unknown=("ghost",), scopes=(API_SCOPE,)),
         "Hold", "approve-all"),
    Case("another event's unknown name is busy only where its scopes reach", PER_SET,
         replace(WEB_S, impacted=busy(e2=("ghost",)), reach={"e2": frozenset({WEB_SCOPE})}),
         event("id4"), "Approve", "approve-all", "id4"),
    Case("another event's unknown name is busy in its scopes' groups", PER_SET,
         replace(WEB_S, impacted=busy(e2=("ghost",)), reach={"e2": frozenset({WEB_SCOPE})}),
         event("id0"), "Defer", "approve-all", reason="web has 1 of 4"),
    Case("a lapsed name counts no more", PER_SET, WEB,
         event("id4", unresolved=("ghost",), lapsed=("ghost",)), "Approve", "approve-all", "id4"),
    Case("an ambiguous name counts as each VM it may be", PER_SET,
         replace(WEB, impacted=busy(e2=("id1",))),
         event("id4", unresolved=("web_0",), possible=("id0",)), "Defer", "approve-all",
         reason="web has 1 of 4"),
    Case("budgets apply after the rule", replace(PER_SET, rules=(HOLD_ALL,)), WEB,
         event("id0", "id1"), "Hold", "everything-else", reason="rule everything-else holds"),
]  # fmt: skip


def stale(n: int, **fields: object) -> VmView:
    return vm(n, last_seen=NOW - timedelta(minutes=12), **fields)


TARGET_CASES = [
    Case("affected reporter before a lower name", budgeted(),
         fleet(vm(0, name="z-affected"), vm(1, name="a-other")),
         event("id0", reporters=("id1", "id0")), "Approve", "approve-all", "id0",
         reason="through z-affected"),
    Case("other reporter when affected are dead", budgeted(), fleet(stale(0), vm(1)),
         event("id0", reporters=("id0", "id1")), "Approve", "approve-all", "id1"),
    Case("never seen is dead", budgeted(), fleet(vm(0, last_seen=None), vm(1)),
         event("id0", reporters=("id0", "id1")), "Approve", "approve-all", "id1"),
    Case("alive at exactly alive_within", budgeted(),
         fleet(vm(0, last_seen=NOW - timedelta(minutes=11))), event("id0"), "Approve",
         "approve-all", "id0"),
    Case("tried VMs skipped", budgeted(), fleet(vm(0), vm(1), vm(2)),
         event("id0", "id1", reporters=("id0", "id1", "id2"), tried=("id0",)), "Approve",
         "approve-all", "id1"),
    Case("affected by name among equals", budgeted(), fleet(vm(0, name="b"), vm(1, name="A")),
         event("id0", "id1"), "Approve", "approve-all", "id1"),
    Case("all tried", budgeted(), fleet(vm(0), vm(1)),
         event("id0", reporters=("id0", "id1"), tried=("id0", "id1")), "Defer", "approve-all",
         reason="no live VM"),
    Case("reporter unknown to the fleet, named VM not live", budgeted(), fleet(stale(0)),
         event("id0", reporters=("id9",)), "Defer", "approve-all"),
    # Issue 27: a neighbour's report read first must not make a neighbour (which reads its
    # queue every 10 s) the carrier while the VM the event names is alive.
    Case("live named VM before a reporting neighbour", budgeted(), fleet(vm(0), vm(1)),
         event("id0", reporters=("id1",)), "Approve", "approve-all", "id0",
         reason="through vm0"),
    Case("affected reporter before a live named VM", budgeted(),
         fleet(vm(0, name="a"), vm(1, name="b")),
         event("id0", "id1", reporters=("id1",)), "Approve", "approve-all", "id1"),
    Case("named VM that never reported, past the grace", budgeted(), fleet(vm(0), vm(1)),
         event("id0", reporters=("id1",), first_seen=NOW - UNREPORTED_CARRIER_WITHIN
               - timedelta(seconds=1)), "Approve", "approve-all", "id1"),
    Case("named VM already tried", budgeted(), fleet(vm(0), vm(1)),
         event("id0", reporters=("id1",), tried=("id0",)), "Approve", "approve-all", "id1"),
    Case("no reporters, named VM not live", budgeted(), fleet(stale(0)),
         event("id0", reporters=()), "Defer", "approve-all"),
]  # fmt: skip

ALL = DEFAULT_CASES + VM_CASES + READY_CASES + WINDOW_CASES + BUDGET_CASES + TARGET_CASES


@pytest.mark.parametrize("case", ALL, ids=[c.name for c in ALL])
def test_evaluate(case: Case) -> None:
    check(case)


def test_case_names_are_unique() -> None:
    assert len({c.name for c in ALL}) == len(ALL)


def test_evaluate_is_pure() -> None:
    case = BUDGET_CASES[1]
    first = evaluate(case.policy, case.fleet, case.event, case.now)
    assert all(evaluate(case.policy, case.fleet, case.event, case.now) == first for _ in range(3))


@pytest.mark.parametrize(
    ("group", "fields"),
    [
        ("scale_set", {"scale_set": "web"}),
        ("resource_group", {}),
        ("zone", {"zone": "1"}),
        ("fault_domain", {"scale_set": "web", "fault_domain": 0}),
        ("node_pool", {"node_pool": "nodepool1"}),
    ],
)
def test_a_group_of_the_same_name_in_another_subscription_is_another_group(
    group: str, fields: dict[str, object]
) -> None:
    """Resource group names repeat across subscriptions (rg-prod in each), and a zone number
    is each subscription's own mapping: five VMs of `web` in rg in one subscription and five
    in another are two groups of five. Found by the fleet load generator (issue 15): 20% of a
    merged group of ten let two VMs of one real scale set of five under maintenance."""
    a = [vm(n, subscription_id="sub-a", **fields) for n in range(5)]
    b = [vm(n, subscription_id="sub-b", **fields) for n in range(5, 10)]
    budget = Budget("twenty-percent", group, max_percent=20)
    policy = with_rules(APPROVE_ALL, budgets=(budget,))
    busy = fleet(*a, *b, impacted={"e0": frozenset({"id1"})})  # one VM of sub-a's group
    verdict = evaluate(policy, busy, event("id0"), NOW)
    assert verdict.kind == "Defer"
    # The other subscription's group of the same name still has its slot.
    assert evaluate(policy, busy, event("id5"), NOW).kind == "Approve"


AVAILABILITY_SET = ("s", "rg", None)


@pytest.mark.parametrize(
    ("kind", "member", "scope", "holds"),
    [
        ("fleet", vm(0, subscription_id="t"), AVAILABILITY_SET, True),
        ("tag:tier", vm(0, subscription_id="t"), AVAILABILITY_SET, True),
        ("zone", vm(0, subscription_id="s", resource_group="rg2", zone="1"), AVAILABILITY_SET,
         True),
        ("zone", vm(0, subscription_id="t", zone="1"), AVAILABILITY_SET, False),
        ("resource_group", vm(0, subscription_id="s", scale_set="web"), AVAILABILITY_SET, True),
        ("resource_group", vm(0, subscription_id="s", resource_group="RG2"), AVAILABILITY_SET,
         False),
        ("resource_group", vm(0, subscription_id="t"), AVAILABILITY_SET, False),
        ("scale_set", vm(0, subscription_id="s", scale_set="Web"), ("s", "rg", "web"), True),
        ("scale_set", vm(0, subscription_id="s", scale_set="web"), AVAILABILITY_SET, False),
        ("scale_set", vm(0, subscription_id="s", scale_set="api"), ("s", "rg", "web"), False),
        ("fault_domain", vm(0, subscription_id="s", fault_domain=0), AVAILABILITY_SET, True),
        ("fault_domain", vm(0, subscription_id="s", scale_set="web", fault_domain=0),
         AVAILABILITY_SET, False),
        ("update_domain", vm(0, subscription_id="s", scale_set="web", update_domain=1),
         ("s", "rg", "web"), True),
        ("update_domain", vm(0, subscription_id="t", scale_set="web", update_domain=1),
         ("s", "rg", "web"), False),
        # A reporter whose identity is not known yet: the name may be anywhere.
        ("scale_set", vm(0, subscription_id="t", scale_set="web"), (None, None, None), True),
    ],
)  # fmt: skip
def test_a_group_holds_a_name_no_vm_is_known_by_only_from_the_scopes_it_can_be_in(
    kind: str, member: VmView, scope: Scope, holds: bool
) -> None:
    assert can_hold(kind, member, [scope]) is holds
    assert can_hold(kind, member, []) is True  # no reporter known: anywhere


def test_a_node_pool_is_its_scale_sets_aks_pool_or_else_its_scale_set() -> None:
    tagged = vm(0, subscription_id="s", scale_set="aks-pool1-vmss", node_pool="pool9",
                tags={"aks-managed-poolName": "pool1"})  # fmt: skip
    assert group_key("node_pool", tagged) == "s/rg/aks-pool1-vmss/pool pool1"
    # Within a scale set a heartbeat's pool chooses nothing (issue 37).
    pooled = vm(3, subscription_id="s", scale_set="aks-pool1-vmss", node_pool="pool1")
    assert group_key("node_pool", pooled) == "s/rg/aks-pool1-vmss"
    bare = vm(1, subscription_id="s", scale_set="aks-pool1-vmss")
    assert group_key("node_pool", bare) == group_key("scale_set", bare) == "s/rg/aks-pool1-vmss"
    assert group_key("node_pool", vm(2, subscription_id="s")) is None


# --- drains (issue 30) -----------------------------------------------------------------------


def node(n: int, **fields: object) -> VmView:
    """A VM whose agent drains its node `aks-n` on a grant."""
    return vm(n, node_name=f"aks-{n}", node_pool="pool1", prepare_hook=True, **fields)


WHEN_READY_THEN_APPROVE = Rule(
    "when-ready",
    Match(),
    Action("approve_when_ready", deadline=timedelta(minutes=5), on_deadline="approve"),
)


@pytest.mark.parametrize("rule", [APPROVE_ALL, WHEN_READY_THEN_APPROVE])
def test_every_approving_action_waits_for_a_drain_granted_first(rule: Rule) -> None:
    nodes = fleet(node(0), vm(1, prepare_hook=False))
    policy = with_rules(rule)
    first = evaluate(policy, nodes, event("id0", "id1"), NOW)
    assert (first.kind, first.grant) == ("Defer", ("id0",))
    assert first.reason == "drain granted on aks-0; waiting for it"
    granted = event("id0", "id1", granted=frozenset({"id0"}))
    later = evaluate(policy, nodes, granted, NOW + timedelta(minutes=10))  # past the deadline
    assert (later.kind, later.grant) == ("Defer", ())
    assert "drain not finished on aks-0" in later.reason
    drained = replace(granted, ready=frozenset({"id0"}))
    assert evaluate(policy, nodes, drained, NOW).kind == "Approve"


def test_a_drain_is_not_granted_outside_the_window_nor_past_a_full_budget() -> None:
    closed = Rule("nights", Match(), Action("approve_in_window", windows=(
        Window(frozenset(range(7)), time(1, 0), time(2, 0)),)))  # fmt: skip
    nodes = fleet(node(0), node(1), impacted={"other": frozenset({"id1"})})
    assert evaluate(with_rules(closed), nodes, event("id0"), NOW).grant == ()
    pool = Budget("one-per-pool", "node_pool", max_vms=1)
    full = evaluate(with_rules(APPROVE_ALL, budgets=(pool,)), nodes, event("id0"), NOW)
    assert (full.kind, full.grant) == ("Defer", ())
    assert "drain not granted yet on aks-0" in "\n".join(full.explanation)


def test_a_spot_eviction_and_a_refused_grant_wait_for_no_drain() -> None:
    nodes = fleet(node(0))
    assert evaluate(with_rules(APPROVE_ALL), nodes, event(event_type="Preempt"), NOW).kind == (
        "Approve"
    )
    refused = event(granted=frozenset({"id0"}), no_drain=frozenset({"id0"}))
    assert evaluate(with_rules(APPROVE_ALL), nodes, refused, NOW).kind == "Approve"
    # approve_when_ready takes it as a VM without a prepare hook: held with on_deadline hold.
    hold = with_rules(Rule("ready", Match(), Action("approve_when_ready")))
    verdict = evaluate(hold, nodes, refused, NOW)
    assert verdict.kind == "Hold"
    assert "vm0 refused the drain (Prepare)" in verdict.reason


def test_a_drain_that_ended_without_the_node_ready_holds_the_event() -> None:
    gave_up = DrainView("GaveUp", NOW, failed=True)
    held = event(granted=frozenset({"id0"}), drains={"id0": gave_up})
    verdict = evaluate(with_rules(APPROVE_ALL), fleet(node(0)), held, NOW)
    assert verdict.kind == "Hold"
    assert verdict.reason.startswith("the drain on aks-0 ended without the node ready")


def test_a_blocked_drain_names_its_node_time_pods_and_pdbs() -> None:
    blockers = (Blocker("shop", "web-1", "EvictionRefused", "web-pdb"),
                Blocker("shop", "batch-7", "WaitingForCompletion"))  # fmt: skip
    blocked = DrainView("Blocked", NOW, NOW - timedelta(minutes=4), blockers)
    view = event(granted=frozenset({"id0"}), drains={"id0": blocked})
    verdict = evaluate(with_rules(APPROVE_ALL), fleet(node(0)), view, NOW)
    assert verdict.reason == "waiting for drains: drain blocked on aks-0"
    assert ("drain on aks-0 blocked 4 min: pod shop/web-1 (PDB web-pdb refused eviction), "
            "pod shop/batch-7 (WaitingForCompletion)") in verdict.explanation  # fmt: skip


def _arm(fleet_view: FleetView) -> FleetView:
    return replace(fleet_view, last_resort=True)


ARM_CASES = [
    # Issue 36: ARM's acknowledge only when no live agent can carry it, and once.
    Case("a live reporter before ARM", budgeted(), _arm(fleet(vm(0))),
         event("id0", azure="Scheduled"), "Approve", "approve-all", "id0"),
    Case("no live agent: ARM", budgeted(), _arm(fleet(stale(0))),
         event("id0", reporters=(), azure="Scheduled"), "Approve", "approve-all", ARM_CARRIER,
         reason="ARM's acknowledge"),
    Case("every agent tried: ARM", budgeted(), _arm(fleet(vm(0), vm(1))),
         event("id0", reporters=("id0", "id1"), tried=("id0", "id1"), azure="Scheduled"),
         "Approve", "approve-all", ARM_CARRIER),
    Case("ARM tried: deferred", budgeted(), _arm(fleet(stale(0))),
         event("id0", reporters=(), tried=(ARM_CARRIER,), azure="Scheduled"), "Defer",
         "approve-all", reason="no live VM"),
    Case("Event Grid never told of it: no ARM", budgeted(), _arm(fleet(stale(0))),
         event("id0", reporters=()), "Defer", "approve-all"),
    Case("ARM off: deferred", budgeted(), fleet(stale(0)),
         event("id0", reporters=(), azure="Scheduled"), "Defer", "approve-all"),
]  # fmt: skip


@pytest.mark.parametrize("case", ARM_CASES, ids=[c.name for c in ARM_CASES])
def test_arm_is_the_carrier_of_last_resort(case: Case) -> None:
    check(case)

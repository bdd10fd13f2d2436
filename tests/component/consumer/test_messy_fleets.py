"""The consumer on fleets as they are: names that repeat across resource groups, VMs that are
deleted, Resources that grow after approval, clocks that lie, records that break a decision.

Each test drives the real consumer core over a real SQLite state (issue 14, one per case).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bridge.channels.local import LocalSender
from bridge.commands.message import resources_digest
from bridge.consumer import documents as fs
from bridge.policy.model import DEFAULT_POLICY, Action, Budget, Match, Policy, Rule
from bridge.records import iso
from tests.component.consumer.test_caches import CostlyFeed
from tests.component.consumer.test_core import E1, E2, Rig
from tests.support.records import assert_valid

E3 = "B2C3D4E5-0000-4000-8000-000000000003"
E4 = "C3D4E5F6-0000-4000-8000-000000000004"
APPROVE_ALL = Rule("all", Match(), Action("approve"))


# The orders in which the twins are first heard: the last one heard of a name won it before.
ORDERS = {
    True: ("stage-0", "stage-1", "prod-0", "prod-1"),
    False: ("prod-0", "prod-1", "stage-0", "stage-1"),
    "mixed": ("stage-0", "prod-0", "prod-1", "stage-1"),
}


def twin_scale_sets(rig: Rig, *, stage_first: bool | str) -> list[dict[str, Any]]:
    """Scale sets called web in rg-prod and rg-stage, with instances web_0 and web_1 in both."""
    batch = []
    for handle in ORDERS[stage_first]:
        where, n = handle.split("-")
        rig.fleet.vm(f"web_{n}", scale_set="web", resource_group=f"rg-{where}", handle=handle)
        batch.append(rig.fleet.heartbeat(handle))
    return batch


# --- 1. a name is resolved in the scope the platform gives it --------------------------------


@pytest.mark.parametrize("stage_first", [True, False])
def test_a_rule_for_one_resource_group_never_approves_an_event_of_another(
    tmp_path: Path, stage_first: bool
) -> None:
    policy = Policy(
        rules=(
            Rule("stage-only", Match(resource_groups=frozenset({"rg-stage"})), Action("approve")),
            Rule("rest", Match(), Action("hold")),
        )
    )
    rig = Rig(tmp_path / "fleet.db", policy)
    batch = twin_scale_sets(rig, stage_first=stage_first)
    # The platform sends a scale set's event to its instances: prod's VMs report prod's web_0.
    batch += [rig.fleet.event(f"prod-{n}", E1, source="Platform") for n in (0, 1)]
    rig.consumer.process(batch)
    assert rig.sender.sent == []
    assert rig.actions() == [("Hold", "rest")]


@pytest.mark.parametrize("stage_first", [True, False, "mixed"])
def test_a_scale_set_budget_counts_the_instances_of_the_right_scale_set(
    tmp_path: Path, stage_first: bool | str
) -> None:
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("one", "scale_set", max_vms=1),))
    rig = Rig(tmp_path / "fleet.db", policy)
    batch = twin_scale_sets(rig, stage_first=stage_first)
    batch += [rig.fleet.event("prod-0", E1, resources=["web_0"])]
    rig.fleet.advance(1)
    batch += [rig.fleet.event("prod-1", E2, resources=["web_1"])]
    rig.consumer.process(batch)
    assert [c.event_id for c in rig.sender.sent] == [E1]
    assert rig.sender.sent[0].vm_id == rig.fleet.vm_id("prod-0")
    assert rig.actions() == [("Approve", "all"), ("Defer", "all")]


def test_a_name_that_matches_several_vms_is_unresolved_and_fails_closed(tmp_path: Path) -> None:
    policy = Policy(
        rules=(
            Rule("prod", Match(resource_groups=frozenset({"rg-prod"})), Action("approve")),
            Rule("rest", Match(), Action("hold")),
        )
    )
    rig = Rig(tmp_path / "fleet.db", policy)
    batch = twin_scale_sets(rig, stage_first=True)
    # Reporters in both scale sets (a forged or misrouted record): web_0 is two VMs.
    batch += [rig.fleet.event("prod-0", E1), rig.fleet.event("stage-0", E1)]
    rig.consumer.process(batch)
    assert rig.sender.sent == []
    assert rig.actions() == [("Hold", "rest")]


def test_budgets_count_every_vm_an_ambiguous_name_may_be(tmp_path: Path) -> None:
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("one", "scale_set", max_vms=1),))
    rig = Rig(tmp_path / "fleet.db", policy)
    batch = twin_scale_sets(rig, stage_first=True)
    batch += [rig.fleet.event("prod-0", E1), rig.fleet.event("stage-0", E1)]
    rig.fleet.advance(1)
    batch += [rig.fleet.event("stage-1", E2)]  # stage's web_1: its scale set's slot is taken
    rig.consumer.process(batch)
    assert [c.event_id for c in rig.sender.sent] == [E1]
    assert rig.actions()[-1] == ("Defer", "all")


# --- 2. group sizes count live members; VMs gone for good are forgotten -----------------------


def test_max_percent_counts_live_members_only(tmp_path: Path) -> None:
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("quarter", "scale_set", max_percent=25),))
    rig = Rig(tmp_path / "fleet.db", policy)
    for n in range(16):
        rig.fleet.vm(f"web_{n}", scale_set="web")
    rig.consumer.process([rig.fleet.heartbeat(f"web_{n}") for n in range(16)])
    rig.fleet.advance(86400)  # web_4 .. web_15 were deleted a day ago
    live = [rig.fleet.heartbeat(f"web_{n}") for n in range(4)]
    events = [E1, E2, E3, E4]
    rig.consumer.process(live + [rig.fleet.event(f"web_{n}", e) for n, e in enumerate(events)])
    assert len(rig.sender.sent) == 1


def test_vm_documents_of_vms_gone_past_the_retention_are_removed(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db", forget_vms_after=7 * 86400)
    rig.fleet.vm("web_0", scale_set="web")
    rig.fleet.vm("web_1", scale_set="web")
    rig.consumer.process([rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1")])
    rig.fleet.advance(6 * 86400)
    rig.consumer.process([rig.fleet.heartbeat("web_1")])
    rig.consumer.tick()
    assert rig.store.read(fs.VM, rig.fleet.vm_id("web_0")) is not None
    rig.fleet.advance(86400 + 60)
    rig.consumer.tick()
    assert rig.store.read(fs.VM, rig.fleet.vm_id("web_0")) is None
    assert rig.store.read(fs.VM, rig.fleet.vm_id("web_1")) is not None


# --- 3. a budget slot follows the event's Resources; the command binds them -----------------


def test_an_approved_event_that_grows_counts_its_new_vms(tmp_path: Path) -> None:
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("two", "scale_set", max_vms=2),))
    rig = Rig(tmp_path / "fleet.db", policy)
    for n in range(3):
        rig.fleet.vm(f"web_{n}", scale_set="web")
    rig.consumer.process([rig.fleet.heartbeat(f"web_{n}") for n in range(3)])
    rig.consumer.process([rig.fleet.event("web_0", E1, resources=["web_0"])])
    assert [c.event_id for c in rig.sender.sent] == [E1]
    assert rig.sender.sent[0].resources_digest == resources_digest(["web_0"])
    rig.fleet.advance(2)
    grown = ["web_0", "web_1"]
    rig.consumer.process([rig.fleet.event("web_0", E1, transition="Updated", resources=grown)])
    rig.fleet.advance(2)
    rig.consumer.process([rig.fleet.event("web_2", E2, resources=["web_2"])])
    assert [c.event_id for c in rig.sender.sent] == [E1]
    assert rig.actions()[-1] == ("Defer", "all")


# --- 4. a record from the future is clamped; staleness is the consumer's clock ---------------


def test_one_record_from_the_future_does_not_freeze_approvals(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("one", "fleet", max_vms=1),))
    rig = Rig(tmp_path / "fleet.db", policy)
    rig.consumer.process([*_two(rig), rig.fleet.event("web_0", E1)])
    assert [c.event_id for c in rig.sender.sent] == [E1]
    now = rig.fleet.now
    rig.fleet.advance(365 * 86400)  # a VM whose clock was a year ahead at boot
    future = rig.fleet.event("web_0", E1, transition="Started")
    rig.fleet.now = now
    with caplog.at_level(logging.WARNING):
        rig.consumer.process([future])
    assert "ahead of this consumer's clock" in caplog.text
    stored = fs.event_document(rig.store.read(fs.EVENT, fs.event_key(E1)))  # type: ignore[arg-type]
    assert stored["updated"] <= iso(now + timedelta(minutes=5))
    rig.fleet.advance(120)
    rig.consumer.process([rig.fleet.event("web_0", E1, transition="Completed")])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event("web_1", E2)])
    assert [c.event_id for c in rig.sender.sent] == [E1, E2]


def test_a_vm_whose_clock_is_behind_is_alive_and_its_event_not_stale(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db")
    rig.fleet.vm("web_0")
    consumer_now = rig.fleet.now
    rig.fleet.advance(-7 * 3600)  # the VM's clock is seven hours behind
    batch = [rig.fleet.heartbeat("web_0"), rig.fleet.event("web_0", E1)]
    rig.fleet.now = consumer_now
    rig.consumer.process(batch)
    assert [c.event_id for c in rig.sender.sent] == [E1]
    rig.consumer.tick()
    assert rig.store.read(fs.EVENT, fs.event_key(E1)) is not None


# --- 5. one event that fails to be decided stops nothing else -------------------------------


def test_an_event_that_fails_to_be_decided_is_recorded_and_blocks_no_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rig = Rig(tmp_path / "fleet.db")
    rig.consumer.sender = rig.consumer.dispatch.sender = LocalSender(tmp_path / "channel")
    (tmp_path / "channel").mkdir(mode=0o700)
    bad = rig.fleet.vm("bad")
    rig.fleet.vm("good")
    batch = [rig.fleet.heartbeat("bad"), rig.fleet.heartbeat("good")]
    for record in batch[:1]:
        record["VmId"] = "x/../y"  # past the input check (driven directly): cannot name a channel
    early = rig.fleet.event("bad", E1, not_before=rig.fleet.now + timedelta(minutes=1))
    early["VmId"] = "x/../y"
    batch += [early, rig.fleet.event("good", E2)]
    with caplog.at_level(logging.ERROR):
        rig.consumer.process(batch)
        rig.consumer.tick()
    assert (tmp_path / "channel" / rig.fleet.vm_id("good")).is_dir()
    said = {(d["EventId"], d["DecisionAction"], d["DecisionRule"]): d for d in rig.decisions}
    assert (E2, "Approve", "user-initiated") in said
    failure = said[(E1, "Defer", "(error)")]
    assert "deciding the event failed" in failure["DecisionReason"]
    assert_valid(failure)
    assert "x/../y" in caplog.text
    assert "ERROR" in caplog.text
    assert bad


def test_a_lone_surrogate_in_a_name_breaks_no_decision(tmp_path: Path) -> None:
    rig = Rig(tmp_path / "fleet.db")
    rig.fleet.vm("web_0")
    rig.fleet.vm("web_1")
    beat = rig.fleet.heartbeat("web_0")
    beat["VmName"] = "web_\ud800"
    batch = [beat, rig.fleet.heartbeat("web_1")]
    event = rig.fleet.event("web_0", E1, not_before=rig.fleet.now + timedelta(minutes=1))
    event["Resources"] = ["web_\ud800"]
    batch += [event, rig.fleet.event("web_1", E2)]
    rig.consumer.process(batch)
    rig.consumer.tick()
    assert E2 in [c.event_id for c in rig.sender.sent]
    for decision in rig.decisions:
        if decision["EventId"] == E2:
            assert_valid(decision)


# --- 6. a slot whose VMs are all gone is released by a documented rule ----------------------


def test_an_event_whose_vms_never_come_back_releases_its_slot(tmp_path: Path) -> None:
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("one", "scale_set", max_vms=1),))
    rig = Rig(tmp_path / "fleet.db", policy)
    rig.consumer.process(_two(rig))
    preempt = rig.fleet.event("web_0", E1, transition="Started", event_type="Preempt",
                              source="Platform", duration=-1)  # fmt: skip
    rig.consumer.process([preempt])  # ... and web_0 is deleted: it never reports again
    for _ in range(13):  # thirteen minutes of web_1's heartbeats
        rig.fleet.advance(60)
        rig.consumer.process([rig.fleet.heartbeat("web_1")])
        rig.consumer.tick()
    rig.consumer.process([rig.fleet.event("web_1", E2)])
    assert [c.event_id for c in rig.sender.sent] == [E2]
    released = [d for d in rig.decisions if d["EventId"] == E1]
    assert [d["DecisionAction"] for d in released] == ["Release"]
    assert "no VM" in released[0]["DecisionReason"]
    assert_valid(released[0])


def test_an_event_whose_vm_still_heartbeats_keeps_its_slot(tmp_path: Path) -> None:
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("one", "scale_set", max_vms=1),))
    rig = Rig(tmp_path / "fleet.db", policy)
    rig.consumer.process(_two(rig))
    started = rig.fleet.event("web_0", E1, transition="Started", source="Platform")
    rig.consumer.process([started])
    for _ in range(13):
        rig.fleet.advance(60)
        rig.consumer.process([rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1")])
        rig.consumer.tick()
    rig.consumer.process([rig.fleet.event("web_1", E2)])
    assert rig.sender.sent == []


def _two(rig: Rig) -> list[dict[str, Any]]:
    rig.fleet.vm("web_0", scale_set="web")
    rig.fleet.vm("web_1", scale_set="web")
    return [rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1")]


def test_an_event_left_behind_by_a_deleted_reporter_is_released(tmp_path: Path) -> None:
    policy = Policy(rules=(APPROVE_ALL,), budgets=(Budget("one", "scale_set", max_vms=1),))
    rig = Rig(tmp_path / "fleet.db", policy)
    rig.consumer.process(_two(rig))
    # Both VMs of the set report the user's reboot of web_1; it is approved through web_1.
    reboot = [rig.fleet.event(n, E1, resources=["web_1"]) for n in ("web_0", "web_1")]
    rig.consumer.process(reboot)
    assert [c.event_id for c in rig.sender.sent] == [E1]
    rig.consumer.process([rig.fleet.approval(rig.sender.sent[0])])
    rig.fleet.advance(5)  # web_0 is deleted; web_1 reboots and reports the event gone
    rig.consumer.process([rig.fleet.event("web_1", E1, transition="Completed")])
    for _ in range(13):
        rig.fleet.advance(60)
        rig.consumer.process([rig.fleet.heartbeat("web_1")])
        rig.consumer.tick()
    rig.consumer.process([rig.fleet.event("web_1", E2)])
    assert [c.event_id for c in rig.sender.sent] == [E1, E2]
    [released] = [d for d in rig.decisions if d["DecisionAction"] == "Release"]
    assert "reported the event gone" in released["DecisionReason"]


def test_on_a_queried_store_the_hourly_sweep_reads_the_vms_it_keeps_not_all_of_them(
    tmp_path: Path,
) -> None:
    # Each sweep read every VM, each hour for each consumer: at 100,000 VMs the 6,250
    # entities of each `vm` partition in a burst of pages, past Table Storage's 2,000 a second.
    path = tmp_path / "fleet.db"
    rig = Rig(path)
    rig.store.close()
    rig.store = ours = CostlyFeed(path)
    week = 7 * 86400
    rig.consumer = rig.make(DEFAULT_POLICY, forget_vms_after=week)
    other = rig.make(DEFAULT_POLICY, forget_vms_after=week)
    names = ["web_0", "web_1", "web_2"]
    for name in names:
        rig.fleet.vm(name, scale_set="web")
    rig.consumer.process([rig.fleet.heartbeat(name) for name in names])
    rig.consumer.tick()
    other.tick()
    rig.fleet.advance(6 * 86400)
    rig.consumer.process([rig.fleet.heartbeat("web_1")])
    rig.fleet.advance(86400 + 60)
    other.tick()  # removes web_0 and web_2
    assert [rig.store.read(fs.VM, rig.fleet.vm_id(n)) is None for n in names] == [
        True, False, True
    ]  # fmt: skip
    rig.consumer.tick()  # finds them gone, and forgets them too
    assert set(rig.consumer.fleet.vms.load()) == {rig.fleet.vm_id("web_1")}
    assert ours.vm_scans == 0
    ours.close()


# --- 7. an unknown name counts where it can be; only VMs that can see an event release it ---

OTHER = "8d5f9c8e-0000-4000-8000-0000000000b2"  # a second subscription
SETS_AND_GROUPS = (Budget("one-per-set", "scale_set", max_vms=1),
                   Budget("one-per-group", "resource_group", max_vms=1))  # fmt: skip


def _two_subscriptions(rig: Rig) -> list[dict[str, Any]]:
    """Scale set web (web_0, web_1) in the first subscription, api (api_0, api_1) in the other."""
    for n in (0, 1):
        rig.fleet.vm(f"web_{n}", scale_set="web")
        rig.fleet.vm(f"api_{n}", scale_set="api", subscription=OTHER)
    return [rig.fleet.heartbeat(f"{s}_{n}") for s in ("web", "api") for n in (0, 1)]


def test_one_forged_started_record_naming_no_such_vm_freezes_no_other_subscription(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", Policy(rules=(APPROVE_ALL,), budgets=SETS_AND_GROUPS))
    rig.consumer.process(_two_subscriptions(rig))
    # One compromised VM of web, in its own name, says an event of no-such-vm has started.
    forged = rig.fleet.event("web_0", E1, transition="Started", source="Platform",
                             resources=["no-such-vm"])  # fmt: skip
    rig.consumer.process([forged])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event("api_0", E2), rig.fleet.event("web_1", E3)])
    # no-such-vm can only be a VM of web's scope: the other subscription's api is approved,
    # web's own next VM waits (no-such-vm may be one of web's instances without an agent).
    assert [c.event_id for c in rig.sender.sent] == [E2]
    assert {d["EventId"]: d["DecisionAction"] for d in rig.decisions} == {
        E2: "Approve", E3: "Defer"
    }  # fmt: skip


def test_a_started_event_of_a_partly_onboarded_availability_set_holds_only_its_own_groups(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", Policy(rules=(APPROVE_ALL,), budgets=SETS_AND_GROUPS))
    batch = _two_subscriptions(rig)
    # An availability set in rg-legacy: avs_0 runs an agent, avs_1 not yet.
    rig.fleet.vm("avs_0", resource_group="rg-legacy")
    rig.fleet.vm("avs_2", resource_group="rg-legacy")
    batch += [rig.fleet.heartbeat("avs_0"), rig.fleet.heartbeat("avs_2")]
    rig.consumer.process(batch)
    started = rig.fleet.event("avs_0", E1, transition="Started", source="Platform",
                              resources=["avs_1"])  # fmt: skip
    rig.consumer.process([started])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event("api_0", E2), rig.fleet.event("avs_2", E3),
                          rig.fleet.event("web_0", E4)])  # fmt: skip
    # avs_1 is a VM of rg-legacy: that group is full; web and api are not touched.
    assert sorted(c.event_id for c in rig.sender.sent) == sorted([E2, E4])
    assert [d["DecisionAction"] for d in rig.decisions if d["EventId"] == E3] == ["Defer"]


def test_a_record_that_keeps_repeating_an_unknown_name_holds_its_slot_for_an_hour_at_most(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", Policy(rules=(APPROVE_ALL,), budgets=SETS_AND_GROUPS))
    rig.consumer.process(_two_subscriptions(rig))
    later = rig.fleet.now + timedelta(hours=3)

    def forged() -> dict[str, Any]:
        return rig.fleet.event("web_0", E1, transition="Started", source="Platform",
                               resources=["no-such-vm"])  # fmt: skip

    rig.consumer.process([forged()])
    rig.consumer.process([rig.fleet.event("web_1", E3, not_before=later)])
    assert rig.sender.sent == []
    for _ in range(61):  # the forged record again every minute, the set's VMs alive
        rig.fleet.advance(60)
        beats = [rig.fleet.heartbeat(f"web_{n}") for n in (0, 1)]
        rig.consumer.process([*beats, forged()])
        rig.consumer.tick()
    assert [c.event_id for c in rig.sender.sent] == [E3]
    [released] = [d for d in rig.decisions if d["DecisionAction"] == "Release"]
    assert released["EventId"] == E1
    assert released["DecisionRule"] == "(released)"
    assert "no-such-vm" in released["DecisionReason"]
    assert_valid(released)


def test_a_vm_of_another_subscription_reporting_an_event_gone_releases_no_slot(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", Policy(rules=(APPROVE_ALL,), budgets=SETS_AND_GROUPS))
    rig.consumer.process(_two_subscriptions(rig))
    rig.consumer.process([rig.fleet.event("web_0", E1, event_type="Redeploy")])
    assert [c.event_id for c in rig.sender.sent] == [E1]
    rig.consumer.process([rig.fleet.approval(rig.sender.sent[0])])
    rig.fleet.advance(5)  # web_0 goes down for its redeploy, and is silent for a while
    rig.consumer.process([rig.fleet.event("web_0", E1, transition="Started")])
    rig.fleet.advance(5)
    # api_0, in the other subscription, says in its own name that web_0's event is gone.
    rig.consumer.process([rig.fleet.event("api_0", E1, transition="Completed",
                                          resources=["web_0"])])  # fmt: skip
    for _ in range(13):
        rig.fleet.advance(60)
        rig.consumer.process([rig.fleet.heartbeat(n) for n in ("web_1", "api_0", "api_1")])
        rig.consumer.tick()
    rig.consumer.process([rig.fleet.event("web_1", E2)])
    assert [c.event_id for c in rig.sender.sent] == [E1]
    assert [d["DecisionAction"] for d in rig.decisions if d["DecisionAction"] == "Release"] == []


def test_a_started_claim_of_another_subscription_read_first_does_not_keep_an_event_unapproved(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", Policy(rules=(APPROVE_ALL,), budgets=SETS_AND_GROUPS))
    rig.consumer.process(_two_subscriptions(rig))
    # api_0's claim that web_0's reboot has started is read before web_0's own report.
    claim = rig.fleet.event("api_0", E1, transition="Started", resources=["web_0"])
    rig.consumer.process([claim])
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event("web_0", E1)])
    rig.consumer.tick()
    assert [c.event_id for c in rig.sender.sent] == [E1]
    assert rig.sender.sent[0].vm_id == rig.fleet.vm_id("web_0")


def test_a_vm_of_another_subscription_cannot_rewrite_an_event_it_claims(tmp_path: Path) -> None:
    users_only = Policy(rules=DEFAULT_POLICY.rules, budgets=SETS_AND_GROUPS)
    rig = Rig(tmp_path / "fleet.db", users_only)
    rig.consumer.process(_two_subscriptions(rig))
    rig.consumer.process([rig.fleet.event("web_0", E1, source="Platform")])
    rig.fleet.advance(1)
    # api_0's newer record says the platform's reboot of web_0 is a user's reboot of api_1.
    rig.consumer.process([rig.fleet.event("api_0", E1, source="User", resources=["api_1"])])
    rig.consumer.tick()
    assert rig.sender.sent == []
    assert rig.actions() == [("Hold", "everything-else")]


# --- found in review (issue 27): a claim from another scope adds to what counts, never less ---


def test_a_vm_of_another_scope_naming_itself_frees_no_slot_of_an_agentless_vm(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db", Policy(rules=(APPROVE_ALL,), budgets=SETS_AND_GROUPS))
    rig.consumer.process(_two_subscriptions(rig))
    # web_9 (no agent yet) of scale set web is rebooted by the platform; web_0 reports it.
    rig.consumer.process([rig.fleet.event("web_0", E1, transition="Started", source="Platform",
                                          resources=["web_9"])])  # fmt: skip
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event("web_1", E3)])
    assert rig.sender.sent == []  # web_9 holds web's slot
    # api_0, another subscription, says in its own name that E1, naming api_0, completed.
    rig.fleet.advance(1)
    rig.consumer.process([rig.fleet.event("api_0", E1, transition="Completed",
                                          resources=["api_0"])])  # fmt: skip
    rig.fleet.advance(1)
    rig.consumer.tick()
    rig.consumer.process([rig.fleet.heartbeat("web_1")])
    rig.consumer.tick()
    # web_9 may still be down: nothing of web may be approved, and no slot was freed.
    assert rig.sender.sent == []
    assert "Release" not in [action for action, _ in rig.actions()]


def test_a_vm_that_names_a_new_resource_group_each_time_cannot_grow_an_event_for_ever(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path / "fleet.db")
    rig.fleet.vm("web_0", scale_set="web")
    rig.fleet.vm("web_1", scale_set="web")
    rig.consumer.process([rig.fleet.heartbeat("web_0"), rig.fleet.heartbeat("web_1")])
    rig.consumer.process([rig.fleet.event("web_1", E1, source="Platform")])
    names = [f"vm-{i:012d}" for i in range(3300)]  # a record just under MAX_RECORD_BYTES
    for n in range(12):
        rig.fleet.advance(1)
        record = rig.fleet.event("web_0", E1, source="Platform", resources=names)
        record["ResourceGroup"] = f"rg-{n}"
        record["RecordId"] = f"forged-{n}"
        rig.consumer.process([record])  # raised at the 8th: the document could not be written
    told = rig.store.read(fs.EVENT, fs.event_key(E1)).value["told"]  # type: ignore[union-attr]
    assert len(told) == 2  # web_1's scope, and web_0's latest

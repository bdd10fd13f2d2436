"""Issue 36: a budget still holds where every agent of a group is gone. Agent-less VMs' events,
told only by Event Grid, name VMs no agent reports (names no VM is known by); the group they
may be in counts them in the worst case even when none of its known members is alive any more
(the agents crashed, or the set was onboarded once and its agents removed). Found end to end
(tests/e2e/test_second_source.py): with both agents of a scale set of 4 stopped, ARM's
acknowledge carried two agent-less VMs' reboots at once under `max_vms: 1`."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from bridge.policy.budgets import check_budgets
from bridge.policy.model import Budget, EventView, FleetView, VmView

NOW = datetime(2026, 12, 2, 16, 0, tzinfo=timezone.utc)
WEB_SCOPE = ("s", "rg", "web")
ONE_PER_SET = (Budget("one-at-a-time", "scale_set", max_vms=1),)


def web(n: int, heard: timedelta) -> VmView:
    return VmView(vm_id=f"id{n}", name=f"web_{n}", resource_group="rg", location="westeurope",
                  subscription_id="s", scale_set="web", last_seen=NOW - heard)  # fmt: skip


def agentless(name: str) -> EventView:
    """A Scheduled reboot of `name`, a VM no agent reports, told by Event Grid only."""
    return EventView(
        event_id="e1", event_type="Reboot", event_source="User", duration=-1,
        status="Scheduled", not_before=NOW + timedelta(minutes=15),
        first_seen=NOW - timedelta(seconds=5), affected=(), unresolved=(name,),
        unknown=(name,), scopes=(WEB_SCOPE,), azure="Scheduled",
    )  # fmt: skip


def fleet(heard: timedelta) -> FleetView:
    """web_0 and web_1 had agents, last heard `heard` ago; web_3's reboot (a name) is busy."""
    return FleetView(
        vms={v.vm_id: v for v in (web(0, heard), web(1, heard))},
        impacted={"e2": frozenset({"web_3"})},
        reach={"e2": frozenset({WEB_SCOPE})},
    )


def test_an_agentless_vms_event_waits_for_anothers_while_the_agents_live() -> None:
    said = check_budgets(ONE_PER_SET, fleet(timedelta(minutes=1)), agentless("web_2"), NOW)
    assert said is not None
    assert said[0] == "Defer"


def test_it_still_waits_once_every_agent_of_its_group_is_silent() -> None:
    said = check_budgets(ONE_PER_SET, fleet(timedelta(hours=1)), agentless("web_2"), NOW)
    assert said is not None
    assert said[0] == "Defer"


def test_an_agentless_event_alone_fits_once_every_agent_is_silent() -> None:
    quiet = replace(fleet(timedelta(hours=1)), impacted={}, reach={})
    assert check_budgets(ONE_PER_SET, quiet, agentless("web_2"), NOW) is None


API = replace(web(9, timedelta(minutes=1)), name="api_0", scale_set="api")


def never_onboarded(busy: frozenset[tuple[str | None, str | None, str | None]]) -> FleetView:
    """No VM of the scale set web ever had an agent; web_3's reboot, reaching `busy`, is on."""
    return FleetView(vms={API.vm_id: API}, impacted={"e2": frozenset({"web_3"})},
                     reach={"e2": busy})  # fmt: skip


def test_a_set_no_agent_ever_reported_still_takes_one_at_a_time() -> None:
    said = check_budgets(ONE_PER_SET, never_onboarded(frozenset({WEB_SCOPE})), agentless("web_2"),
                         NOW)  # fmt: skip
    assert said is not None
    assert said[0] == "Defer"
    assert "no agent reports" in said[1]


def test_a_name_of_another_scope_does_not_hold_it() -> None:
    elsewhere = frozenset({("s", "rg", "db")})
    assert check_budgets(ONE_PER_SET, never_onboarded(elsewhere), agentless("web_2"), NOW) is None

"""How Event records change an event document: reporters by VmId, or by host before it."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from bridge.consumer import documents as fs
from bridge.consumer.drains import drain_views
from bridge.policy.model import VmView

E1 = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
NOW = datetime(2026, 11, 21, 10, 1, tzinfo=timezone.utc)


def event(status: str | None, at: str, *, vm_id: str | None, host: str = "web-0") -> dict[str, Any]:
    return {"RecordType": "Event", "EventId": E1, "EventType": "Reboot", "EventStatus": status,
            "TimeGenerated": at, "VmId": vm_id, "HostName": host}  # fmt: skip


def fold(*records: dict[str, Any]) -> fs.EventDocument:
    value: fs.EventDocument = {}
    for record in records:
        fs.merge_event(value, record)
    return value


def test_a_vm_that_does_not_know_its_vm_id_yet_still_holds_the_event() -> None:
    value = fold(
        event("Scheduled", "2026-11-21T10:00:00Z", vm_id="vm-0"),
        event("Scheduled", "2026-11-21T10:00:00Z", vm_id=None, host="web-1"),
        event(None, "2026-11-21T10:00:05Z", vm_id="vm-0"),
    )
    assert fs.status(value) == "Scheduled"  # still in web-1's document
    fs.merge_event(value, event(None, "2026-11-21T10:00:06Z", vm_id=None, host="web-1"))
    assert fs.status(value) == fs.GONE


def test_the_host_counts_until_it_reports_with_its_vm_id() -> None:
    value = fold(
        event("Scheduled", "2026-11-21T10:00:00Z", vm_id=None),
        event("Scheduled", "2026-11-21T10:00:01Z", vm_id=None, host="web-1"),
    )
    assert fs.active_reporters(value) == ("host:web-0", "host:web-1")
    fs.merge_event(value, event("Scheduled", "2026-11-21T10:00:02Z", vm_id="vm-0"))
    assert fs.active_reporters(value) == ("host:web-1", "vm-0")
    fs.merge_event(value, event(None, "2026-11-21T10:00:03Z", vm_id="vm-0"))
    fs.merge_event(value, event(None, "2026-11-21T10:00:03Z", vm_id=None, host="web-1"))
    assert fs.status(value) == fs.GONE


def heartbeat(at: str, **fields: Any) -> dict[str, Any]:
    return {"RecordType": "Heartbeat", "VmId": "vm-0", "VmName": "web-0", "TimeGenerated": at,
            "HeartbeatReason": "Periodic", **fields}  # fmt: skip


def test_a_vm_document_changes_only_for_a_newer_record_and_says_so() -> None:
    value: fs.VmDocument = {}
    assert fs.merge_vm(value, heartbeat("2026-11-21T10:00:05Z", Tags={"tier": "web"}))
    kept = dict(value)
    assert not fs.merge_vm(value, heartbeat("2026-11-21T10:00:05Z", VmName="other"))  # same time
    assert not fs.merge_vm(value, heartbeat("2026-11-21T10:00:01Z", VmName="other"))  # older
    assert not fs.merge_vm(value, {"RecordType": "Heartbeat", "TimeGenerated": 5})  # no time
    assert value == kept == {"last_seen": "2026-11-21T10:00:05Z", "name": "web-0",
                             "tags": {"tier": "web"}}  # fmt: skip
    assert fs.merge_vm(value, heartbeat("2026-11-21T10:00:09Z", HeartbeatReason="Stop"))
    assert value["stopped"] == "2026-11-21T10:00:09Z"
    assert fs.merge_vm(value, heartbeat("2026-11-21T10:00:12Z", PlatformFaultDomain="2"))
    assert "stopped" not in value  # back after a stop
    assert "fault_domain" not in value  # a field of the wrong type is taken as absent


def test_two_scopes_that_each_have_the_vm_and_tell_the_event_otherwise_fail_closed() -> None:
    def vm(vm_id: str, group: str) -> VmView:
        return VmView(vm_id, "web_0", "sub", group, scale_set="web", last_seen=NOW)

    def told(vm: VmView, source: str, due: str) -> dict[str, Any]:
        record = event("Scheduled", "2026-11-21T10:00:00Z", vm_id=vm.vm_id)
        record.update(SubscriptionId="sub", ResourceGroup=vm.resource_group,
                      VmScaleSetName="web", Resources=["web_0"], EventSource=source,
                      NotBefore=due)  # fmt: skip
        return record

    vms = {"prod": vm("prod", "rg-prod"), "stage": vm("stage", "rg-stage")}
    value = fold(told(vms["prod"], "Platform", "2026-11-21T10:15:00Z"),
                 told(vms["stage"], "User", "2026-11-21T10:05:00Z"))  # fmt: skip
    view = fs.event_view(value, vms, fs.Names.of(vms.values()), (), NOW)
    assert (view.event_type, view.event_source) == ("Reboot", None)  # they agree on the type only
    assert view.not_before == datetime(2026, 11, 21, 10, 5, tzinfo=timezone.utc)
    assert view.possible == ("prod", "stage")
    assert set(view.reporters) == {"prod", "stage"}


# --- Kubernetes nodes (issue 30) -------------------------------------------------------------


def test_a_heartbeat_names_the_node_and_its_pool_until_one_does_not() -> None:
    value: fs.VmDocument = {}
    fs.merge_vm(value, heartbeat("2026-11-21T10:00:05Z", HasPrepareHook=True, NodeName="aks-0",
                                 NodePool="pool1", NodeCordoned=True))  # fmt: skip
    view = fs.vm_view("vm-0", value)
    assert (view.node_name, view.node_pool, view.cordoned) == ("aks-0", "pool1", True)
    assert view.drains_on_grant
    # An agent without [kubernetes] (or one from before it) says nothing of a node.
    fs.merge_vm(value, heartbeat("2026-11-21T10:00:06Z", HasPrepareHook=True, NodeName=None))
    view = fs.vm_view("vm-0", value)
    assert (view.node_name, view.node_pool, view.cordoned) == (None, None, False)
    assert not view.drains_on_grant


def test_a_restarted_agent_that_has_not_read_its_node_yet_keeps_its_pool_and_cordon() -> None:
    value: fs.VmDocument = {}
    fs.merge_vm(value, heartbeat("2026-11-21T10:00:05Z", HasPrepareHook=True, NodeName="aks-0",
                                 NodePool="pool1", NodeCordoned=True))  # fmt: skip
    fs.merge_vm(value, heartbeat("2026-11-21T10:00:06Z", HasPrepareHook=True, NodeName="aks-0",
                                 NodePool=None, NodeCordoned=None))  # fmt: skip
    view = fs.vm_view("vm-0", value)
    assert (view.node_name, view.node_pool, view.cordoned) == ("aks-0", "pool1", True)
    # Once it has read the node, what it says holds.
    fs.merge_vm(value, heartbeat("2026-11-21T10:00:07Z", HasPrepareHook=True, NodeName="aks-0",
                                 NodePool="pool2", NodeCordoned=False))  # fmt: skip
    view = fs.vm_view("vm-0", value)
    assert (view.node_pool, view.cordoned) == ("pool2", False)


def drain(status: str, at: str, *, code: int | None = None, **fields: Any) -> dict[str, Any]:
    return {"RecordType": "Hook", "EventId": E1, "VmId": "vm-0", "TimeGenerated": at,
            "HookPhase": "prepare", "HookName": "drain", "DrainStatus": status,
            "HookExitCode": code, "HookTimedOut": status == "GaveUp", **fields}  # fmt: skip


BLOCKER = {"Namespace": "shop", "Pod": "web-1", "Reason": "EvictionRefused",
           "PodDisruptionBudget": "web-pdb"}  # fmt: skip


def test_a_drain_in_progress_is_not_a_failed_prepare_and_keeps_when_it_got_blocked() -> None:
    value = fold(
        drain("Draining", "2026-11-21T10:00:00Z"),
        drain("Blocked", "2026-11-21T10:01:00Z", DrainBlockers=[BLOCKER]),
        drain("Blocked", "2026-11-21T10:02:00Z", DrainBlockers=[BLOCKER]),
        drain("Draining", "2026-11-21T10:00:30Z"),  # older, read late: changes nothing
    )
    assert value.get("ready", []) == []
    found = drain_views(value.get("drains"))["vm-0"]
    assert (found.status, found.failed) == ("Blocked", False)
    assert found.blocked_since == datetime(2026, 11, 21, 10, 1, tzinfo=timezone.utc)
    assert [(b.namespace, b.pod, b.pdb) for b in found.blockers] == [("shop", "web-1", "web-pdb")]
    fs.merge_event(value, drain("Drained", "2026-11-21T10:03:00Z", code=0))
    assert value["ready"] == ["vm-0"]
    assert drain_views(value.get("drains"))["vm-0"].blocked_since is None


def test_a_drain_that_gave_up_is_ready_with_approve_and_failed_with_hold() -> None:
    approve = fold(drain("GaveUp", "2026-11-21T10:00:00Z", code=0))
    assert approve["ready"] == ["vm-0"]
    hold = fold(drain("GaveUp", "2026-11-21T10:00:00Z", code=1))
    assert hold.get("ready", []) == []
    assert drain_views(hold.get("drains"))["vm-0"].failed

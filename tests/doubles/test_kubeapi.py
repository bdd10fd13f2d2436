"""The Kubernetes API double, driven by the real lightkube client (through LightkubeApi and
directly): what it serves, the behaviours the drain tests rely on, and its strictness."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError, Client, KubeConfig
from lightkube.resources.core_v1 import Node as NodeResource
from lightkube.resources.core_v1 import Pod as PodResource
from lightkube.types import PatchType

from bridge.kubernetes.api import Conflict, NodeMissing, Refusal, Unreachable
from bridge.kubernetes.client import LightkubeApi
from tests.doubles.kubeapi import KubeApiDouble, merge_patch
from tests.support.wait import eventually


@pytest.fixture
def kube() -> Iterator[KubeApiDouble]:
    with KubeApiDouble() as double:
        double.add_node("n1", labels={"kubernetes.azure.com/agentpool": "pool1"})
        yield double


@pytest.fixture
def api(kube: KubeApiDouble, tmp_path: Path) -> Iterator[LightkubeApi]:
    client = LightkubeApi(kube.kubeconfig(tmp_path))
    yield client
    client.close()


def test_nodes_are_read_and_merge_patched_with_a_resource_version(
    kube: KubeApiDouble, api: LightkubeApi
) -> None:
    node = api.node("n1")
    assert node.labels == {"kubernetes.azure.com/agentpool": "pool1"}
    patched = api.patch_node(
        "n1",
        {"spec": {"unschedulable": True}, "metadata": {"resourceVersion": node.resource_version}},
    )
    assert patched.unschedulable
    with pytest.raises(Conflict):  # the version read before the patch is stale now
        api.patch_node("n1", {"metadata": {"resourceVersion": node.resource_version}})
    assert kube.calls("PATCH")[0].content_type == "application/merge-patch+json"
    with pytest.raises(NodeMissing):
        api.node("n2")


def test_pods_are_listed_by_node_and_budgets_by_namespace(
    kube: KubeApiDouble, api: LightkubeApi
) -> None:
    kube.add_node("n2")
    kube.add_pod("shop", "web-1", "n1", labels={"app": "web"}, owner="ReplicaSet", priority=7)
    kube.add_pod("shop", "bare", "n1", owner=None)
    kube.add_pod("shop", "web-2", "n2")
    kube.add_budget("shop", "web-pdb", {"app": "web"})
    pods = api.pods("n1")
    assert [(p.key, p.controller, p.priority) for p in pods] == [
        ("shop/bare", None, 0),
        ("shop/web-1", "ReplicaSet", 7),
    ]
    assert kube.calls("GET", "/api/v1/pods")[0].query["fieldSelector"] == "spec.nodeName=n1"
    assert [(b.name, dict(b.match_labels)) for b in api.budgets("shop")] == [
        ("web-pdb", {"app": "web"})
    ]


def test_an_eviction_is_refused_with_429_while_its_budget_allows_none(
    kube: KubeApiDouble, api: LightkubeApi
) -> None:
    kube.add_pod("shop", "web-1", "n1", labels={"app": "web"})
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    pod = api.pods("n1")[0]
    refusal = api.evict(pod)
    assert isinstance(refusal, Refusal)
    assert refusal.budget == "web-pdb"
    assert kube.pods("n1") == ["shop/web-1"]
    kube.allow("web-pdb", 1)
    assert api.evict(pod) is None
    assert kube.pods("n1") == []
    assert api.evict(pod) is None  # gone already: no error
    eviction = kube.calls("POST", "/pods/web-1/eviction")[0]
    assert eviction.body["kind"] == "Eviction"
    assert eviction.body["apiVersion"] == "policy/v1"


def test_a_slow_pod_terminates_after_its_linger(kube: KubeApiDouble, api: LightkubeApi) -> None:
    kube.add_pod("shop", "slow", "n1", linger=0.3)
    api.evict(api.pods("n1")[0])
    assert api.pods("n1")[0].terminating
    eventually(lambda: kube.pods("n1") == [])


def test_a_delete_takes_its_grace_period(kube: KubeApiDouble, api: LightkubeApi) -> None:
    kube.add_pod("shop", "slow", "n1", linger=3600)
    api.delete(api.pods("n1")[0], 0)
    assert kube.pods("n1") == []
    assert kube.calls("DELETE")[0].query["gracePeriodSeconds"] == "0"


def test_down_refuses_connections_and_up_serves_again(
    kube: KubeApiDouble, api: LightkubeApi
) -> None:
    kube.down()
    with pytest.raises(Unreachable):
        api.node("n1")
    kube.up()
    assert api.node("n1").name == "n1"


def test_it_is_strict_about_what_it_does_not_serve(kube: KubeApiDouble, tmp_path: Path) -> None:
    client = Client(KubeConfig.from_file(kube.kubeconfig(tmp_path)), trust_env=False)
    with pytest.raises(ApiError) as listed:
        client.list(PodResource, namespace="*", labels={"app": "web"}).__iter__().__next__()
    assert listed.value.status.code == 400
    with pytest.raises(ApiError) as json_patch:
        client.patch(
            NodeResource,
            "n1",
            [{"op": "add", "path": "/spec/x", "value": 1}],
            patch_type=PatchType.JSON,
        )
    assert json_patch.value.status.code == 415
    with pytest.raises(ApiError) as deleted:
        client.delete(NodeResource, "n1")
    assert deleted.value.status.code == 405
    client.close()


def test_merge_patch_is_rfc_7386() -> None:
    target = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert merge_patch(target, {"a": {"b": None, "c": [3]}, "e": 2}) == {
        "a": {"c": [3]},
        "d": 1,
        "e": 2,
    }


def test_a_node_says_which_field_managers_set_its_cordon(
    kube: KubeApiDouble, api: LightkubeApi
) -> None:
    """managedFields as the API server keeps them for updates: a manager owns the fields its
    write added or changed; writing a field's value again changes nothing."""
    node = api.node("n1")
    assert node.cordoned_by == ()
    api.patch_node("n1", {"spec": {"unschedulable": True}})
    assert api.node("n1").cordoned_by == ("se-bridge",)
    kube.set_node("n1", {"spec": {"unschedulable": True}}, manager="kubectl-cordon")
    assert api.node("n1").cordoned_by == ("se-bridge",)  # already cordoned: nothing written
    kube.set_node("n1", {"spec": {"unschedulable": False}}, manager="kubectl-cordon")
    kube.set_node("n1", {"spec": {"unschedulable": True}}, manager="kubectl-cordon")
    assert api.node("n1").cordoned_by == ("kubectl-cordon",)

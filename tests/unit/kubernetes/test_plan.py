"""The drain planner: which pods go, in what order, which stay and which are waited for."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bridge.kubernetes.plan import MIRROR_ANNOTATION, Budget, Rules, budget_for, plan
from bridge.kubernetes.plan import Pod as BarePod

RULES = Rules(
    skip_label="se-bridge.io/drain-skip",
    wait_label="se-bridge.io/drain-wait-for-completion",
    order_label="se-bridge.io/drain-order",
)


def Pod(namespace: str, name: str, **fields: Any) -> BarePod:
    """A pod a ReplicaSet owns unless `controller` says otherwise."""
    return BarePod(namespace, name, **{"controller": "ReplicaSet", **fields})


def keys(pods: tuple[BarePod, ...]) -> list[str]:
    return [p.key for p in pods]


def test_waves_follow_the_order_label_then_the_priority() -> None:
    pods = [
        Pod("a", "db", labels={RULES.order_label: "10"}, priority=1000),
        Pod("a", "web", priority=100),
        Pod("a", "cache", priority=100),
        Pod("a", "batch", priority=-10),
        Pod("a", "first", labels={RULES.order_label: "-5"}, priority=2000),
    ]
    waves = plan(pods, RULES).waves
    assert [keys(w) for w in waves] == [["a/first"], ["a/batch"], ["a/cache", "a/web"], ["a/db"]]
    assert keys(plan(pods, RULES).due) == ["a/first"]


def test_an_order_label_no_one_can_read_counts_as_zero() -> None:
    pods = [
        Pod("a", "odd", labels={RULES.order_label: "soon"}),
        Pod("a", "late", labels={RULES.order_label: "1"}),
    ]
    assert [keys(w) for w in plan(pods, RULES).waves] == [["a/odd"], ["a/late"]]


def test_daemonset_mirror_skip_labelled_and_finished_pods_are_left() -> None:
    pods = [
        Pod("kube-system", "proxy", controller="DaemonSet"),
        Pod("kube-system", "etcd", annotations={MIRROR_ANNOTATION: "abc"}),
        Pod("a", "pinned", labels={RULES.skip_label: "true"}),
        Pod("a", "done", phase="Succeeded", controller="Job"),
        Pod("a", "web", controller="ReplicaSet"),
    ]
    result = plan(pods, RULES)
    assert {s.pod.name: s.why for s in result.skipped} == {
        "proxy": "DaemonSet",
        "etcd": "mirror pod",
        "pinned": "skip label",
        "done": "finished",
    }
    assert keys(result.due) == ["a/web"]


def test_a_label_set_to_false_is_off() -> None:
    pods = [Pod("a", "web", labels={RULES.skip_label: "false", RULES.wait_label: "no"})]
    assert keys(plan(pods, RULES).due) == ["a/web"]


def test_pods_with_the_wait_label_are_waited_for_not_evicted() -> None:
    pods = [Pod("a", "job", labels={RULES.wait_label: "true"}), Pod("a", "web")]
    result = plan(pods, RULES)
    assert keys(result.wait) == ["a/job"]
    assert keys(result.due) == ["a/web"]
    assert not result.done
    assert not plan([pods[0]], RULES).done


def test_a_node_with_only_pods_left_alone_is_drained() -> None:
    assert plan([Pod("k", "ds", controller="DaemonSet")], RULES).done
    assert plan([], RULES).done


def test_the_budget_that_guards_a_pod() -> None:
    pod = Pod("shop", "web-1", labels={"app": "web", "tier": "front"})
    budgets = [
        Budget("other", "elsewhere", {"app": "web"}),
        Budget("shop", "db-pdb", {"app": "db"}),
        Budget("shop", "web-pdb", {"app": "web"}, (("tier", "In", ("front", "edge")),)),
    ]
    assert budget_for(pod, budgets) == "web-pdb"
    assert budget_for(Pod("shop", "x", labels={"app": "web", "tier": "back"}), budgets) is None
    assert Budget("shop", "b", {}, (("tier", "Exists", ()),)).guards(pod)
    assert not Budget("shop", "b", {}, (("tier", "DoesNotExist", ()),)).guards(pod)
    assert not Budget("shop", "b", {}, (("tier", "NotIn", ("front",)),)).guards(pod)


def test_a_pod_no_controller_owns_is_not_evicted_unless_the_rules_allow_it() -> None:
    pods = [Pod("a", "bare", controller=None), Pod("a", "web")]
    result = plan(pods, RULES)
    assert keys(result.uncontrolled) == ["a/bare"]
    assert keys(result.due) == ["a/web"]
    assert not plan([pods[0]], RULES).done
    allowed = plan(pods, replace(RULES, evict_without_controller=True))
    assert keys(allowed.due) == ["a/bare", "a/web"]
    assert allowed.uncontrolled == ()
    # Left alone or waited for, it is no blocker: a finished bare pod, a bare pod to wait for.
    done = plan([Pod("a", "job", controller=None, phase="Succeeded")], RULES)
    assert done.done
    waited = plan([Pod("a", "job", controller=None, labels={RULES.wait_label: "true"})], RULES)
    assert keys(waited.wait) == ["a/job"]
    assert waited.uncontrolled == ()

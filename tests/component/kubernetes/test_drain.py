"""The drain and the uncordon, through the real lightkube client against the API double:
the order, the skip and wait rules, a budget's 429, the deadline, Spot's fast path, and
undoing only what a drain set."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bridge.kubernetes.client import LightkubeApi
from bridge.kubernetes.drain import (
    CORDONED_FOR,
    NO_CONTROLLER,
    TAINT_KEY,
    Drainer,
    DrainSettings,
    Report,
)
from bridge.kubernetes.plan import Rules
from tests.doubles.kubeapi import KubeApiDouble
from tests.support.wait import eventually

NODE = "aks-pool1-0"
EVENT = "E1"
RULES = Rules(
    skip_label="se-bridge.io/drain-skip",
    wait_label="se-bridge.io/drain-wait-for-completion",
    order_label="se-bridge.io/drain-order",
)


@pytest.fixture
def kube() -> Iterator[KubeApiDouble]:
    with KubeApiDouble() as double:
        double.add_node(NODE)
        yield double


class Run:
    """A Drainer through the real client. With `deadline_once_blocked` its clock jumps an
    hour once the drain has reported itself blocked: the deadline comes after the blockers
    are known, however slow a loaded machine is."""

    def __init__(
        self,
        kube: KubeApiDouble,
        tmp_path: Path,
        deadline_once_blocked: bool = False,
        **settings: Any,
    ) -> None:
        self.kube = kube
        self.api = LightkubeApi(kube.kubeconfig(tmp_path))
        self.stop = threading.Event()
        self.reports: list[Report] = []
        self.refused = 0
        options: dict[str, Any] = {
            "eviction_retry": 0.05,
            "blocked_report_interval": 0.2,
            "poll": 0.02,
            **settings,
        }
        rules = options.pop("rules", RULES)
        self.drainer = Drainer(
            self.api,
            NODE,
            DrainSettings(rules, **options),
            wait=self.stop.wait,
            on_refused=self._refused,
            clock=self._blocked_clock if deadline_once_blocked else time.monotonic,
        )

    def _blocked_clock(self) -> float:
        blocked = any(r.status == "Blocked" for r in self.reports)
        return time.monotonic() + (3600.0 if blocked else 0.0)

    def _refused(self) -> None:
        self.refused += 1

    def drain(self, remaining: float = 30.0, *, preempt: bool = False) -> Report | None:
        return self.drainer.drain(EVENT, remaining, preempt=preempt, report=self.reports.append)

    def evicted(self) -> list[str]:
        """Pods whose eviction the API accepted or refused, in the order asked."""
        return [
            r.path.split("/")[4] + "/" + r.path.split("/")[6]
            for r in self.kube.calls("POST", "/eviction")
        ]


@pytest.fixture
def run(kube: KubeApiDouble, tmp_path: Path) -> Iterator[Run]:
    r = Run(kube, tmp_path)
    yield r
    r.api.close()


def test_a_drain_cordons_taints_and_evicts_in_order(kube: KubeApiDouble, run: Run) -> None:
    kube.add_pod("a", "db", NODE, labels={RULES.order_label: "10"}, linger=0.2)
    kube.add_pod("a", "web", NODE, priority=100, linger=0.2)
    kube.add_pod("a", "batch", NODE, priority=-5, linger=0.2)
    outcome = run.drain()
    assert outcome is not None
    assert (outcome.status, outcome.exit_code) == ("Drained", 0)
    # A wave starts when the one before it has left: batch, then web, then db.
    assert run.evicted() == ["a/batch", "a/web", "a/db"]
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][CORDONED_FOR] == EVENT
    assert node["spec"]["taints"] == [{"key": TAINT_KEY, "value": EVENT, "effect": "NoSchedule"}]
    assert run.reports[0].status == "Draining"
    assert kube.pods(NODE) == []


def test_daemonset_mirror_and_skip_labelled_pods_stay(kube: KubeApiDouble, run: Run) -> None:
    kube.add_pod("kube-system", "proxy", NODE, owner="DaemonSet")
    kube.add_pod("kube-system", "static", NODE, annotations={"kubernetes.io/config.mirror": "x"})
    kube.add_pod("a", "pinned", NODE, labels={RULES.skip_label: "true"})
    kube.add_pod("a", "web", NODE, owner="ReplicaSet")
    outcome = run.drain()
    assert outcome is not None
    assert outcome.status == "Drained"
    assert run.evicted() == ["a/web"]
    assert kube.pods(NODE) == ["a/pinned", "kube-system/proxy", "kube-system/static"]
    assert "a/pinned (skip label)" in outcome.detail


def test_a_pod_with_the_wait_label_is_waited_for(kube: KubeApiDouble, run: Run) -> None:
    kube.add_pod("a", "job", NODE, labels={RULES.wait_label: "true"})
    result: list[Report | None] = []
    thread = threading.Thread(target=lambda: result.append(run.drain()))
    thread.start()
    blocked = eventually(lambda: next((r for r in run.reports if r.status == "Blocked"), None))
    assert [(b.pod, b.reason) for b in blocked.blockers] == [("job", "waiting for completion")]
    kube.finish_pod("a", "job")
    thread.join(10)
    assert result[0] is not None
    assert result[0].status == "Drained"
    assert run.evicted() == []


def test_a_budget_refusal_is_retried_and_reported_as_a_blocker(
    kube: KubeApiDouble, run: Run
) -> None:
    kube.add_pod("shop", "web-1", NODE, labels={"app": "web"})
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    result: list[Report | None] = []
    thread = threading.Thread(target=lambda: result.append(run.drain()))
    thread.start()
    eventually(lambda: len(run.kube.calls("POST", "/eviction")) >= 3)
    blocked = next(r for r in run.reports if r.status == "Blocked")
    assert [b.to_record() for b in blocked.blockers] == [
        {
            "Namespace": "shop",
            "Pod": "web-1",
            "Reason": "eviction refused",
            "PodDisruptionBudget": "web-pdb",
        }
    ]
    kube.allow("web-pdb", 1)
    thread.join(10)
    assert result[0] is not None
    assert result[0].status == "Drained"
    assert run.refused >= 3


@pytest.mark.parametrize(("on_deadline", "exit_code"), [("hold", 1), ("approve", 0)])
def test_the_deadline_gives_up_and_names_the_blockers(
    kube: KubeApiDouble, tmp_path: Path, on_deadline: str, exit_code: int
) -> None:
    kube.add_pod("shop", "web-1", NODE, labels={"app": "web"})
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    run = Run(kube, tmp_path, deadline_once_blocked=True, on_deadline=on_deadline)
    outcome = run.drain()
    run.api.close()
    assert outcome is not None
    assert (outcome.status, outcome.exit_code, outcome.timed_out) == ("GaveUp", exit_code, True)
    assert outcome.blockers[0].budget == "web-pdb"
    assert f"on_deadline = {on_deadline}" in outcome.detail
    assert kube.pods(NODE) == ["shop/web-1"]


def test_spot_preempt_deletes_at_once_without_asking_budgets(kube: KubeApiDouble, run: Run) -> None:
    kube.add_pod("shop", "web-1", NODE, labels={"app": "web"}, grace=120, linger=60)
    kube.add_pod("a", "job", NODE, labels={RULES.wait_label: "true"}, grace=5)
    kube.add_pod("kube-system", "proxy", NODE, owner="DaemonSet")
    kube.add_budget("shop", "web-pdb", {"app": "web"}, allowed=0)
    outcome = run.drain(preempt=True)
    assert outcome is not None
    assert outcome.status == "Drained"
    assert run.evicted() == []
    graces = {r.path.rsplit("/", 1)[1]: r.query["gracePeriodSeconds"] for r in kube.calls("DELETE")}
    assert graces == {"web-1": "25"}  # capped; the wait-labelled job is not waited for
    assert kube.node(NODE)["spec"]["unschedulable"] is True


def test_a_node_cordoned_by_someone_else_stays_cordoned(kube: KubeApiDouble, run: Run) -> None:
    kube.set_node(NODE, {"spec": {"unschedulable": True}})
    outcome = run.drain()
    assert outcome is not None
    assert outcome.others_cordon
    assert CORDONED_FOR not in kube.node(NODE)["metadata"]["annotations"]
    undone = run.drainer.uncordon(EVENT)
    assert undone is not None
    assert undone.status == "LeftCordoned"
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == []


def test_the_uncordon_removes_only_what_the_drain_set(kube: KubeApiDouble, run: Run) -> None:
    admin_taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    kube.set_node(NODE, {"spec": {"taints": [admin_taint]}, "metadata": {"labels": {"x": "y"}}})
    assert run.drain() is not None
    undone = run.drainer.uncordon(EVENT)
    assert undone is not None
    assert undone.status == "Uncordoned"
    node = kube.node(NODE)
    assert node["spec"].get("unschedulable") is False
    assert node["spec"]["taints"] == [admin_taint]
    assert CORDONED_FOR not in node["metadata"]["annotations"]
    assert run.drainer.uncordon(EVENT) is None  # nothing of the drain is left


def test_an_unreachable_api_server_is_waited_for_until_the_deadline(
    kube: KubeApiDouble, run: Run
) -> None:
    kube.add_pod("a", "web", NODE)
    kube.down()
    outcome = run.drain(remaining=0.3)
    assert outcome is not None
    assert (outcome.status, outcome.exit_code) == ("Failed", 1)
    assert outcome.error is not None
    assert "Kubernetes API" in outcome.error
    kube.up()
    assert run.drain() is not None  # and once it answers, the same drain goes through
    assert kube.pods(NODE) == []


def test_a_stray_mark_is_found(kube: KubeApiDouble, run: Run) -> None:
    kube.set_node(
        NODE,
        {
            "spec": {
                "unschedulable": True,
                "taints": [{"key": TAINT_KEY, "value": "OLD", "effect": "NoSchedule"}],
            },
            "metadata": {"annotations": {CORDONED_FOR: "OLD"}},
        },
    )
    assert run.drainer.strays(lambda e: e == "OPEN") == ["OLD"]
    assert run.drainer.strays(lambda e: e == "OLD") == []


def test_a_node_missing_from_the_cluster_fails_the_drain(tmp_path: Path) -> None:
    with KubeApiDouble() as empty:
        run = Run(empty, tmp_path)
        outcome = run.drain()
        run.api.close()
    assert outcome is not None
    assert (outcome.status, outcome.exit_code) == ("Failed", 1)
    assert f"node {NODE} is not in the cluster" in outcome.detail


def test_a_pod_without_a_controller_blocks_the_drain(kube: KubeApiDouble, tmp_path: Path) -> None:
    """Evicted, a pod no controller owns is gone for good: like `kubectl drain` without
    --force, the drain does not evict it, and says it is what the drain waits for."""
    kube.add_pod("a", "bare", NODE, owner=None)
    kube.add_pod("a", "web", NODE, owner="ReplicaSet")
    run = Run(kube, tmp_path, deadline_once_blocked=True)
    outcome = run.drain()
    run.api.close()
    assert outcome is not None
    assert (outcome.status, outcome.exit_code) == ("GaveUp", 1)
    assert [(b.pod, b.reason) for b in outcome.blockers] == [("bare", NO_CONTROLLER)]
    assert run.evicted() == ["a/web"]
    assert kube.pods(NODE) == ["a/bare"]
    blocked = next(r for r in run.reports if r.status == "Blocked")
    assert "a/bare: no controller" in blocked.detail


def test_a_pod_without_a_controller_is_evicted_when_the_setting_allows_it(
    kube: KubeApiDouble, tmp_path: Path
) -> None:
    kube.add_pod("a", "bare", NODE, owner=None)
    run = Run(kube, tmp_path, rules=replace(RULES, evict_without_controller=True))
    outcome = run.drain()
    run.api.close()
    assert outcome is not None
    assert outcome.status == "Drained"
    assert run.evicted() == ["a/bare"]


def test_other_writers_taints_are_kept_exactly_as_they_were(kube: KubeApiDouble, run: Run) -> None:
    """A taint's timeAdded (set by the node controller on NoExecute taints) is part of it:
    a patch that rewrites the list without it would restart its tolerationSeconds."""
    theirs = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute",
         "timeAdded": "2026-12-01T10:00:00Z"},
        {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    ]  # fmt: skip
    kube.set_node(NODE, {"spec": {"taints": theirs}})
    assert run.drain() is not None
    ours = {"key": TAINT_KEY, "value": EVENT, "effect": "NoSchedule"}
    assert kube.node(NODE)["spec"]["taints"] == [*theirs, ours]
    assert run.drainer.uncordon(EVENT) is not None
    assert kube.node(NODE)["spec"]["taints"] == theirs
    # Handed over to another event: theirs still untouched.
    assert run.drain() is not None
    assert run.drainer.uncordon(EVENT, successor="E2") is not None
    assert kube.node(NODE)["spec"]["taints"] == [*theirs, {**ours, "value": "E2"}]


def test_a_cordon_someone_else_made_while_the_drain_held_the_node_stays(
    kube: KubeApiDouble, run: Run
) -> None:
    """The drain cordoned the node; then an administrator cordoned it too (kubectl writes the
    field only when it changes it: here after an uncordon of their own). The uncordon after
    the event leaves the node cordoned and says so."""
    assert run.drain() is not None
    assert kube.node(NODE)["metadata"]["annotations"][CORDONED_FOR] == EVENT
    kube.set_node(NODE, {"spec": {"unschedulable": False}}, manager="kubectl-cordon")
    kube.set_node(NODE, {"spec": {"unschedulable": True}}, manager="kubectl-cordon")
    undone = run.drainer.uncordon(EVENT)
    assert undone is not None
    assert (undone.status, undone.others_cordon) == ("LeftCordoned", True)
    assert "kubectl-cordon" in undone.detail
    node = kube.node(NODE)
    assert node["spec"]["unschedulable"] is True
    assert node["spec"]["taints"] == []
    assert CORDONED_FOR not in node["metadata"]["annotations"]


def test_a_cordon_the_administrator_took_over_stays(kube: KubeApiDouble, run: Run) -> None:
    """`kubectl cordon` of a node the drain cordoned writes nothing (already cordoned): an
    administrator keeps it cordoned by removing se-bridge's claim on the cordon."""
    assert run.drain() is not None
    unclaim = {"metadata": {"annotations": {CORDONED_FOR: None}}}
    kube.set_node(NODE, unclaim, manager="kubectl-annotate")
    undone = run.drainer.uncordon(EVENT)
    assert undone is not None
    assert (undone.status, undone.others_cordon) == ("LeftCordoned", True)
    assert kube.node(NODE)["spec"]["unschedulable"] is True

"""The Kubernetes API double with one node of a pool and its pods, for the agent's drain tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.component.kubernetes.drainrig import NODE
from tests.doubles.kubeapi import KubeApiDouble


@pytest.fixture
def kube() -> Iterator[KubeApiDouble]:
    with KubeApiDouble() as double:
        double.add_node(NODE, labels={"kubernetes.azure.com/agentpool": "pool1"})
        double.add_pod("shop", "web-1", NODE, labels={"app": "web"}, owner="ReplicaSet")
        double.add_pod("kube-system", "proxy", NODE, owner="DaemonSet")
        yield double

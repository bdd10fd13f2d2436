"""The Kubernetes manifests: the agent DaemonSet and the consumer Deployment."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from bridge.config import load

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "packaging" / "kubernetes"


def documents(name: str) -> dict[str, dict[str, Any]]:
    text = (K8S / name).read_text(encoding="utf-8")
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


def pod(name: str, kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = documents(name)[kind]["spec"]["template"]["spec"]
    return spec


def test_the_agent_runs_on_every_node_with_the_hosts_network() -> None:
    spec = pod("daemonset.yaml", "DaemonSet")
    # AKS podLinkLocalAccess=None cuts non-hostNetwork pods off from IMDS.
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {"operator": "Exists"} in spec["tolerations"]
    assert spec["terminationGracePeriodSeconds"] > 25


@pytest.mark.parametrize(
    ("name", "kind", "command"),
    [
        ("daemonset.yaml", "DaemonSet", "agent"),
        ("consumer-deployment.yaml", "Deployment", "consume"),
    ],
)
def test_the_main_container_is_non_root_and_read_only(name: str, kind: str, command: str) -> None:
    spec = pod(name, kind)
    [container] = spec["containers"]
    context = {**spec.get("securityContext", {}), **container["securityContext"]}
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == 10001
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert container["args"][0] == command
    labels = documents(name)[kind]["spec"]["template"]["metadata"]["labels"]
    assert labels["azure.workload.identity/use"] == "true"


def test_only_the_init_container_is_root_and_only_to_chown() -> None:
    [init] = pod("daemonset.yaml", "DaemonSet")["initContainers"]
    assert init["command"][0] == "chown"
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


@pytest.mark.parametrize(
    ("name", "key"),
    [("daemonset.yaml", "agent.toml"), ("consumer-deployment.yaml", "consumer.toml")],
)
def test_the_config_maps_hold_valid_settings(name: str, key: str, tmp_path: Path) -> None:
    config = tmp_path / key
    config.write_text(documents(name)["ConfigMap"]["data"][key], encoding="utf-8")
    load(config, environ={})  # raises ConfigError naming the setting
    assert "connection_string" not in config.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("name", "kind", "setting", "host"),
    [
        ("daemonset.yaml", "DaemonSet", "SE_BRIDGE_AGENT_METRICS_ADDRESS", "127.0.0.1"),
        ("consumer-deployment.yaml", "Deployment", "SE_BRIDGE_CONSUMER_METRICS_ADDRESS", None),
    ],
)
def test_probes_ask_the_health_endpoints_where_the_process_listens(
    name: str, kind: str, setting: str, host: str | None
) -> None:
    [container] = pod(name, kind)["containers"]
    address = next(e["value"] for e in container["env"] if e["name"] == setting)
    port = int(address.rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == port
        assert get.get("host") == host
    if host is not None:  # the agent shares the node's network: loopback only
        assert address.startswith("127.0.0.1:")

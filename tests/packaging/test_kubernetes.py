"""The Kubernetes manifests (packaging/kubernetes): every Kustomize overlay rendered by
`kubectl kustomize`, as a user applies it, then read: the schemas of Kubernetes, the RBAC, the
settings the agent and the consumer load, tolerations and probes."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from bridge import __version__
from bridge.config import Config, load
from bridge.policy.file import loads

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ROOT / "packaging" / "kubernetes" / "overlays"
AGENTS = ("agent", "agent-drain")
# The oldest Kubernetes the manifests are for (AKS supports none older), and the newest the
# installed kubernetes-validate knows: what is valid in both is valid in between, as fields are
# only deprecated for a while before they go.
KUBERNETES = ("1.30", kubernetes_validate.latest_version())
NODE = "aks-nodepool1-12345678-vmss000000"
EVENT = "5DD55E16-0000-4000-8000-00000000031A"
Object = dict[str, Any]


def rendered(overlay: str) -> tuple[Object, ...]:
    """The overlay as `kubectl apply -k` sends it (kubectl 1.20's kustomize, or a newer one),
    parsed afresh for each test, which may change what it reads."""
    return tuple(doc for doc in yaml.safe_load_all(kustomize(overlay)) if doc)


@cache
def kustomize(overlay: str) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is missing: ./dev installs Debian's kubernetes-client (kubectl 1.20)")
    done = subprocess.run([kubectl, "kustomize", str(OVERLAYS / overlay)], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr  # newer kubectls also warn of `bases` there
    return done.stdout


def the(overlay: str, kind: str, name: str | None = None) -> Object:
    [found] = [
        doc
        for doc in rendered(overlay)
        if doc["kind"] == kind and name in (None, doc["metadata"]["name"])
    ]
    return found


def pod(overlay: str) -> Object:
    kind = "Deployment" if overlay == "consumer" else "DaemonSet"
    spec: Object = the(overlay, kind)["spec"]["template"]["spec"]
    return spec


def main_container(overlay: str) -> Object:
    container: Object = pod(overlay)["containers"][0]
    return container


# What kubectl 1.20's built-in kustomize (v2.0.3, Debian's kubernetes-client) reads: a newer
# kubectl renders more, so the test above alone would not see a field 1.20 refuses.
KUSTOMIZE_2_0_3 = {"apiVersion", "kind", "resources", "bases", "namespace", "namePrefix",
                   "nameSuffix", "commonLabels", "commonAnnotations", "patchesStrategicMerge",
                   "patchesJson6902", "configMapGenerator", "secretGenerator", "generatorOptions",
                   "images", "vars", "crds"}  # fmt: skip


@pytest.mark.parametrize(
    "kustomization",
    sorted((ROOT / "packaging" / "kubernetes").rglob("kustomization.yaml")),
    ids=lambda p: p.parent.name,
)
def test_every_kustomization_keeps_to_what_kubectl_1_20_reads(kustomization: Path) -> None:
    fields = yaml.safe_load(kustomization.read_text(encoding="utf-8"))
    assert set(fields) <= KUSTOMIZE_2_0_3
    # kustomize 2.0.3 reads only files from `resources`: a directory must be in `bases`.
    assert [r for r in fields.get("resources", ()) if (kustomization.parent / r).is_dir()] == []
    assert [b for b in fields.get("bases", ()) if not (kustomization.parent / b).is_dir()] == []
    assert "commonLabels" not in fields  # it rewrites the immutable selectors of earlier installs


def test_the_overlays_are_all_there_are() -> None:
    assert sorted(p.name for p in OVERLAYS.iterdir()) == sorted((*AGENTS, "consumer"))


@pytest.mark.parametrize("version", KUBERNETES)
@pytest.mark.parametrize("overlay", [*AGENTS, "consumer"])
def test_every_object_of_every_overlay_is_valid_kubernetes(overlay: str, version: str) -> None:
    objects = rendered(overlay)
    assert {"Namespace", "ServiceAccount", "ConfigMap"} <= {o["kind"] for o in objects}
    for obj in objects:  # strict: a misspelt or misplaced field is an unknown property
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            where = ".".join(str(p) for p in err.path)
            name = f"{obj['kind']}/{obj['metadata']['name']}"
            pytest.fail(f"{overlay}: {name}: {where}: {err.message}")


@pytest.mark.parametrize("overlay", [*AGENTS, "consumer"])
def test_every_container_runs_this_versions_image(overlay: str) -> None:
    spec = pod(overlay)
    images = {c["image"] for c in (*spec.get("initContainers", ()), *spec["containers"])}
    assert images == {f"se-bridge:{__version__}"}


# The ClusterRole of the drain, rule by rule: (API group, resource, verb).
DRAIN_GRANTS = {
    ("", "nodes", "get"),  # its node: unschedulable, taints, the cordoned-for annotation
    ("", "nodes", "patch"),  # cordon, taint, uncordon
    ("", "pods", "list"),  # the pods on its node, and whether they have gone
    ("", "pods/eviction", "create"),  # the Eviction API, which PodDisruptionBudgets answer
    ("", "pods", "delete"),  # Spot Preempt's fast path only
    ("policy", "poddisruptionbudgets", "list"),  # to name the budget that refused an eviction
}


def grants(role: Object) -> set[tuple[str, str, str]]:
    found = set()
    for rule in role["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames, no URLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found |= {(group, resource, verb) for verb in rule["verbs"]}
    return found


def test_the_drain_is_granted_exactly_what_it_needs_and_only_to_the_agent() -> None:
    roles = [o for o in rendered("agent-drain") if o["kind"] in ("Role", "ClusterRole")]
    [role] = roles
    assert grants(role) == DRAIN_GRANTS  # no wildcard, no write beyond these
    [binding] = [o for o in rendered("agent-drain") if o["kind"].endswith("RoleBinding")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}  # fmt: skip
    account = the("agent-drain", "ServiceAccount")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"],
         "namespace": account["metadata"]["namespace"]}
    ]  # fmt: skip
    spec = pod("agent-drain")
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is True  # the in-cluster client's token


def test_the_docs_say_what_the_drain_is_granted() -> None:
    page = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    rows = [
        line.split("|")[1:4]
        for line in page.splitlines()
        if line.startswith(("| core ", "| policy "))
    ]
    said = {
        ("" if group.strip() == "core" else group.strip(), resource.strip(" `"), verb.strip())
        for group, resource, verbs in rows
        for verb in verbs.split(",")
    }
    assert said == DRAIN_GRANTS


def test_the_docs_aks_example_is_a_valid_policy_of_one_node_per_pool() -> None:
    page = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    [text] = re.findall(r"```yaml\n(version: 1\n.*?)```", page, re.DOTALL)
    policy = loads(text, "docs/kubernetes.md")  # PolicyError names the line
    [budget] = policy.budgets
    assert (budget.group, budget.max_vms) == ("node_pool", 1)
    assert "approve_when_ready" in {rule.action.kind for rule in policy.rules}


@pytest.mark.parametrize("overlay", ["agent", "consumer"])
def test_the_other_overlays_grant_nothing_and_mount_no_token(overlay: str) -> None:
    rbac = [o for o in rendered(overlay) if o["apiVersion"].startswith("rbac.")]
    assert rbac == []
    account = the(overlay, "ServiceAccount")
    default = account["automountServiceAccountToken"]
    assert pod(overlay).get("automountServiceAccountToken", default) is False


def test_the_drain_overlay_is_the_agent_with_only_the_drain_added() -> None:
    plain, drain = (the(o, "DaemonSet") for o in AGENTS)
    spec = drain["spec"]["template"]["spec"]
    assert spec.pop("automountServiceAccountToken") is True
    [container] = spec["containers"]
    drains = ("NODE_NAME", "SE_BRIDGE_KUBERNETES_ENABLED")
    added = [e for e in container["env"] if e["name"] in drains]
    container["env"] = [e for e in container["env"] if e not in added]
    assert drain == plain
    assert added == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "SE_BRIDGE_KUBERNETES_ENABLED", "value": "true"},
    ]


def environment(container: Object) -> dict[str, str]:
    """The container's variables as the kubelet sets them on node NODE."""
    env = {}
    for var in container.get("env", ()):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, var
            env[var["name"]] = NODE
    return env


def settings_file(overlay: str, tmp_path: Path) -> Path:
    """The file the main container's --config names, as its ConfigMap volume mounts it."""
    container = main_container(overlay)
    args = container["args"]
    path = Path(args[args.index("--config") + 1])
    [mount] = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    [volume] = [v for v in pod(overlay)["volumes"] if v["name"] == mount["name"]]
    config_map = the(overlay, "ConfigMap", volume["configMap"]["name"])
    local = tmp_path / path.name
    local.write_text(config_map["data"][path.relative_to(mount["mountPath"]).as_posix()],
                     encoding="utf-8")  # fmt: skip
    return local


@pytest.mark.parametrize("overlay", [*AGENTS, "consumer"])
def test_the_settings_load_as_the_process_loads_them(overlay: str, tmp_path: Path) -> None:
    path = settings_file(overlay, tmp_path)
    config = load(path, environ=environment(main_container(overlay)))  # ConfigError names it
    assert "connection_string" not in path.read_text(encoding="utf-8")
    if overlay == "consumer":
        assert config.consumer.state == "tables"
        return
    assert config.agent.state_dir == Path("/var/lib/se-bridge")  # the hostPath volume's
    [state] = [v for v in pod(overlay)["volumes"] if v["name"] == "state"]
    assert state["hostPath"]["path"] == str(config.agent.state_dir)


@pytest.mark.skipif(
    "kubernetes" not in {f.name for f in dataclasses.fields(Config)},
    reason="the [kubernetes] settings (issue 30's drain) are not in bridge.config yet",
)
@pytest.mark.parametrize("overlay", AGENTS)
def test_only_the_drain_overlay_turns_the_drain_on_for_the_node_it_runs_on(
    overlay: str, tmp_path: Path
) -> None:
    env = environment(main_container(overlay))
    config: Any = load(settings_file(overlay, tmp_path), environ=env)
    assert config.kubernetes.enabled is (overlay == "agent-drain")
    if overlay == "agent-drain":
        # The agent takes the downward API's node name when node_name is not set.
        assert env["NODE_NAME"] == NODE
        assert config.kubernetes.node_name in ("", NODE)


def tolerates(toleration: Object, taint: Object) -> bool:
    """Kubernetes' rule: an empty key with Exists matches every taint, an empty effect every
    effect; Equal (the default) also compares the value."""
    if toleration.get("effect") not in (None, "", taint["effect"]):
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return bool(toleration.get("value", "") == taint.get("value", ""))


TAINTS = [
    {"key": "se-bridge.io/maintenance", "value": EVENT, "effect": "NoSchedule"},  # its own drain
    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},  # cordoned
    {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"},
    {"key": "CriticalAddonsOnly", "value": "true", "effect": "NoSchedule"},  # AKS system pools
    {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
    {"key": "example.com/gpu", "value": "a100", "effect": "NoExecute"},  # anyone's own
]


@pytest.mark.parametrize("taint", TAINTS, ids=[t["key"] for t in TAINTS])
@pytest.mark.parametrize("overlay", AGENTS)
def test_the_agent_runs_on_every_node_whatever_its_taints(overlay: str, taint: Object) -> None:
    assert any(tolerates(t, taint) for t in pod(overlay)["tolerations"])


def test_the_agent_tolerates_its_own_taint_by_name() -> None:
    # Not only through the catch-all: narrowing that one must not evict the agent mid-drain.
    named = [t for t in pod("agent-drain")["tolerations"] if t.get("key")]
    assert any(tolerates(t, TAINTS[0]) for t in named)


@pytest.mark.parametrize("overlay", AGENTS)
def test_the_agent_runs_with_the_hosts_network(overlay: str) -> None:
    spec = pod(overlay)
    # AKS podLinkLocalAccess=None cuts non-hostNetwork pods off from IMDS.
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["terminationGracePeriodSeconds"] > 25
    assert spec["priorityClassName"] == "system-node-critical"  # never evicted for capacity


@pytest.mark.parametrize(("overlay", "command"), [("agent", "agent"), ("agent-drain", "agent"),
                                                  ("consumer", "consume")])  # fmt: skip
def test_the_main_container_is_non_root_and_read_only(overlay: str, command: str) -> None:
    spec = pod(overlay)
    [container] = spec["containers"]
    context = {**spec.get("securityContext", {}), **container["securityContext"]}
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == 10001
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["args"][0] == command
    assert set(container["resources"]) == {"requests", "limits"}
    kind = "Deployment" if overlay == "consumer" else "DaemonSet"
    labels = the(overlay, kind)["spec"]["template"]["metadata"]["labels"]
    assert labels["azure.workload.identity/use"] == "true"


@pytest.mark.parametrize("overlay", AGENTS)
def test_only_the_init_container_is_root_and_only_to_chown(overlay: str) -> None:
    [init] = pod(overlay)["initContainers"]
    assert init["command"][0] == "chown"
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


@pytest.mark.parametrize(
    ("overlay", "setting", "host"),
    [
        ("agent", "SE_BRIDGE_AGENT_METRICS_ADDRESS", "127.0.0.1"),
        ("agent-drain", "SE_BRIDGE_AGENT_METRICS_ADDRESS", "127.0.0.1"),
        ("consumer", "SE_BRIDGE_CONSUMER_METRICS_ADDRESS", None),
    ],
)
def test_probes_ask_the_health_endpoints_where_the_process_listens(
    overlay: str, setting: str, host: str | None
) -> None:
    container = main_container(overlay)
    address = environment(container)[setting]
    port = int(address.rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == port
        assert get.get("host") == host
    if host is not None:  # the agent shares the node's network: loopback only
        assert address.startswith("127.0.0.1:")


def test_only_the_kubelet_and_the_scraper_reach_the_consumers_port() -> None:
    """Issue 37: the consumer listens on 0.0.0.0 in its pod; with no NetworkPolicy any pod
    could hold its probe port and get it restarted. The kubelet's probes come from the node,
    which a NetworkPolicy never blocks (kubernetes.io: "Pods cannot ... block access from
    their resident node"); the policy admits the scrapers and nothing else."""
    container = main_container("consumer")
    policy = the("consumer", "NetworkPolicy")
    labels = the("consumer", "Deployment")["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "se-bridge"
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["podSelector"]["matchLabels"].items() <= labels.items()
    [rule] = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    assert any(p["name"] == "metrics" for p in container["ports"])
    for source in rule["from"]:  # pods picked by label, in namespaces picked by label
        assert set(source) == {"namespaceSelector", "podSelector"}
        assert source["podSelector"]["matchLabels"], "never every pod"


@pytest.mark.parametrize("overlay", AGENTS)
def test_the_agent_needs_no_network_policy_it_listens_on_loopback(overlay: str) -> None:
    # A NetworkPolicy does not apply to a pod in the node's network; the agent's endpoint is
    # on 127.0.0.1, where no pod reaches it.
    assert "NetworkPolicy" not in {o["kind"] for o in rendered(overlay)}
    address = environment(main_container(overlay))["SE_BRIDGE_AGENT_METRICS_ADDRESS"]
    assert address.startswith("127.0.0.1:")

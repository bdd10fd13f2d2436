"""Settings: flags > environment (SE_BRIDGE_<SECTION>_<KEY>) > TOML file > defaults.

Each section is a frozen dataclass; a field's metadata says what it accepts. One loader
walks them, so every setting is validated the same way and every error names the
setting and where its value came from. A bad setting stops the process at start.

Example file (all keys optional):

    [agent]
    poll_interval = 1.0
    sinks = ["jsonl:/var/log/se-bridge/records.jsonl"]

    [hooks]
    prepare = "/opt/app/drain.sh"
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import math
import os
import re
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from bridge import host
from bridge.schema import DCR_STREAM

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

log = logging.getLogger(__name__)
ENV_PREFIX = "SE_BRIDGE_"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")


class ConfigError(ValueError):
    """A setting is wrong; the message names it and where it came from."""


@dataclass(frozen=True)
class Flag:
    """A setting's command-line option. Its --help is `help`, then the setting, its
    environment variable and the default (`default`, where the field's own default does not
    say it); see add_flags."""

    name: str
    metavar: str = ""
    help: str = ""
    default: str = ""
    const: str | None = None  # a switch that sets the setting to this (--shadow)


def _setting(
    default: Any,
    help_text: str,
    *,
    low: float | None = None,
    high: float | None = None,
    choices: tuple[str, ...] = (),
    command: bool = False,
    secret: bool = False,
    url: bool = False,
    flag: Flag | None = None,
) -> Any:
    meta = {
        "help": help_text,
        "low": low,
        "high": high,
        "choices": choices,
        "command": command,
        "secret": secret,
        "url": url,
        "flag": flag,
    }
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


# Options that two sections' settings share: bridge.cli adds the logging ones to every command.
_LOG_LEVEL_FLAG = Flag("--log-level", help="how much to log")
_LOG_FORMAT_FLAG = Flag(
    "--log-format", help="text, or json: one object per line for a log pipeline"
)
_METRICS_FLAG = Flag(
    "--metrics-address",
    "[HOST:]PORT",
    "serve /metrics, /healthz and /readyz here; a bare port listens on 127.0.0.1",
    default="off",
)
_SINK_KINDS = "jsonl:PATH, stdout, hub:DIR, eventhubs or loganalytics"


@dataclass(frozen=True)
class AgentSettings:
    poll_interval: float = _setting(
        1.0,
        "Seconds between Scheduled Events polls.",
        low=0.2,
        high=60,
        flag=Flag("--poll-interval", "SECONDS", "seconds between polls"),
    )
    state_dir: Path = _setting(
        host.default_state_dir(),
        "Where the spool and state live.",
        flag=Flag("--state-dir", "DIR", "the agent's spool and state directory"),
    )
    sinks: list[str] = _setting(
        [],
        "Sink specs: jsonl:PATH, stdout, hub:DIR, eventhubs, loganalytics. "
        "Default: jsonl:<state_dir>/records.jsonl.",
        flag=Flag(
            "--sink", "SPEC", f"where records go: {_SINK_KINDS}", "jsonl:<state-dir>/records.jsonl"
        ),
    )
    heartbeat_interval: float = _setting(
        300.0, "Seconds between Heartbeat records.", low=1, high=86400
    )
    log_level: str = _setting(
        "INFO", "DEBUG, INFO, WARNING or ERROR.", choices=LOG_LEVELS, flag=_LOG_LEVEL_FLAG
    )
    log_format: str = _setting(
        "text",
        "text (a line a person reads) or json (one object per line for a log pipeline).",
        choices=LOG_FORMATS,
        flag=_LOG_FORMAT_FLAG,
    )
    policy: Path | None = _setting(
        None,
        "Approval policy run inside this agent (local mode): a YAML file, or `default` for the "
        "built-in policy; none: no local approvals.",
        flag=Flag(
            "--policy",
            "FILE",
            "approve with this policy here, local mode: a YAML file, or default for the "
            "built-in policy",
            default="none",
        ),
    )
    vm_name: str = _setting(
        "",
        "This VM's name as Scheduled Events' Resources lists it, for an IMDS that serves no "
        "instance metadata (Microsoft's mock server, some emulators); instance "
        "metadata's name wins when it answers. "
        "Empty: without instance metadata an event naming this host counts as this VM's.",
        flag=Flag(
            "--vm-name",
            "NAME",
            "this VM's name as the events' Resources list it, for an IMDS that serves no "
            "instance metadata, such as Microsoft's mock server",
            default="the name instance metadata gives, else this host's",
        ),
    )
    log_file: Path | None = _setting(
        None,
        "Write the log to this file, rotated by size, instead of stderr; none: stderr "
        "(journald rotates it). The Windows service defaults to "
        "%ProgramData%\\se-bridge\\logs\\agent.log.",
        flag=Flag("--log-file", "PATH", "log to this size-rotated file, not stderr"),
    )
    metrics_address: str = _setting(
        "",
        "PORT or HOST:PORT of the agent's /metrics (Prometheus), /healthz and /readyz; a bare "
        "port listens on 127.0.0.1 only. Empty: no endpoint.",
        flag=_METRICS_FLAG,
    )
    log_max_bytes: int = _setting(
        10 * 1024 * 1024, "Size at which the log file is rotated.", low=64 * 1024, high=2**40
    )
    log_backups: int = _setting(
        5, "Rotated log files kept beside the current one.", low=1, high=100
    )
    spot_rebalance: bool = _setting(
        False,
        "On a Spot VM (instance metadata's compute.priority), poll Scheduled Events at "
        "api-version 2024-07-09 (preview) instead of imds.api_version: the same one request a "
        "poll, which also lists Spot rebalance recommendations, written as Advisory records "
        "and never approved (docs/policy.md#spot-rebalance-recommendations). Other VMs poll as "
        "before.",
    )


@dataclass(frozen=True)
class ImdsSettings:
    url: str = _setting(
        "http://169.254.169.254",
        "IMDS base URL, http://HOST[:PORT][/PREFIX] (the simulator's for tests, such as "
        "http://127.0.0.1:8080/vm/vm-0).",
        url=True,
        flag=Flag("--imds-url", "URL", "IMDS base URL, http://HOST[:PORT][/PREFIX]"),
    )
    api_version: str = _setting("2020-07-01", "Scheduled Events api-version.")
    timeout: float = _setting(
        10.0,
        "Seconds a whole answer may take once IMDS has answered once (a deadline, however "
        "slowly it arrives).",
        low=0.5,
        high=300,
    )
    first_call_timeout: float = _setting(
        120.0,
        "Seconds to wait for the first answer (IMDS may take 2 min after idling).",
        low=1,
        high=600,
    )
    instance_refresh: float = _setting(
        3600.0, "Seconds between instance metadata refreshes.", low=10, high=86400
    )
    max_requests_per_second: float = _setting(
        5.0, "Ceiling on IMDS requests; IMDS throttles above about 5/s.", low=0.1, high=5
    )


@dataclass(frozen=True)
class SpoolSettings:
    max_records: int = _setting(
        100_000, "Records the spool holds before it sheds (heartbeats first).", low=100, high=10**8
    )
    max_bytes: int = _setting(
        64 * 1024 * 1024, "Bytes the spool holds before it sheds.", low=64 * 1024, high=2**40
    )


@dataclass(frozen=True)
class HooksSettings:
    # A string runs through the platform shell; a TOML list runs as argv without one.
    prepare: str | list[str] | None = _setting(
        None, "Command run when an event affecting this VM appears.", command=True
    )
    recover: str | list[str] | None = _setting(
        None, "Command run when such an event is Completed or Canceled.", command=True
    )
    timeout: float = _setting(
        300.0, "Seconds a hook may run before it is killed.", low=1, high=86400
    )
    max_concurrent: int = _setting(4, "Hooks that may run at once.", low=1, high=64)
    on_rebalance: bool = _setting(
        False,
        "Also run the prepare command when a Spot rebalance recommendation naming this VM "
        "appears (agent.spot_rebalance): SE_BRIDGE_EVENT_TYPE is "
        "SpotRebalanceRecommendation and the Advisory record is on stdin. Nothing is "
        "approved after it, and no recover command follows it.",
    )
    environment: list[str] = _setting(
        [],
        "Names of the agent's environment variables also passed to hooks; by default a hook "
        "gets only PATH, HOME, the locale, TZ, the temporary directory and (on Windows) the "
        "system's variables, never the agent's credentials or SE_BRIDGE_* settings.",
    )


@dataclass(frozen=True)
class EventHubsSettings:
    namespace: str = _setting(
        "", "Fully qualified namespace, e.g. contoso.servicebus.windows.net (Entra ID auth)."
    )
    name: str = _setting("", "Event hub name.")
    connection_string: str = _setting(
        "", "SAS or emulator connection string, instead of namespace with Entra ID.", secret=True
    )
    transport: str = _setting(
        "https",
        "How the agent's eventhubs sink sends: https (the REST send, port 443: no AMQP "
        "connection to open, so an event's first record leaves at once after a quiet spell) "
        "or amqp (port 5671; the Event Hubs emulator takes only this). The consumer reads "
        "over AMQP either way.",
        choices=("https", "amqp"),
    )


@dataclass(frozen=True)
class LogAnalyticsSettings:
    endpoint: str = _setting(
        "", "Logs ingestion endpoint of the DCR or its DCE (https://...ingest.monitor.azure.com)."
    )
    rule_id: str = _setting("", "Immutable id of the data collection rule (dcr-...).")
    stream: str = _setting(DCR_STREAM, "Stream declared in the data collection rule.")
    send_interval: float = _setting(
        60.0,
        "Seconds: after an upload, heartbeats and records of events that do not affect this VM "
        "(its neighbours') wait up to this long to share the next one; records about this "
        "VM's own events go at once. Keeps a rule's request quota at fleet scale; 0: all at "
        "once.",
        low=0,
        high=600,
    )


@dataclass(frozen=True)
class IdentitySettings:
    kind: str = _setting(
        "auto",
        "auto: DefaultAzureCredential (managed identity on a VM, CLI or environment elsewhere); "
        "managed: managed identity only.",
        choices=("auto", "managed"),
    )
    client_id: str = _setting(
        "", "Client id of a user-assigned managed identity; empty for system-assigned."
    )


@dataclass(frozen=True)
class StorageSettings:
    account: str = _setting(
        "", "Storage account name for queues, tables and checkpoints (Entra ID auth)."
    )
    connection_string: str = _setting(
        "", "Storage connection string (Azurite's, or a key), instead of account.", secret=True
    )
    endpoint_suffix: str = _setting("core.windows.net", "Storage DNS suffix of the cloud.")


@dataclass(frozen=True)
class CommandsSettings:
    channel: str = _setting(
        "",
        "Where approvals arrive: local:DIR, or storagequeue (one queue per VM); "
        "empty: no command listener.",
        flag=Flag(
            "--commands",
            "SPEC",
            "the approval command channel, local:DIR or storagequeue: the consumer sends "
            "approvals to it, the agent listens on it; an agent without one takes no central "
            "approvals",
        ),
    )
    queue_prefix: str = _setting("se-bridge-", "Per-VM queue name: this prefix and the VmId.")
    queue_accounts: str = _setting(
        "",
        "Consumer: the storage accounts of the per-VM queues when a fleet spreads them over "
        "several (infra/ queueAccountCount), comma-separated; a VM's queue is in the account at "
        "index (the first 8 hex digits of its VmId) modulo their number. Empty: storage.account.",
    )
    poll_interval: float = _setting(
        1.0,
        "Seconds between command reads while a Scheduled event that affects this VM is pending "
        "(in the first 3 s after one appears, every 0.2 s at most: the consumer's command is due).",
        low=0.2,
        high=10,
    )
    others_interval: float = _setting(
        10.0,
        "Seconds between command reads while only events of other VMs of its availability set "
        "or placement group are pending (a command comes for one only if no affected VM can "
        "carry it).",
        low=0.2,
        high=300,
    )
    idle_interval: float = _setting(
        0.0,
        "Seconds between command reads with nothing pending; 0: none (each read is billed).",
        low=0,
        high=86400,
    )
    visibility_timeout: float = _setting(
        30.0, "Seconds a read command stays hidden before another read sees it.", low=1, high=3600
    )
    signing_key: str = _setting(
        "",
        "Consumer: private key that signs commands: file:PATH (PEM, mode 0600) or "
        "keyvault:https://VAULT.vault.azure.net/secrets/NAME[/VERSION].",
    )
    verify_key: str = _setting(
        "",
        "Agent: public key(s) commands must be signed with: base64 (`se-bridge keygen` prints "
        "it) or file:PATH of a PEM; comma-separated while rotating. Consumer: the previous "
        "signing key(s) while rotating, so that what people decided under them still applies.",
    )
    allow_unsigned: bool = _setting(
        False, "Accept (agent) or send (consumer) unsigned commands. Never in production."
    )


# The consumer read these from [agent] before it had its own; see Config.consumer_state_dir.
UNDER_AGENT = ("state_dir", "log_level", "log_format")


@dataclass(frozen=True)
class ConsumerSettings:
    state_dir: Path | None = _setting(
        None,
        "The consumer's decisions spool, and the default place of its fleet state and "
        "decisions file. None: agent.state_dir where a config written before this setting "
        "sets it (deprecated, with a WARNING), else the platform default.",
        flag=Flag(
            "--state-dir",
            "DIR",
            "the consumer's state directory: its decisions spool, the default place of its "
            "fleet state, and the operator-token a loopback page's URL needs",
        ),
    )
    log_level: str | None = _setting(
        None,
        "DEBUG, INFO, WARNING or ERROR. None: agent.log_level where an older config sets it "
        "(deprecated), else INFO.",
        choices=LOG_LEVELS,
        flag=_LOG_LEVEL_FLAG,
    )
    log_format: str | None = _setting(
        None,
        "text or json, as agent.log_format. None: agent.log_format where an older config sets "
        "it (deprecated), else text.",
        choices=LOG_FORMATS,
        flag=_LOG_FORMAT_FLAG,
    )
    policy: Path | None = _setting(
        None,
        "Approval policy file (YAML); none (or `default`): the built-in policy.",
        flag=Flag("--policy", "FILE", "the approval policy, YAML", "the built-in policy"),
    )
    mode: str = _setting(
        "normal",
        "normal: send the approvals decided; shadow: decide and write Decision records "
        "(DecisionMode shadow) but send no command, to watch a policy before it approves "
        "anything. A shadow consumer keeps its own state and reads in a consumer group of its "
        "own: it refuses to start in $Default or on the table sebridgefleet.",
        choices=("normal", "shadow"),
        flag=Flag(
            "--shadow",
            help="decide and write Decision records, send no command, in a consumer group (and "
            "on a fleet state) other than the live consumer's",
            const="shadow",
        ),
    )
    state: str = _setting(
        "",
        "Fleet state: sqlite:PATH or tables. Default: sqlite:<state_dir>/fleet.db.",
        flag=Flag(
            "--state",
            "SPEC",
            "the fleet state: sqlite:PATH or tables",
            "sqlite:<state-dir>/fleet.db",
        ),
    )
    table_name: str = _setting("sebridgefleet", "Table Storage table of the fleet state.")
    hub: Path | None = _setting(
        None,
        "Local hub directory to read instead of Event Hubs.",
        flag=Flag("--hub", "DIR", "read a local hub, not Event Hubs"),
    )
    consumer_group: str = _setting("$Default", "Event Hubs consumer group.")
    load_balancing_interval: float = _setting(
        10.0, "Seconds between Event Hubs partition ownership checks.", low=1, high=300
    )
    checkpoint_container: str = _setting(
        "se-bridge-checkpoints", "Blob container of the Event Hubs checkpoints."
    )
    checkpoint_interval: float = _setting(
        5.0,
        "Seconds between checkpoint writes (billed blob requests) of one partition; a "
        "consumer taking a partition over reads at most this much again, deduplicated.",
        low=0,
        high=300,
    )
    sinks: list[str] = _setting(
        [],
        "Where Decision records go. Default: jsonl:<state_dir>/decisions.jsonl.",
        flag=Flag(
            "--sink",
            "SPEC",
            f"where Decision records go: {_SINK_KINDS}",
            "jsonl:<state-dir>/decisions.jsonl",
        ),
    )
    alive_within: float = _setting(
        660.0,
        "Seconds: a VM heard from within this (on the consumer's clock) is alive: it may carry "
        "an approval and it counts in its groups' sizes. One silent longer, in what the "
        "consumer has read of its partition, may have its event's budget slot released.",
        low=10,
        high=86400,
    )
    approval_timeout: float = _setting(
        30.0, "Seconds to wait for an Approval record before asking the next VM.", low=1, high=3600
    )
    reevaluate_interval: float = _setting(
        5.0, "Seconds between re-evaluations of deferred events.", low=0.2, high=3600
    )
    stale_after: float = _setting(
        6 * 3600.0,
        "Seconds after which an event no VM reports on stops counting.",
        low=60,
        high=30 * 86400,
    )
    unknown_names_for: float = _setting(
        3600.0,
        "Seconds after an event was first seen during which a name in its Resources that no VM "
        "of its reporters' scopes has counts against the budgets (then the slot is released).",
        low=60,
        high=7 * 86400,
    )
    metrics_address: str = _setting(
        "",
        "PORT or HOST:PORT of the standalone consumer's /metrics, /healthz and /readyz; a bare "
        "port listens on 127.0.0.1 only. Empty: no endpoint.",
        flag=_METRICS_FLAG,
    )
    forget_vms_after: float = _setting(
        7 * 86400.0,
        "Seconds after which a VM not heard from (deleted, or its agent gone) is removed from "
        "the fleet state, unless an open event still counts it.",
        low=3600,
        high=366 * 86400,
    )


NOTIFY_KINDS = ("generic", "teams", "slack")
_TARGET_KEYS = ("name", "kind", "url", "url_secret")


@dataclass(frozen=True)
class NotifyTarget:
    """One webhook notices go to. Its URL is a secret: it is in no repr, log line or error."""

    name: str
    kind: str
    url: str = field(default="", repr=False)
    url_secret: str = ""


@dataclass(frozen=True)
class NotifySettings:
    targets: list[NotifyTarget] = _setting(
        [],
        "Webhooks the consumer posts notices to (docs/people.md#webhook-formats): a list of "
        "tables with `name` (what policies and metrics call it), `kind` (generic, teams or "
        "slack) and either `url` or `url_secret` (the name of a Key Vault secret in "
        "notify.key_vault holding the URL, read with the consumer's identity). In the "
        'environment, JSON: `[{"name": "ops", "kind": "teams", "url_secret": "ops-webhook"}]`. '
        "The URLs are secrets: never logged.",
        secret=True,
    )
    page_url: str = _setting(
        "",
        "The approval page's address, its host's root (https://HOST/; the page has no path of "
        "its own), for the links in notices; empty: notices carry none.",
    )
    key_vault: str = _setting(
        "", "Key Vault of the targets' url_secret, e.g. https://contoso.vault.azure.net."
    )
    timeout: float = _setting(
        10.0,
        "Seconds one post may take in all, connecting to answering (only the answer's status "
        "is read); a slower webhook's post is cut off and retried.",
        low=1,
        high=120,
    )
    attempts: int = _setting(
        6, "Posts of one notice to one target before it is given up (ERROR).", low=1, high=100
    )
    max_backoff: float = _setting(
        60.0, "Longest wait, in seconds, between two posts of one notice.", low=0.1, high=3600
    )
    queue_size: int = _setting(
        1000,
        "Notices waiting per target; when full the oldest is dropped (WARNING).",
        low=1,
        high=100_000,
    )


DRAINED_EVENT_TYPES = ["Freeze", "Reboot", "Redeploy", "Preempt", "Terminate"]


@dataclass(frozen=True)
class KubernetesSettings:
    enabled: bool = _setting(
        False,
        "Cordon and drain this VM's Kubernetes node before maintenance, and uncordon it after "
        "(docs/kubernetes.md); needs the kubernetes extra.",
    )
    node_name: str = _setting(
        "",
        "This VM's node name. Empty: the environment variable NODE_NAME (the DaemonSet sets "
        "it from the downward API), else the VM's name.",
    )
    kubeconfig: Path | None = _setting(
        None, "A kubeconfig file; none: the pod's service account (in-cluster)."
    )
    skip_label: str = _setting(
        "se-bridge.io/drain-skip", "Pods with this label are left on the node."
    )
    wait_label: str = _setting(
        "se-bridge.io/drain-wait-for-completion",
        "Pods with this label are not evicted: the drain waits until they finish.",
    )
    order_label: str = _setting(
        "se-bridge.io/drain-order",
        "An integer label: pods with a lower value are evicted first (none: 0); then those "
        "of a lower priority.",
    )
    evict_without_controller: bool = _setting(
        False,
        "Evict pods that no controller owns (kubectl drain's --force): evicted, such a pod is "
        "gone for good. Off: such a pod blocks the drain until it leaves or the deadline.",
    )
    pool_label: str = _setting(
        "kubernetes.azure.com/agentpool",
        "The node label naming its node pool (heartbeats' NodePool, the node_pool budget).",
    )
    give_up_before: float = _setting(
        60.0,
        "Seconds before the event's NotBefore at which the drain stops trying.",
        low=0,
        high=86400,
    )
    on_deadline: str = _setting(
        "hold",
        "What a drain that reaches its deadline does: hold (not ready: the platform starts "
        "the event at NotBefore) or approve (ready anyway; the Hook record says why).",
        choices=("hold", "approve"),
    )
    eviction_retry: float = _setting(
        5.0,
        "Seconds between attempts to evict a pod whose eviction was refused.",
        low=0.1,
        high=600,
    )
    blocked_report_interval: float = _setting(
        60.0,
        "Seconds between Hook records (DrainStatus Blocked) while a drain stays blocked.",
        low=1,
        high=86400,
    )
    pod_poll_interval: float = _setting(
        1.0,
        "Seconds between looks at the pods still on the node while it drains (each look is "
        "one list of the node's pods from the API server).",
        low=0.1,
        high=60,
    )
    event_types: list[str] = _setting(
        DRAINED_EVENT_TYPES,
        "The event types that drain the node; others are ready at once, undrained.",
    )
    rebalance_drain_for: float = _setting(
        3600.0,
        "Seconds a drain the consumer granted on a Spot rebalance recommendation may take "
        "before it gives up (nothing waits for it: no NotBefore bounds it; the Preempt that "
        "may follow drains on its own).",
        low=1,
        high=86400,
    )


@dataclass(frozen=True)
class PeopleSettings:
    tenant_id: str = _setting(
        "",
        "Entra ID tenant (directory) id whose tokens the approval API accepts; empty: no Entra "
        "ID sign-in (the standalone consumer's page is then for one operator on loopback).",
    )
    audience: list[str] = _setting(
        [],
        "The API app registration's Application ID URI and/or client id a token must be issued "
        "for (comma-separated); the CLI asks for a token for the first one's /.default.",
    )
    jwks_url: str = _setting(
        "",
        "Where the tenant's token signing keys are; empty: "
        "https://login.microsoftonline.com/<tenant_id>/discovery/v2.0/keys.",
    )
    role: str = _setting(
        "SeBridge.Decide", "The app role (its value) a person needs to approve, hold or pause."
    )
    page_address: str = _setting(
        "",
        "PORT or HOST:PORT where the standalone consumer serves the approval page and its API; "
        "a bare port listens on 127.0.0.1. Only a loopback address unless tenant_id and "
        "audience are set. Empty: no page.",
        flag=Flag(
            "--page-address",
            "[HOST:]PORT",
            "serve the approval page and its API here; a bare port listens on 127.0.0.1, and "
            "without Entra ID settings only loopback is allowed",
            default="off",
        ),
    )
    session_idle: float = _setting(
        1800.0,
        "Seconds a session of the standalone consumer's loopback page lasts unused; then sign "
        "in again. Rewriting the operator-token file ends every session at once.",
        low=60,
        high=86400,
    )
    api_url: str = _setting(
        "",
        "Where `se-bridge approve`, `hold`, `pause` and `resume` send a decision: the approval "
        "page's base URL (https://APP.azurewebsites.net); empty: http://<page_address>.",
        flag=Flag("--api", "URL", "the approval API's base URL", "http://<page_address>"),
    )


@dataclass(frozen=True)
class EventGridSettings:
    """Azure's own view of the fleet, read from Event Grid (preview; docs/second-source.md)."""

    enabled: bool = _setting(
        False,
        "Read Azure's scheduled-events system topic (Microsoft.ResourceNotifications."
        "MaintenanceResources, preview) from the event hub eventgrid.hub as a second source "
        "beside the agents. Off: nothing changes.",
    )
    health: bool = _setting(
        False,
        "Also read resource health (Microsoft.ResourceNotifications.HealthResources, preview) "
        "from that hub: a VM Azure reports Unavailable or Degraded counts as impacted in every "
        "budget until it is Available again. Needs enabled.",
    )
    hub: str = _setting(
        "",
        "The event hub the system topics' event subscriptions deliver to, in the namespace of "
        "eventhubs.namespace (or eventgrid.connection_string's); with consumer.hub (a local "
        "hub), the local hub directory they are delivered to (the simulator's Event Grid).",
    )
    connection_string: str = _setting(
        "",
        "SAS connection string of that hub, instead of the namespace with Entra ID.",
        secret=True,
    )
    subscriptions: list[str] = _setting(
        [],
        "The subscription ids whose system topics are trusted: a delivery from another topic, "
        "or about a resource of another subscription, is refused. Required when enabled.",
    )
    resource_groups: list[str] = _setting(
        [],
        "The fleet's resource groups (NAME, or SUBSCRIPTION/NAME): a delivery about a VM "
        "outside them is refused. Empty: every resource group of eventgrid.subscriptions.",
    )
    acknowledge: bool = _setting(
        False,
        "Approve through ARM's acknowledge (Microsoft.Maintenance, preview) what no live agent "
        "can carry: an event Event Grid told of whose VMs have no agent, or whose agents are "
        "all silent or refused it. Same policy, budgets and audit; needs enabled and the role "
        "Scheduled Events Contributor for the consumer's identity (docs/second-source.md).",
    )
    arm_endpoint: str = _setting(
        "https://management.azure.com",
        "Azure Resource Manager's endpoint for eventgrid.acknowledge (another cloud's, e.g. "
        "https://management.usgovcloudapi.net).",
    )
    reconcile_interval: float = _setting(
        0.0,
        "Seconds between two passes of the Resource Graph reconciler, which reads the scheduled "
        "events and VM health Azure holds and folds in what a lost Event Grid delivery missed "
        "(preview; needs enabled and Reader on eventgrid.subscriptions). 0: off; else 60 to "
        "86400 (in the Azure Functions app, a number of minutes that divides an hour or of "
        "hours that divides a day).",
        low=0,
        high=86400,
    )
    resource_graph_url: str = _setting(
        "https://management.azure.com",
        "Azure Resource Manager's address, where the reconciler, the patch runs and the week "
        "ahead ask Resource Graph (another cloud's, such as https://management.usgovcloudapi.net).",
        url=True,
    )


@dataclass(frozen=True)
class PatchRunSettings:
    """Guest patch runs of Azure Update Manager counted in the budgets (issue 40; preview
    events; docs/planned-disruptions.md)."""

    enabled: bool = _setting(
        False,
        "Read Update Manager's pre- and post-maintenance events (Microsoft.Maintenance."
        "PreMaintenanceEvent and PostMaintenanceEvent) from eventgrid.hub, resolve each run's "
        "VMs through Resource Graph (the configuration's assignments and dynamic scopes) and "
        "count them as impacted in every budget from the run's start to its post-event. Needs "
        "eventgrid.enabled and Reader on eventgrid.subscriptions. Off: those events are left "
        "aside.",
    )
    on_breach: str = _setting(
        "run",
        "What a patch run that would take a budget group over its limit gets: run (it runs, "
        "counted, with a WARNING and a Decision record), ask (a person of patchruns.ask_target "
        "decides until two cancel_margins before the run's cancellation cut-off), or cancel "
        "(se-bridge cancels it through applyUpdates before the cut-off; needs "
        "patchruns.cancel).",
        choices=("run", "ask", "cancel"),
    )
    cancel: bool = _setting(
        False,
        "Allow se-bridge to cancel a patch run (Microsoft.Maintenance applyUpdates with status "
        "Cancel, preview API), by on_breach cancel or a person's answer: the strongest action "
        "it takes on Azure. Needs the role infra/ grants with patchRunCancel.",
    )
    ask_target: str = _setting(
        "",
        "The people asked about a run that would break a budget (on_breach ask), as an ask "
        "rule's target names them on the people desk (consumer.people).",
    )
    on_deadline: str = _setting(
        "run",
        "What an unanswered ask does at its deadline (patchruns.cancel_margin before the "
        "cut-off): run, or cancel (needs patchruns.cancel).",
        choices=("run", "cancel"),
    )
    cancel_margin: float = _setting(
        120.0,
        "Seconds before a run's cancellation cut-off after which se-bridge no longer asks ARM "
        "to cancel it: the request must reach Azure before the cut-off, never after.",
        low=30,
        high=1800,
    )
    grace: float = _setting(
        1800.0,
        "Seconds after a run's scheduled end (the pre-event's endDateTime) its VMs stay "
        "counted when its post-event never comes: the window ends the installs, and a VM "
        "rebooted at its very end is back within this.",
        low=0,
        high=86400,
    )
    api_version: str = _setting(
        "2023-10-01-preview",
        "The Microsoft.Maintenance api-version of the applyUpdates cancel (a preview one: "
        "the examples of Azure's REST specs name this one).",
    )


@dataclass(frozen=True)
class WeekAheadSettings:
    """The week ahead (issue 40): the maintenance configurations' runs of the next 14 days,
    read from Resource Graph and checked against the budgets (docs/planned-disruptions.md)."""

    enabled: bool = _setting(
        False,
        "Read the guest patching maintenance configurations of weekahead.subscriptions (or "
        "eventgrid.subscriptions) through Resource Graph every weekahead.interval, and write an "
        "Upcoming record per VM and run of the next 14 days, naming the budgets the run would "
        "break; `se-bridge status --consumer` lists the breaks. Needs Reader on those "
        "subscriptions. Off: nothing is read.",
    )
    interval: float = _setting(
        21600.0,
        "Seconds between two reads of the week ahead (each costs one Resource Graph query, "
        "and one more per configuration with a run ahead). In the Azure Functions app, a number "
        "of minutes that divides an hour or of hours that divides a day.",
        low=900,
        high=86400,
    )
    subscriptions: list[str] = _setting(
        [],
        "The subscription ids whose maintenance configurations, assignments and dynamic "
        "scopes are read. Empty: eventgrid.subscriptions.",
    )


# Sections that live in another's table: [consumer.people] is Config.people, and its
# environment variables are SE_BRIDGE_CONSUMER_PEOPLE_<KEY>.
NESTED = {"people": "consumer"}


@dataclass(frozen=True)
class Config:
    agent: AgentSettings = field(default_factory=AgentSettings)
    imds: ImdsSettings = field(default_factory=ImdsSettings)
    spool: SpoolSettings = field(default_factory=SpoolSettings)
    hooks: HooksSettings = field(default_factory=HooksSettings)
    eventhubs: EventHubsSettings = field(default_factory=EventHubsSettings)
    loganalytics: LogAnalyticsSettings = field(default_factory=LogAnalyticsSettings)
    identity: IdentitySettings = field(default_factory=IdentitySettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    commands: CommandsSettings = field(default_factory=CommandsSettings)
    consumer: ConsumerSettings = field(default_factory=ConsumerSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    kubernetes: KubernetesSettings = field(default_factory=KubernetesSettings)
    people: PeopleSettings = field(default_factory=PeopleSettings)
    eventgrid: EventGridSettings = field(default_factory=EventGridSettings)
    patchruns: PatchRunSettings = field(default_factory=PatchRunSettings)
    weekahead: WeekAheadSettings = field(default_factory=WeekAheadSettings)

    def sink_specs(self) -> list[str]:
        return self.agent.sinks or [f"jsonl:{self.agent.state_dir / 'records.jsonl'}"]

    # The consumer's own settings win; where one is not set, the [agent] one that configs
    # written before it had its own set for it (see consumer_settings_under_agent).
    def consumer_state_dir(self) -> Path:
        return self.consumer.state_dir or self.agent.state_dir

    def consumer_log_level(self) -> str:
        return self.consumer.log_level or self.agent.log_level

    def consumer_log_format(self) -> str:
        return self.consumer.log_format or self.agent.log_format


S = TypeVar("S")


@dataclass(frozen=True)
class _Layer:
    """One source of settings: the file (with the line of each table and key), the
    environment (with the name of each variable as typed) or the command line."""

    origin: str  # "file", "environment", "command line"
    data: dict[str, Any]
    path: Path | None = None
    lines: Mapping[tuple[str, ...], int] = field(default_factory=dict)

    def at(self, *steps: str) -> str:
        """`PATH:LINE: ` where the file writes `steps` (a table, or a table's key); ''
        for the other layers."""
        if self.path is None:
            return ""
        line = self.lines.get(steps) or self.lines.get(steps[:-1])
        return f"{self.path}:{line}: " if line else f"{self.path}: "

    def where(self, section: str, key: str) -> str:
        """The setting `key` of `section` as an error names it, and where its value came from."""
        name = f"{dotted(section)}.{key}"
        if self.path is not None:
            return f"{self.at(*dotted(section).split('.'), key)}{name}"
        if self.origin == "environment":
            return f"{name} (from {env_name(section, key)})"
        return f"{name} (from the {self.origin})"


def load(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Build the Config; `flags` maps "section.key" to values given on the command line."""
    layers = [
        _read_file(path) if path else _Layer("file", {}),
        _Layer("environment", _from_env(os.environ if environ is None else environ)),
        _Layer("command line", _nest(flags or {})),
    ]
    _reject_unknown(layers[0], layers[2])
    sections = {}
    for f in dataclasses.fields(Config):
        section_cls = get_type_hints(Config)[f.name]
        sections[f.name] = _section(f.name, section_cls, layers)
    return Config(**sections)


def consumer_settings_under_agent(config: Config) -> list[str]:
    """The UNDER_AGENT keys the consumer takes from [agent]: set there, not under [consumer]."""
    defaults = AgentSettings()
    return [
        key
        for key in UNDER_AGENT
        if getattr(config.consumer, key) is None
        and getattr(config.agent, key) != getattr(defaults, key)
    ]


def warn_of_consumer_settings_under_agent(config: Config) -> None:
    """One WARNING, at the consumer's start, when it still reads settings under [agent]."""
    keys = consumer_settings_under_agent(config)
    if keys:
        log.warning(
            "the consumer reads %s because %s are not set; agent.* settings are the agent's "
            "and a later release will stop reading them for the consumer: rename them in the "
            "consumer's config (or set %s)",
            ", ".join(f"agent.{key}" for key in keys),
            ", ".join(f"consumer.{key}" for key in keys),
            ", ".join(f"{ENV_PREFIX}CONSUMER_{key.upper()}" for key in keys),
        )


def warn_if_secrets_readable(path: Path | None) -> None:
    """Say (WARNING) when the config file holds a secret and every user may read it."""
    if path is None or not host.readable_by_others(path):
        return
    data = _read_file(path).data
    held = [
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(Config)
        for f in dataclasses.fields(get_type_hints(Config)[section.name])
        if f.metadata.get("secret")
        and isinstance(data.get(section.name), dict)
        and _holds_secret(data[section.name].get(f.name))
    ]
    if held:
        log.warning(
            "the config file %s holds %s and every user of this machine can read it: "
            "chmod 600 %s (or 640 with the agent's group)",
            path,
            ", ".join(held),
            path,
        )


def _holds_secret(value: Any) -> bool:
    """Whether a secret setting's value in the file is one: notify.targets only with a `url`
    (a `url_secret` is a name in Key Vault)."""
    if isinstance(value, list):
        return any(isinstance(table, dict) and table.get("url") for table in value)
    return bool(value)


def _read_file(path: Path) -> _Layer:
    """The file's settings, its nested tables ([consumer.people]) lifted to the sections they
    are, with the line of each table and key."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
        data: dict[str, Any] = tomllib.loads(text)
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text: {err.reason}") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"config file {path} is not valid TOML: {err}") from err
    layer = _Layer("file", data, path, _toml_lines(text))
    for name, parent in NESTED.items():
        if name in data:
            raise ConfigError(
                f"{layer.at(name)}unknown section [{name}]; did you mean [{parent}.{name}]?"
            )
        table = data.get(parent)
        if isinstance(table, dict) and name in table:
            rest = dict(table)
            data = {**data, parent: rest, name: rest.pop(name)}
    return dataclasses.replace(layer, data=data)


_TOML_TABLE = re.compile(r"\s*\[\[?([^\[\]]+)\]\]?\s*(?:#.*)?")
_TOML_KEY = re.compile(r"\s*([A-Za-z0-9_.\-\"' ]+?)\s*=")


def _toml_lines(text: str) -> dict[tuple[str, ...], int]:
    """The line (from 1) where the file first writes each table and each table's key, by
    path: ("agent",), ("agent", "poll_interval"), ("consumer", "people", "role"). tomllib
    keeps no positions; this reads the lines the way people write TOML (one key or header a
    line), which is all an error's line number needs."""
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _TOML_TABLE.fullmatch(line)
        key = None if header else _TOML_KEY.match(line)
        if header:
            table = _toml_path(header.group(1))
            lines.setdefault(table, number)
        elif key:
            lines.setdefault((*table, *_toml_path(key.group(1))), number)
    return lines


def _toml_path(text: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in text.split("."))


def _from_env(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The settings the environment sets, by section. A variable that names no setting is
    ignored with a WARNING naming it as typed, when it looks meant for one (in a section's
    name space, or a misspelt section): a hook's SE_BRIDGE_EVENT_ID is not."""
    names = {
        env_name(section.name, f.name): (section.name, f.name)
        for section in dataclasses.fields(Config)
        for f in dataclasses.fields(get_type_hints(Config)[section.name])
    }
    spaces = tuple(
        f"{ENV_PREFIX}{dotted(f.name).replace('.', '_').upper()}_"
        for f in dataclasses.fields(Config)
    )
    out: dict[str, dict[str, Any]] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        found = names.get(name.upper())
        if found is not None:
            out.setdefault(found[0], {})[found[1]] = value
            continue
        close = difflib.get_close_matches(name.upper(), list(names), n=1, cutoff=0.85)
        if name.upper().startswith(spaces) or (close and _section_like(name, spaces)):
            log.warning(
                "ignoring %s: no setting has that name%s",
                name,
                f" (did you mean {close[0]}?)" if close else "",
            )
    return out


def _section_like(name: str, spaces: tuple[str, ...]) -> bool:
    """Whether `name` starts with a misspelt section (SE_BRIDGE_AGNT_...), not with a word of
    other SE_BRIDGE_ variables (a hook's SE_BRIDGE_VM_NAME, the Functions host's
    SE_BRIDGE_EVENTHUBS)."""
    word, underscore, rest = name.upper()[len(ENV_PREFIX) :].partition("_")
    sections = [space[len(ENV_PREFIX) : -1].partition("_")[0] for space in spaces]
    return bool(underscore and rest) and bool(
        difflib.get_close_matches(word, sections, n=1, cutoff=0.75)
    )


def dotted(section: str) -> str:
    """A section's name as the file and the docs spell it: consumer.people for people."""
    return f"{NESTED[section]}.{section}" if section in NESTED else section


def _nest(flags: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for dotted, value in flags.items():
        if value is not None:
            section, _, key = dotted.partition(".")
            out.setdefault(section, {})[key] = value
    return out


def _section(name: str, cls: type[S], layers: list[_Layer]) -> S:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for layer in layers:
        section = layer.data.get(name, {})
        if not isinstance(section, dict):
            raise ConfigError(
                f"{layer.at(name)}[{dotted(name)}] must be a table"
                + ("" if layer.path else f" in the {layer.origin}")
            )
        for key, raw in section.items():
            if key not in fields:
                raise ConfigError(_unknown_setting(name, key, list(fields), layer))
            values[key] = _convert(raw, hints[key], fields[key].metadata, layer.where(name, key))
    return cls(**values)


def _unknown_setting(section: str, key: str, keys: list[str], layer: _Layer) -> str:
    """What to say of `key`, which `section` has not: the nearest setting, or the nearest
    table nested in it ([consumer.people]), and the settings it has."""
    name = dotted(section)
    tables = {f"[{dotted(child)}]": child for child, parent in NESTED.items() if parent == name}
    close = difflib.get_close_matches(key, keys + list(tables.values()), n=1, cutoff=0.6)
    guess = ""
    if close:
        nested = next((shown for shown, child in tables.items() if child == close[0]), None)
        guess = f" (did you mean {nested or f'{name}.{close[0]}'}?)"
    where = layer.at(*name.split("."), key) if layer.path else ""
    origin = "" if layer.path else f" in the {layer.origin}"
    return (
        f"{where}unknown setting {name}.{key}{origin}{guess}; the settings of [{name}]: "
        f"{', '.join(keys)}"
    )


def env_name(section: str, key: str) -> str:
    """The environment variable of setting `key` of `section` (a Config field's name)."""
    return f"{ENV_PREFIX}{dotted(section).replace('.', '_').upper()}_{key.upper()}"


def sections() -> list[str]:
    """The sections a file may have, as it spells them, each nested one after its parent."""
    names = [f.name for f in dataclasses.fields(Config) if f.name not in NESTED]
    nested = {name: [dotted(c) for c, parent in NESTED.items() if parent == name] for name in names}
    return [shown for name in names for shown in (name, *nested[name])]


def add_flags(parser: argparse._ActionsContainer, *names: str, before: str = "") -> None:
    """The command-line options of the settings `names` ("agent.state_dir", "people.api_url"),
    each as its field's Flag says, `before` ahead of each one's help ("with --consumer: ").
    A list setting's option may be repeated; a number's and a path's are converted."""
    for name in names:
        flag, kind = flag_of(name), _field_type(name)
        options: dict[str, Any] = {"dest": _dest(flag), "help": before + flag_help(name)}
        if flag.const is not None:
            options.update(action="store_const", const=flag.const)
        elif kind == list[str]:
            options.update(action="append", metavar=flag.metavar)
        else:
            converts = (
                Path if kind in (Path, Path | None) else kind if kind in (int, float) else None
            )
            options.update(type=converts, metavar=flag.metavar)
        parser.add_argument(flag.name, **options)


def given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The settings `names` as add_flags' options (or bridge.cli's logging ones) gave them,
    None where not given: load's `flags`."""
    return {name: getattr(args, _dest(flag_of(name))) for name in names}


def flag_of(name: str) -> Flag:
    """The command-line option of the setting `name` ("section.key")."""
    section, _, key = name.partition(".")
    fields = {f.name: f for f in dataclasses.fields(get_type_hints(Config)[section])}
    flag = fields[key].metadata["flag"]
    if flag is None:
        raise KeyError(f"the setting {name} has no command-line option")
    return flag  # type: ignore[no-any-return]


def flag_help(name: str, *, default: str = "") -> str:
    """The --help of the setting `name`'s option: what it is, then the setting, its environment
    variable and its default (`default`, else the Flag's, else the field's own)."""
    flag = flag_of(name)
    section, _, key = name.partition(".")
    setting, env = f"{dotted(section)}.{key}", env_name(section, key)
    if flag.const is not None:
        return f"{flag.help} (setting {setting}, {env}={flag.const})"
    several = _field_type(name) == list[str]
    about = f"setting {setting}, {env}" + (", comma-separated" if several else "")
    shown = default or flag.default or _flag_default(getattr(Config(), section), key)
    if shown:
        about += f"; default {shown}"
    return f"{flag.help}{'; repeat for several' if several else ''} ({about})"


def _field_type(name: str) -> Any:
    section, _, key = name.partition(".")
    return get_type_hints(get_type_hints(Config)[section])[key]


def _flag_default(settings: Any, key: str) -> str:
    """A field's default as an option's help says it; '' for none."""
    value = getattr(settings, key)
    if value is None or value in ("", []):
        return ""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return bound(value) if number else str(value)


def _dest(flag: Flag) -> str:
    return flag.name.lstrip("-").replace("-", "_")


def _reject_unknown(file: _Layer, flags: _Layer) -> None:
    known = {f.name for f in dataclasses.fields(Config)}
    for layer in (file, flags):
        for section in layer.data:
            if section not in known:
                close = difflib.get_close_matches(section, sections(), n=1, cutoff=0.6)
                guess = f" (did you mean [{close[0]}]?)" if close else ""
                raise ConfigError(
                    f"{layer.at(section)}unknown section [{section}]{guess}; "
                    f"the sections: {', '.join(sections())}"
                )


class _NotTheForm(ValueError):
    """A value that is not of the setting's form at all; the error says what the form is."""


def _convert(raw: Any, kind: Any, meta: Mapping[str, Any], where: str) -> Any:
    shown = "a secret value" if meta.get("secret") else repr(raw)
    try:
        value = _command(raw) if meta.get("command") else _coerce(raw, kind)
        if meta.get("url"):
            value = _base_url(str(value))
    except _NotTheForm:
        raise ConfigError(f"{where}: expected {_form(raw, kind, meta)}, got {shown}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}, got {shown}") from err
    low, high = meta.get("low"), meta.get("high")
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if numeric and low is not None and high is not None and not low <= value <= high:
        raise ConfigError(f"{where}: must be between {bound(low)} and {bound(high)}, got {shown}")
    choices = {choice.upper(): choice for choice in meta.get("choices") or ()}
    if not choices:
        return value
    if str(value).upper() not in choices:
        raise ConfigError(f"{where}: must be one of {', '.join(choices.values())}, got {shown}")
    return choices[str(value).upper()]


_UNIT_SECONDS = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_WITH_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|sec|s|min|m|h|d)\s*", re.IGNORECASE)


def _form(raw: Any, kind: Any, meta: Mapping[str, Any]) -> str:
    """What a number setting takes, as an error says it: `a number of seconds from 0.2 to 60
    (no unit: write 300 for 5m)` for a duration written with its unit."""
    seconds = "seconds" in str(meta.get("help", "")).lower()
    form = "a whole number" if kind is int else "a number of seconds" if seconds else "a number"
    if meta.get("low") is not None and meta.get("high") is not None:
        form += f" from {bound(meta['low'])} to {bound(meta['high'])}"
    unit = _WITH_UNIT.fullmatch(raw) if isinstance(raw, str) and seconds else None
    if unit:
        value = float(unit.group(1)) * _UNIT_SECONDS[unit.group(2).lower()]
        form += f" (no unit: write {value:g} for {raw.strip()})"
    return form


def _coerce(raw: Any, kind: Any) -> Any:
    if kind is bool:
        return _boolean(raw)
    if kind in (int, float):
        return _number(raw, kind)
    if kind is Path or kind == (Path | None):
        text = str(raw).strip()
        if not text:
            if kind is Path:
                raise ValueError("expected a path")
            return None
        return Path(os.path.expanduser(text))
    if kind in (list[str], list[NotifyTarget]):
        return _string_list(raw) if kind == list[str] else _notify_targets(raw)
    if not isinstance(raw, str):
        raise TypeError("expected a string")
    return raw.strip()


def _number(raw: Any, kind: type[float]) -> float:
    """A TOML number, or one written as text (the environment, a flag); _NotTheForm else."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise _NotTheForm
    try:
        number = float(raw.strip() if isinstance(raw, str) else raw)
    except ValueError:
        raise _NotTheForm from None
    if not math.isfinite(number) or (kind is int and not number.is_integer()):
        raise _NotTheForm
    return kind(number)


def _base_url(text: str) -> str:
    """An HTTP base URL (http://HOST[:PORT][/PREFIX]); ValueError saying what to write."""
    parts = urllib.parse.urlsplit(text)
    form = "expected http://HOST[:PORT][/PREFIX] such as http://169.254.169.254"
    if "://" not in text:
        raise ValueError(f"{form}; write http://{text}" if text else form)
    try:
        parts.port  # noqa: B018 - read for its ValueError on a port that is no number
    except ValueError:
        raise ValueError(f"{form}; the port must be a number from 1 to 65535") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(form)
    if parts.query or parts.fragment:
        raise ValueError(f"{form}, without ?QUERY or #FRAGMENT (the agent adds api-version)")
    return text.rstrip("/")


def _notify_targets(raw: Any) -> list[NotifyTarget]:
    """notify.targets from TOML tables, or their JSON text from the environment or a flag.

    No message quotes a value: a target's URL is a secret."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else []
        except ValueError:
            raise ValueError("expected a JSON list of tables") from None
    if not isinstance(raw, list):
        raise TypeError("expected a list of tables")
    targets: list[NotifyTarget] = []
    for index, table in enumerate(raw):
        if not isinstance(table, dict):
            raise TypeError(f"target {index + 1} is not a table")
        name = table.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise ValueError(f"target {index + 1} needs a name of letters, digits, _ . or -")
        unknown = sorted(set(table) - set(_TARGET_KEYS))
        if unknown or not all(isinstance(table.get(k, ""), str) for k in _TARGET_KEYS):
            raise ValueError(
                f"target {name}: the keys are strings {', '.join(_TARGET_KEYS)}"
                + (f", not {', '.join(unknown)}" if unknown else "")
            )
        kind = table.get("kind", "").strip().lower()
        if kind not in NOTIFY_KINDS:
            raise ValueError(f"target {name}: kind must be one of {', '.join(NOTIFY_KINDS)}")
        url, url_secret = table.get("url", "").strip(), table.get("url_secret", "").strip()
        if bool(url) == bool(url_secret):
            raise ValueError(f"target {name}: give url or url_secret, one of them")
        if url and not url.lower().startswith(("https://", "http://")):
            raise ValueError(f"target {name}: url must be an http(s) address")
        if name in {t.name for t in targets}:
            raise ValueError(f"two targets are named {name}")
        targets.append(NotifyTarget(name, kind, url, url_secret))
    return targets


def _boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower() if isinstance(raw, str) else None
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise ValueError("expected true or false")


def _command(raw: Any) -> str | list[str] | None:
    if isinstance(raw, str):
        return raw.strip() or None
    command = _string_list(raw)
    if not command:
        raise ValueError("an argv list must not be empty")
    return command


def _string_list(raw: Any) -> list[str]:
    """A list from TOML, or a comma-separated string from the environment or a flag."""
    if isinstance(raw, str):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if isinstance(raw, (list, tuple)) and all(isinstance(v, str) for v in raw):
        return [str(v) for v in raw]
    raise TypeError("expected a list of strings")


def markdown_table() -> str:
    """The settings table of docs/configuration.md, from the dataclasses themselves."""
    lines = [
        "| Setting | Environment | Option | Default | Meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    defaults = Config()
    for section in dataclasses.fields(Config):
        for f in dataclasses.fields(getattr(defaults, section.name)):
            default = getattr(getattr(defaults, section.name), f.name)
            shown = "platform default" if f.name == "state_dir" else _show(default)
            env = env_name(section.name, f.name)
            meaning = f.metadata["help"]
            if f.metadata["low"] is not None:
                meaning += f" From {bound(f.metadata['low'])} to {bound(f.metadata['high'])}."
            name = f"{dotted(section.name)}.{f.name}"
            flag = f.metadata["flag"]
            option = "" if flag is None else f"`{flag.name}`"
            lines.append(f"| `{name}` | `{env}` | {option} | {shown} | {meaning} |")
    return "\n".join(lines) + "\n"


def bound(value: float) -> str:
    """A setting's bound as the docs and messages show it: 31622400, not 3.16224e+07."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _show(value: Any) -> str:
    if value is None or value in ([], ""):
        return "none"
    return f"`{value}`"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())

"""Building an agent from the configuration: its IMDS clients, sinks, spool and delivery, its
health, hooks and identity, and the approver that central commands (the command listener)
and the local policy share. `se-bridge agent`, the Windows service and the demo all start an
agent this way; tests give their own parts where the keywords allow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from bridge import extras, host, telemetry
from bridge.agent import imds, listener, localmode
from bridge.agent.approver import Approver
from bridge.agent.drains import DrainJobs
from bridge.agent.heartbeats import Heartbeats, PollHealth
from bridge.agent.hookjobs import HookJobs
from bridge.agent.imdscalls import ImdsCalls
from bridge.agent.instance import InstanceMetadata
from bridge.agent.loop import Agent, Parts
from bridge.agent.metrics import AgentMetrics
from bridge.agent.prepare import Book, Preparation, StepFactory
from bridge.config import DRAINED_EVENT_TYPES, Config, ConfigError, ImdsSettings
from bridge.kubernetes.api import KubeApi, KubeError
from bridge.outbox.delivery import Delivery
from bridge.outbox.spool import Spool
from bridge.policy.model import Policy
from bridge.records import Origin, utc_now
from bridge.retry import Backoff
from bridge.sinks import Sink, build


def build_agent(
    config: Config,
    *,
    now: Callable[[], datetime] = utc_now,
    boot_id: str | None = None,
    policy: Policy | None = None,
    sinks: Sequence[Sink] | None = None,
    client: imds.ImdsClient | None = None,
    open_inbox: listener.Opener | None = None,
    delivery_backoff: Callable[[], Backoff] = Backoff,
    kube: KubeApi | None = None,
) -> Agent:
    """The agent `config` describes. `policy`: local mode's, already loaded (else
    agent.policy's); `client`: one IMDS client for polls and approvals alike; `kube`: the
    Kubernetes API of [kubernetes] (else the lightkube client its settings describe).

    ConfigError when a setting cannot be used (a verify key that cannot be loaded), SpoolError
    or OSError when the spool cannot be opened.
    """
    kube = kube_api(config, kube)
    poll_imds = client or imds_client(config.imds)
    # Approvals have their own connection and thread: one never waits behind a poll that
    # IMDS is slow to answer (each is bounded by its own deadline).
    approval_imds = client or imds_client(config.imds, limiter=poll_imds.limiter)
    sinks = list(sinks) if sinks is not None else [build(s, config) for s in config.sink_specs()]
    spool = Spool(
        config.agent.state_dir / "spool.db",
        [sink.name for sink in sinks],
        max_records=config.spool.max_records,
        max_bytes=config.spool.max_bytes,
    )
    delivery = Delivery(spool, sinks, backoff_factory=delivery_backoff)
    metrics = AgentMetrics(telemetry.new_registry())
    notifier = telemetry.SystemdNotifier()
    calls = ImdsCalls(notifier)
    instance = InstanceMetadata(
        spool,
        host_name=host.host_name(),
        vm_name=config.agent.vm_name,
        refresh_every=config.imds.instance_refresh,
        stopping=calls.stopping,
    )
    poll = PollHealth(config.imds.url)

    def origin() -> Origin:  # read at each use: a refresh of instance metadata replaces it
        return instance.origin

    # Drains start on their own in local mode or with no command channel, else on a Prepare.
    on_sight = (policy or config.agent.policy) is not None or not config.commands.channel

    def hook_step(book: Book) -> HookJobs:
        return HookJobs(config.hooks, book, metrics, origin=origin, now=now)

    def drain_step(book: Book) -> DrainJobs:
        assert kube is not None  # only made with [kubernetes] on
        return DrainJobs(
            config.kubernetes, kube, book, spool, metrics, origin=origin, now=now, on_sight=on_sight
        )

    # The prepare step: the drain first, then the hook (docs/hooks.md).
    steps: list[StepFactory] = [drain_step] if kube is not None else []
    prepare = Preparation(spool, [*steps, hook_step])
    drain_jobs = next((s for s in prepare.steps if isinstance(s, DrainJobs)), None)
    approver = Approver(
        approval_imds,
        calls.approve,
        spool,
        origin,
        now,
        on_record=metrics.approval,
        prepare=prepare,
    )
    commands = listener.build(config, approver, now, open_inbox)
    local = localmode.build(config, approver, now, policy, prepared=prepare.ready_events)
    # Heartbeats say which prepare steps the VM has (HasPrepareHook, PrepareSteps) and name
    # the node.
    heartbeats = Heartbeats(
        spool,
        poll,
        metrics,
        now,
        interval=config.agent.heartbeat_interval,
        prepare_steps=prepare.names,
        node=drain_jobs.node_health if drain_jobs is not None else lambda: None,
    )
    parts = Parts(
        imds=poll_imds,
        approval_imds=approval_imds,
        calls=calls,
        spool=spool,
        sinks=sinks,
        delivery=delivery,
        metrics=metrics,
        notifier=notifier,
        poll=poll,
        instance=instance,
        heartbeats=heartbeats,
        prepare=prepare,
        approver=approver,
        listener=commands,
        local=local,
        drains=drain_jobs,
    )
    return Agent(config, parts, now=now, boot_id=host.boot_id() if boot_id is None else boot_id)


def check_kubernetes(config: Config) -> None:
    """ConfigError when [kubernetes] is on with settings it cannot drain with (at start, and
    in `se-bridge check`); nothing is opened or read."""
    settings = config.kubernetes
    if not settings.enabled:
        return
    unknown = sorted(set(settings.event_types) - set(DRAINED_EVENT_TYPES))
    if unknown:
        raise ConfigError(
            f"kubernetes.event_types: {', '.join(unknown)} is no event type; "
            f"known: {', '.join(DRAINED_EVENT_TYPES)}"
        )


def kube_api(config: Config, given: KubeApi | None) -> KubeApi | None:
    """The Kubernetes API of [kubernetes] when it is on (`given`, else the lightkube client its
    settings describe); ConfigError when its settings or the kubernetes extra do not allow it.
    Made before anything else of the agent, so a bad setting leaves nothing open."""
    check_kubernetes(config)
    settings = config.kubernetes
    if not settings.enabled:
        return None
    if given is not None:
        return given
    missing = extras.missing_message("kubernetes", "[kubernetes] enabled")
    if missing:
        raise ConfigError(missing)
    # Loaded here only: an agent without [kubernetes] imports no Kubernetes client.
    from bridge.kubernetes.client import LightkubeApi  # noqa: PLC0415 - on demand

    try:
        return LightkubeApi(settings.kubeconfig)
    except KubeError as err:
        raise ConfigError(f"[kubernetes]: {err}") from err


def imds_client(settings: ImdsSettings, limiter: imds.RateLimiter | None = None) -> imds.ImdsClient:
    """A client of the IMDS `settings` name; `limiter`: shared with another client of one VM."""
    return imds.ImdsClient(
        settings.url,
        settings.api_version,
        timeout=settings.timeout,
        first_call_timeout=settings.first_call_timeout,
        max_rps=settings.max_requests_per_second,
        limiter=limiter,
    )

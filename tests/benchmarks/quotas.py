"""The Azure quota model: per-VM operation counts, scaled to a fleet, held against each quota.

Pure: `bench_quota` measures the counts (real agents and a consumer against the doubles) and
this module turns them into load at N VMs, for the steady state and for each wave, and into
the fleet size at which each quota gives way. Every quota is quoted from Microsoft's pages
(the source and date beside it); the waves are issue 15's.

Who sees an event matters more than anything else here. Azure delivers an event to every VM
of its scope (availability set, or scale set placement group: up to 200 and 100 VMs), and each
agent reports each event of its document, affecting it or not (records carry AffectsThisVm).
So every count that follows an event is multiplied by the VMs that see it: `fanout` is 1
when only the VMs that `Resources` names see it (issue 15's model), and up to 100 for a
placement group.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

EH_QUOTAS = "https://learn.microsoft.com/azure/event-hubs/event-hubs-quotas (2026-02-05)"
MONITOR_LIMITS = (
    "https://learn.microsoft.com/azure/azure-monitor/fundamentals/service-limits (2025-08-28)"
)
STORAGE_ACCOUNT = (
    "https://learn.microsoft.com/azure/storage/common/scalability-targets-standard-account "
    "(2025-11-19)"
)
TABLE_TARGETS = "https://learn.microsoft.com/azure/storage/tables/scalability-targets"
KEYVAULT_LIMITS = "https://learn.microsoft.com/azure/key-vault/general/service-limits (2025-04-15)"
IMDS = "https://learn.microsoft.com/azure/virtual-machines/instance-metadata-service"

HEARTBEAT = 300.0  # agent.heartbeat_interval's default, seconds


@dataclass(frozen=True)
class Measured:
    """What one agent and the consumer did, per unit, in the measured run.

    "Own" records are those of the VMs an event names; a neighbour's are those of the other
    VMs of its set, which report it too (AffectsThisVm false). Where a neighbour's cost was
    not measured (None) it is taken as an own record's.
    """

    connection_seconds_per_send: float  # an agent's Event Hubs connection held, per send burst
    events_per_heartbeat: float  # Event Hubs events (records) per heartbeat
    la_requests_per_send: float  # Logs Ingestion requests per send burst
    la_bytes_per_record: float  # JSON bytes per record sent to Logs Ingestion
    sends_per_event: float  # send bursts one agent makes for one event it sees, first to last
    records_per_event: float  # records one agent sends for one event it sees
    # An agent reads its queue faster for a few seconds after an event that affects it
    # appears (bridge.agent.listener, FIRST_READS_FOR): the reads beyond the steady rate's,
    # once per event, whatever its notice; then the steady rate while it is Scheduled.
    queue_reads_per_event: float
    queue_reads_per_pending_second: float  # 1/commands.poll_interval
    others_reads_per_second: float  # while only its neighbours' events are (1/others_interval)
    table_ops_per_heartbeat: float  # the consumer's Table Storage requests per heartbeat
    table_ops_per_event_record: float  # and per record about an event
    # Entities those requests read or wrote (a query returns many), per collection: a
    # partition's target counts entities, and a collection spread over partitions
    # (`table_partitions`, bridge.consumer.documents.PARTITIONS) shares them out by key.
    table_entities_per_heartbeat: Mapping[str, float]
    table_entities_per_event_record: Mapping[str, float]
    blob_ops_per_second: float  # the consumer's checkpoint and ownership blob requests
    # loganalytics.send_interval: after an upload, heartbeats and neighbours' events wait
    # this long for the next (0: none wait). The setting's default, not measured here.
    la_send_interval: float = 0.0
    neighbour_records_per_event: float | None = None
    neighbour_sends_per_event: float | None = None
    table_ops_per_neighbour_record: float | None = None
    table_entities_per_neighbour_record: Mapping[str, float] | None = None
    table_partitions: Mapping[str, int] = field(default_factory=dict)  # 1 where not named
    # Entities a second that neighbours' records can cost a collection at most, whatever
    # their number: the ledger, which their records never write and a batch never reads;
    # only the consumers' re-evaluation passes look at it, each at most every document.
    neighbour_caps: Mapping[str, float] = field(default_factory=dict)

    @property
    def neighbour(self) -> tuple[float, float, float, Mapping[str, float]]:
        """A neighbour's records and sends per event, and the consumer's table requests and
        entities per record of one."""
        return (
            _or(self.neighbour_records_per_event, self.records_per_event),
            _or(self.neighbour_sends_per_event, self.sends_per_event),
            _or(self.table_ops_per_neighbour_record, self.table_ops_per_event_record),
            self.table_entities_per_neighbour_record or self.table_entities_per_event_record,
        )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


@dataclass(frozen=True)
class Wave:
    """Events arriving at `events_per_second(n)` for `seconds`, each pending `pending` s."""

    name: str
    what: str
    share: float  # of the fleet that gets an event (0 with `count`)
    count: int  # a fixed number of events, whatever the fleet size (0 with `share`)
    seconds: float  # over this much fleet time
    pending: float  # seconds a VM's document holds the event as Scheduled, at worst (notice)

    def events_per_second(self, n: float) -> float:
        events = self.count if self.count else self.share * n
        return events / self.seconds if self.seconds else 0.0


STEADY = Wave("steady", "heartbeats only", 0.0, 0, 0.0, 0.0)
WAVES = (
    STEADY,
    # Notice: Freeze and Reboot 15 minutes, Preempt 30 s (the Scheduled Events page's table);
    # at worst budgets defer every event to its NotBefore, so each is pending that long.
    Wave("freeze", "regional host update: Freeze for 20% of the fleet in 30 min",
         0.20, 0, 1800.0, 900.0),
    Wave("spot-storm", "Spot eviction storm: 5,000 Preempt in 2 min", 0.0, 5000, 120.0, 30.0),
    Wave("rolling-reboot", "platform Reboot of whole scale sets, 10% of the fleet in 10 min",
         0.10, 0, 600.0, 900.0),
)  # fmt: skip


@dataclass(frozen=True)
class Quota:
    service: str
    name: str
    tier: str
    limit: float
    source: str
    measure: str  # which load it bounds: one of LOADS

    def load(self, measured: Measured, wave: Wave, n: float, fanout: float) -> float:
        return LOADS[self.measure](measured, wave, n, fanout)

    def breaks_at(self, measured: Measured, wave: Wave, fanout: float) -> float:
        """The fleet size at which the load reaches the limit (inf: never). Loads grow with
        the fleet, not always in proportion (a storm has a fixed size), so it is searched."""
        if self.load(measured, wave, 0.0, fanout) >= self.limit:
            return 0.0
        low, high = 0.0, 1e9
        if self.load(measured, wave, high, fanout) < self.limit:
            return math.inf
        while high - low > 1:
            middle = (low + high) / 2
            if self.load(measured, wave, middle, fanout) >= self.limit:
                high = middle
            else:
                low = middle
        return high


def _sightings(wave: Wave, n: float, fanout: float) -> tuple[float, float]:
    """Per second: (VM, event) pairs of VMs the event names, and of their neighbours."""
    events = wave.events_per_second(n)
    return events * min(1.0, fanout), events * max(0.0, fanout - 1)


def _sends_per_second(m: Measured, wave: Wave, n: float, fanout: float) -> float:
    own, others = _sightings(wave, n, fanout)
    return n / HEARTBEAT + own * m.sends_per_event + others * m.neighbour[1]


def _connections(m: Measured, wave: Wave, n: float, fanout: float) -> float:
    # Little's law: connections open at once = sends per second x seconds each is held.
    return _sends_per_second(m, wave, n, fanout) * m.connection_seconds_per_send


def _heartbeats(n: float) -> float:
    return n / HEARTBEAT


def _records(m: Measured, wave: Wave, n: float, fanout: float) -> tuple[float, float]:
    """Per second: records of events from the VMs they name, and from their neighbours."""
    own, others = _sightings(wave, n, fanout)
    return own * m.records_per_event, others * m.neighbour[0]


def _event_records(m: Measured, wave: Wave, n: float, fanout: float) -> float:
    return sum(_records(m, wave, n, fanout))


def _events(m: Measured, wave: Wave, n: float, fanout: float) -> float:
    return _heartbeats(n) * m.events_per_heartbeat + _event_records(m, wave, n, fanout)


def _la_requests_per_minute(m: Measured, wave: Wave, n: float, fanout: float) -> float:
    # The VMs an event affects upload at once (one VM in `fanout` sees it as its own); the
    # rest (heartbeats, neighbours' sightings) at most once per send interval per VM.
    own, others = _sightings(wave, n, fanout)
    own *= m.sends_per_event
    others = _heartbeats(n) + others * m.neighbour[1]
    if m.la_send_interval > 0:
        others = min(others, n / m.la_send_interval)
    return 60 * (own + others) * m.la_requests_per_send


def _la_bytes_per_minute(m: Measured, wave: Wave, n: float, fanout: float) -> float:
    return 60 * _events(m, wave, n, fanout) * m.la_bytes_per_record


def _storage_requests(m: Measured, wave: Wave, n: float, fanout: float) -> float:
    # A VM an event affects reads its queue in a burst as the event appears, then at
    # poll_interval while it is pending; the others that see it, at others_interval (no VM
    # reads twice). The consumer's table requests follow the records; its blob requests do
    # not grow with the fleet.
    pending = wave.events_per_second(n) * wave.pending
    affected = min(n, pending)
    seeing = max(affected, min(n, pending * fanout))
    bursts = _sightings(wave, n, fanout)[0]
    reads = (
        bursts * m.queue_reads_per_event
        + affected * m.queue_reads_per_pending_second
        + (seeing - affected) * m.others_reads_per_second
    )
    own, others = _records(m, wave, n, fanout)
    tables = (
        _heartbeats(n) * m.table_ops_per_heartbeat
        + own * m.table_ops_per_event_record
        + others * m.neighbour[2]
    )
    return reads + tables + m.blob_ops_per_second


def partition_loads(m: Measured, wave: Wave, n: float, fanout: float) -> dict[str, float]:
    """Entities per second one table partition of each collection takes (a spread
    collection's documents, thousands of VMs and events, fall evenly on its partitions)."""
    own, others = _records(m, wave, n, fanout)
    loads: dict[str, float] = {}
    for rate, per, caps in (
        (_heartbeats(n), m.table_entities_per_heartbeat, {}),
        (own, m.table_entities_per_event_record, {}),
        (others, m.neighbour[3], m.neighbour_caps),
    ):
        for collection, entities in per.items():
            load = min(rate * entities, caps.get(collection, math.inf))
            share = load / m.table_partitions.get(collection, 1)
            loads[collection] = loads.get(collection, 0.0) + share
    return loads


def _table_partition(m: Measured, wave: Wave, n: float, fanout: float) -> float:
    return max(partition_loads(m, wave, n, fanout).values(), default=0.0)


LOADS = {
    "connections": _connections,
    "events/s": _events,
    "requests/min": _la_requests_per_minute,
    "bytes/min": _la_bytes_per_minute,
    "storage requests/s": _storage_requests,
    "partition entities/s": _table_partition,
}

QUOTAS = (
    Quota("Event Hubs", "brokered connections per namespace", "Standard", 5000, EH_QUOTAS,
          "connections"),
    Quota("Event Hubs", "brokered connections per namespace", "Premium, 1 PU", 10000,
          EH_QUOTAS, "connections"),
    Quota("Event Hubs", "ingress events/s (1,000 per throughput unit, 40 TUs at most)",
          "Standard, 40 TUs", 40000, EH_QUOTAS, "events/s"),
    Quota("Logs Ingestion", "requests per minute per data collection rule", "(soft limit)",
          12000, MONITOR_LIMITS, "requests/min"),
    Quota("Logs Ingestion", "data per minute per data collection rule", "(soft limit)",
          2e9, MONITOR_LIMITS, "bytes/min"),
    Quota("Storage", "requests/s per account (regions outside the large-region list)",
          "Standard GPv2", 20000, STORAGE_ACCOUNT, "storage requests/s"),
    Quota("Storage", "requests/s per account (large regions)", "Standard GPv2", 40000,
          STORAGE_ACCOUNT, "storage requests/s"),
    Quota("Storage", "entities/s per table partition", "Standard GPv2", 2000, TABLE_TARGETS,
          "partition entities/s"),
)  # fmt: skip

# Quotas the fleet size does not move, and why (said in the report beside the table).
FIXED = (
    f"IMDS: 5 requests/s per VM ({IMDS}); an agent polls Scheduled Events once a second and "
    "asks the identity endpoint (20/s) only when a cached token nears expiry: per VM, "
    "whatever the fleet size.",
    f"Key Vault: 4,000 secret reads per 10 s per vault ({KEYVAULT_LIMITS}); the consumer "
    "reads the signing key once at start, agents never: it grows with consumers, not VMs.",
    f"Event Hubs partitions: 32 per event hub on Standard ({EH_QUOTAS}): at most 32 "
    "consumers (or Function App instances) read at once, whatever the fleet size.",
    "Microsoft Entra token requests: managed identity tokens are valid 24 hours and cached "
    "by each agent's credential; no fleet-wide issuance limit is documented.",
)


def fmt_fleet(n: float) -> str:
    if math.isinf(n):
        return "never"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{n:,.0f}"


def needed(quota: Quota, measured: Measured, fanout: float, n: float) -> int:
    """How many of the quota's unit (namespaces, rules, accounts, partitions) `n` VMs need at
    their worst wave, when the load can be spread evenly over them."""
    worst = max(quota.load(measured, wave, n, fanout) for wave in WAVES)
    return max(1, math.ceil(worst / quota.limit))


def table(measured: Measured, fanout: float, fleet: float = 100_000) -> list[str]:
    """Markdown rows: each quota, its worst wave at `fleet` VMs, where it breaks, and how many
    of its unit 10,000, 100,000 and 1,000,000 VMs need."""
    lines = [
        f"| Quota | Tier | Limit | Load at {fmt_fleet(fleet)} VMs (worst wave) | "
        "Breaks at (worst wave) | Holds at 100k | Needed for 10k / 100k / 1M VMs |",
        "|---|---|---|---|---|---|---|",
    ]
    for quota in QUOTAS:
        worst = min(WAVES, key=lambda w: quota.breaks_at(measured, w, fanout))
        at = quota.breaks_at(measured, worst, fanout)
        load = quota.load(measured, worst, fleet, fanout)
        sizes = " / ".join(str(needed(quota, measured, fanout, n)) for n in (1e4, 1e5, 1e6))
        lines.append(
            f"| {quota.service}: {quota.name} | {quota.tier} | {quota.limit:,.0f} | "
            f"{load:,.0f} {quota.measure} ({worst.name}) | {fmt_fleet(at)} | "
            f"{'yes' if at >= 100_000 else '**no**'} | {sizes} |"
        )
    return lines

"""8. Azure quotas at fleet scale: what real agents and a consumer do, counted against the
doubles, scaled to N VMs and held against each documented quota (tests/benchmarks/quotas.py).

Three agents (Event Hubs, Log Analytics, a Storage queue each) and one consumer (Table
Storage state, blob checkpoints) run against the Event Hubs test broker, the Logs Ingestion
double and Azurite behind counting proxies. Idle, with heartbeats every 30 s so that an
agent's connection closes between two of them as it does at the default 300 s: the broker's
open producer connections are sampled every 50 ms (any of the consumer's, measured before the
agents start, taken off), which gives the connection-seconds one send holds (none over HTTPS,
the agents' default). Then one Freeze event
per VM, approved by the consumer and completed: the records, send bursts and queue reads one
agent makes for an event it sees (the reads timed: a burst as the event appears, then a steady
rate while it is pending), and the consumer's table requests per record.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from bridge import schema
from bridge.agent.listener import FIRST_READS_FOR
from bridge.config import CommandsSettings, ConsumerSettings, LogAnalyticsSettings
from bridge.consumer import documents as fs
from bridge.consumer.ledger import LOCKS, SHARDS
from bridge.consumer.state.tables import collection_of
from tests.benchmarks import quotas
from tests.benchmarks.bench_approval import signing_pair
from tests.benchmarks.bench_cost import VMS, _connection_string, start_agents, start_consumer
from tests.benchmarks.countingproxy import CountingProxy, counted_azurite
from tests.benchmarks.report import Row
from tests.benchmarks.rig import Options, Result, say, scratch
from tests.doubles.eventhubs_broker import EventHubsBroker, StoredEvent
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.cloud import RULE
from tests.support.processes import Processes, Simulator

RUN_HEARTBEAT = 30.0
BURST_GAP = 2.0  # records of one VM further apart than this went in separate sends
FANOUTS = (1.0, 100.0)  # VMs that see each event: named ones only; a whole placement group
# Queue reads further apart than this are two events' (a VM reads at least every
# commands.poll_interval while one that affects it is pending, and not at all otherwise).
RUN_GAP = 5 * CommandsSettings().poll_interval


class Sampler:
    """The broker's open producer connections every 50 ms, integrated over time: a consumer's
    own (receivers, and management links that come and go with its questions to idle
    partitions) are not an agent's, and once counted as if they were."""

    def __init__(self, broker: EventHubsBroker) -> None:
        self._broker, self._stop = broker, threading.Event()
        self.samples: list[tuple[float, int]] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append((time.monotonic(), self._broker.sender_connection_count))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def mean(self, since: float = 0.0) -> float:
        kept = [count for t, count in self.samples if t >= since]
        return sum(kept) / max(1, len(kept))

    def seconds_above(self, baseline: float, since: float, until: float) -> float:
        """Connection-seconds above `baseline` between the two times."""
        total, last = 0.0, None
        for t, count in self.samples:
            if since <= t <= until:
                if last is not None:
                    total += max(0.0, count - baseline) * (t - last)
                last = t
        return total


@dataclass
class Window:
    began: float
    ended: float
    events: list[StoredEvent]
    la_requests: int
    la_records: int
    la_bytes: int
    storage: dict[str, Counter[str]]
    partitions: Counter[str]  # table requests by PartitionKey
    entities: Counter[str]  # table entities read or written, by PartitionKey
    reads: dict[str, list[float]]  # when each queue's messages were read, by queue


def run(options: Options) -> Result:
    idle = options.pick(quick=70, default=180)
    broker = EventHubsBroker(hub="records", partitions=4)
    logs = LogsIngestionDouble(RULE, schema.DCR_STREAM, schema.dcr_stream_declaration())
    with (
        broker,
        logs,
        scratch("quota") as procs,
        counted_azurite(procs.workdir / "azurite") as proxies,
        Sampler(broker) as sampler,
    ):
        measured, notes = _measure(procs, broker, logs, proxies, sampler, idle=idle)
    return _result(measured, notes)


def _window(
    broker: EventHubsBroker,
    logs: LogsIngestionDouble,
    proxies: dict[str, CountingProxy],
    seconds: float,
    until: threading.Event | None = None,
) -> Window:
    hub0, logs0, rows0 = len(broker.events()), len(logs.requests), len(logs.records())
    counts0 = {s: Counter(p.counts) for s, p in proxies.items()}
    parts0 = Counter(proxies["table"].partitions)
    entities0 = Counter(proxies["table"].entities)
    began = time.monotonic()
    if until is None:
        time.sleep(seconds)
    else:
        until.wait(seconds)
    ended = time.monotonic()
    requests = [r for r in logs.requests[logs0:] if r.status == 204]
    return Window(
        began,
        ended,
        broker.events()[hub0:],
        len(requests),
        len(logs.records()) - rows0,
        sum(r.uncompressed_size or 0 for r in requests),
        {s: Counter(p.counts) - counts0[s] for s, p in proxies.items()},
        Counter(proxies["table"].partitions) - parts0,
        Counter(proxies["table"].entities) - entities0,
        proxies["queue"].reads_between(began, ended),
    )


def _measure(
    procs: Processes,
    broker: EventHubsBroker,
    logs: LogsIngestionDouble,
    proxies: dict[str, CountingProxy],
    sampler: Sampler,
    *,
    idle: int,
) -> tuple[quotas.Measured, list[str]]:
    storage = _connection_string(proxies)
    tag = "q" + str(int(time.time()))[-6:]
    signing, verify = signing_pair(procs.workdir)
    start_consumer(procs, broker, storage, tag, signing)
    say("quota: the consumer alone for 15 s (its own connections)")
    time.sleep(10)
    mark = time.monotonic()
    time.sleep(5)
    baseline = sampler.mean(since=mark)
    sim = start_agents(procs, broker, logs, storage, tag, verify=verify, heartbeat=RUN_HEARTBEAT)
    sim.wait_polls(dict.fromkeys(VMS, 3))
    say(f"quota: warming up {RUN_HEARTBEAT:g} s, then {idle} s idle counted")
    time.sleep(RUN_HEARTBEAT + 10)
    quiet = _window(broker, logs, proxies, idle)
    kinds = Counter(json.loads(e.body)["RecordType"] for e in quiet.events)
    heartbeats = kinds["Heartbeat"]
    if not heartbeats:
        raise RuntimeError("no heartbeat reached Event Hubs in the idle window")
    held = sampler.seconds_above(baseline, quiet.began, quiet.ended)
    say("quota: one Freeze per VM, approved by the consumer, then completed")
    events, beats = _events(sim, broker, logs, proxies, VMS)
    per_event = _per_event(events)
    quiet_table = sum(quiet.storage["table"].values())
    per_beat = quiet_table / max(1, len(quiet.events))
    # The event window's heartbeats cost what idle ones did; the rest is the events'.
    table_ops = max(0.0, sum(events.storage["table"].values()) - beats * per_beat)
    records_seen = len(events.events)
    per_beat_entities = _per(_collections(quiet.entities), len(quiet.events))
    spent = _less(_collections(events.entities), per_beat_entities, beats)
    entities = _per(spent, records_seen)
    reads = queue_reads(events.reads)
    say("quota: three VMs of one availability set: each event seen by all three, named one")
    neighbours = _neighbours(
        procs,
        broker,
        logs,
        proxies,
        storage=storage,
        tag=tag,
        verify=verify,
        per_beat=per_beat,
        per_beat_entities=per_beat_entities,
        own_ops=table_ops / max(1, records_seen),
        own_entities=entities,
    )
    measured = quotas.Measured(
        connection_seconds_per_send=held / heartbeats,
        events_per_heartbeat=sum(kinds.values()) / heartbeats,
        la_requests_per_send=quiet.la_requests / heartbeats,
        la_bytes_per_record=quiet.la_bytes / max(1, quiet.la_records),
        sends_per_event=per_event.sends,
        records_per_event=per_event.records,
        queue_reads_per_event=reads.per_event,
        queue_reads_per_pending_second=reads.per_second,
        # Not measured: the simulated VMs here see only their own events. The setting's default.
        others_reads_per_second=1 / CommandsSettings().others_interval,
        la_send_interval=LogAnalyticsSettings().send_interval,
        table_ops_per_heartbeat=per_beat,
        table_ops_per_event_record=table_ops / max(1, records_seen),
        table_entities_per_heartbeat=per_beat_entities,
        table_entities_per_event_record=entities,
        blob_ops_per_second=sum(quiet.storage["blob"].values()) / (quiet.ended - quiet.began),
        neighbour_records_per_event=neighbours.records,
        neighbour_sends_per_event=neighbours.sends,
        table_ops_per_neighbour_record=neighbours.table_ops,
        table_entities_per_neighbour_record=neighbours.entities,
        table_partitions=fs.PARTITIONS,
        neighbour_caps={fs.LEDGER: LEDGER_LOOKS},
    )
    notes = [
        f"8: idle {quiet.ended - quiet.began:.0f} s, {len(VMS)} agents heartbeating every "
        f"{RUN_HEARTBEAT:g} s: {heartbeats} heartbeats, {held:.1f} connection-seconds above "
        f"the consumer's own {baseline:.1f} connections, {quiet.la_requests} Logs Ingestion "
        f"requests, {sum(quiet.storage['queue'].values())} queue requests.",
        f"8: events: {per_event.count} events seen {per_event.seen} times (event x VM): "
        f"{per_event.records:.1f} records and {per_event.sends:.1f} sends per event per VM that "
        f"sees it; {reads.note}; {per_event.pending_seconds:.0f} VM-seconds with a Scheduled "
        f"event, for which the model charges {reads.charged(per_event.pending_seconds):.0f} "
        f"reads; the consumer made {quiet_table} table requests for "
        f"{len(quiet.events)} idle records ({_busiest(quiet.partitions)}; entities: "
        f"{_busiest(quiet.entities)}) and {table_ops:.0f} for {records_seen} records of events "
        f"({_busiest(events.partitions)}; entities: {_busiest(events.entities)}).",
        neighbours.note,
    ]
    return measured, notes


SET = ("nb-0", "nb-1", "nb-2")
# A neighbour's sighting never writes the ledger, and a batch reads it only after a conflict
# (of a write) or to release an event (once per event, as the named VM's records are charged):
# what neighbours cost it are the re-evaluation passes' looks, which scale with consumers and
# time, not with records. At most every ledger document each pass, every consumer: as many
# consumers as a Standard event hub has partitions (32).
LEDGER_LOOKS = 32 * (SHARDS + LOCKS + 1) / ConsumerSettings().reevaluate_interval


@dataclass
class Neighbours:
    """What a neighbour's sighting of an event costs (bench 8's second event window)."""

    records: float  # records one neighbour sends per event it sees
    sends: float
    table_ops: float  # the consumer's table requests per record of a neighbour
    entities: dict[str, float]  # and entities, per partition
    note: str


def _neighbours(
    procs: Processes,
    broker: EventHubsBroker,
    logs: LogsIngestionDouble,
    proxies: dict[str, CountingProxy],
    *,
    storage: str,
    tag: str,
    verify: str,
    per_beat: float,
    per_beat_entities: dict[str, float],
    own_ops: float,
    own_entities: dict[str, float],
) -> Neighbours:
    """The same events on three VMs of one availability set, so that each is seen by the VM
    it names and two neighbours (AffectsThisVm false), as Azure delivers events to a set.

    The consumer's requests for the window, less what its heartbeats and the named VMs'
    records cost (as measured in the first window), are the neighbours' records'.
    """
    fleet = procs.workdir / "set.json"
    fleet.write_text(json.dumps({"availabilitySets": [{"name": "nb", "count": len(SET)}]}))
    sim = start_agents(
        procs,
        broker,
        logs,
        storage,
        tag,
        verify=verify,
        heartbeat=RUN_HEARTBEAT,
        vms=SET,
        fleet=fleet,
        name="sim-set",
    )
    sim.wait_polls(dict.fromkeys(SET, 3))
    time.sleep(RUN_HEARTBEAT + 10)
    window, beats = _events(sim, broker, logs, proxies, SET)
    own = [e for e in window.events if json.loads(e.body).get("AffectsThisVm")]
    theirs = [e for e in window.events if not json.loads(e.body).get("AffectsThisVm")]
    if not theirs:
        raise RuntimeError("no neighbour reported the availability set's events")
    seen = _per_event(replace(window, events=theirs))
    ops = sum(window.storage["table"].values()) - beats * per_beat - len(own) * own_ops
    spent = _less(_collections(window.entities), per_beat_entities, beats)
    spent = _less(spent, own_entities, len(own))
    entities = _per(spent, len(theirs))
    note = (
        f"8: neighbours: {seen.count} events on {len(SET)} VMs of one availability set, "
        f"{len(own)} records from the VMs they name and {len(theirs)} from {seen.seen} "
        f"neighbour sightings ({seen.records:.1f} records and {seen.sends:.1f} sends each); "
        f"the consumer's requests less its heartbeats' and the named VMs' records' (as above): "
        f"{max(0.0, ops):.0f} table requests ({_busiest(window.partitions)} in all), entities "
        f"per neighbour record: {_fmt(entities)}; the model caps what they cost the ledger at "
        f"{LEDGER_LOOKS:,.0f} entities/s (32 consumers' re-evaluation looks, every document)."
    )
    return Neighbours(seen.records, seen.sends, max(0.0, ops) / len(theirs), entities, note)


def _collections(partitions: Mapping[str, int]) -> dict[str, float]:
    """Counts by table partition summed by collection (`vm-07` is one of `vm`'s)."""
    found: dict[str, float] = {}
    for partition, count in partitions.items():
        collection = collection_of(partition)
        found[collection] = found.get(collection, 0.0) + count
    return found


def _per(counts: Mapping[str, float], n: int) -> dict[str, float]:
    return {key: value / max(1, n) for key, value in counts.items() if key}


def _less(counts: Mapping[str, float], each: Mapping[str, float], n: int) -> dict[str, float]:
    """`counts` less `n` times `each`, never below 0."""
    return {key: max(0.0, value - n * each.get(key, 0.0)) for key, value in counts.items()}


def _fmt(per: Mapping[str, float]) -> str:
    return ", ".join(f"{key} {value:.2f}" for key, value in sorted(per.items())) or "none"


def _busiest(partitions: Counter[str]) -> str:
    return ", ".join(f"{key or 'not a table'} {n}" for key, n in partitions.most_common(4))


@dataclass
class PerEvent:
    count: int
    seen: int
    records: float
    sends: float
    pending_seconds: float


def _events(
    sim: Simulator,
    broker: EventHubsBroker,
    logs: LogsIngestionDouble,
    proxies: dict[str, CountingProxy],
    vms: tuple[str, ...],
) -> tuple[Window, int]:
    """Per VM: a Freeze the consumer approves (5 s), and one it holds (30 s: the default
    policy's everything-else rule) that the platform starts 20 s later. The window, and the
    heartbeats sent in it."""
    done = threading.Event()
    ids: list[str] = []

    def play() -> None:
        for vm in vms:
            ids.append(
                sim.add_event(
                    EventType="Freeze", EventSource="Platform", Resources=[vm], DurationInSeconds=5
                )
            )
            ids.append(
                sim.add_event(
                    EventType="Freeze", EventSource="Platform", Resources=[vm], DurationInSeconds=30
                )
            )
        held = time.monotonic() + 20
        pending = set(ids)
        deadline = time.monotonic() + 90
        while pending and time.monotonic() < deadline:
            for event_id, state in sim.events().items():
                if event_id not in pending:
                    continue
                if state.get("status") == "Scheduled" and time.monotonic() >= held:
                    sim.act(event_id, "start")  # the platform's NotBefore, brought forward
                elif state.get("status") == "Started":
                    time.sleep(3)
                    sim.act(event_id, "complete")
                    pending.discard(event_id)
            time.sleep(0.2)
        time.sleep(15)  # the Completed records, and each agent's last send
        done.set()

    player = threading.Thread(target=play, daemon=True)
    player.start()
    window = _window(broker, logs, proxies, 180, until=done)
    player.join()
    kinds = Counter(json.loads(e.body).get("RecordType") for e in window.events)
    window.events = [e for e in window.events if json.loads(e.body).get("EventId") in ids]
    return window, kinds["Heartbeat"]


def _per_event(window: Window) -> PerEvent:
    by_vm: dict[str, list[datetime]] = defaultdict(list)
    pairs: dict[tuple[str, str], list[tuple[datetime, dict[str, object]]]] = defaultdict(list)
    for event in window.events:
        record = json.loads(event.body)
        by_vm[str(record["VmId"])].append(event.enqueued_time)
        pairs[str(record["EventId"]), str(record["VmId"])].append((event.enqueued_time, record))
    sends = 0
    for times in by_vm.values():
        times.sort()
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        sends += 1 + sum(gap > BURST_GAP for gap in gaps)
    spans: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for (_, vm), stream in pairs.items():
        # Pending: from the Scheduled record to the first that says it started or ended.
        moves = [(t, r.get("Transition")) for t, r in stream if r.get("RecordType") == "Event"]
        scheduled = [t for t, move in moves if move == "Scheduled"]
        started = [t for t, move in moves if move in ("Started", "Completed", "Canceled")]
        if scheduled and started:
            spans[vm].append((min(scheduled), min(started)))
    # A VM reads while any of its events is pending: the union of its spans, not their sum.
    pending = sum(_covered(vm_spans) for vm_spans in spans.values())
    count = len({event_id for event_id, _ in pairs})
    return PerEvent(
        count,
        len(pairs),
        len(window.events) / max(1, len(pairs)),
        sends / max(1, len(pairs)),
        pending,
    )


@dataclass
class QueueReads:
    """An agent's queue reads for an event that affects it: a burst as it appears, then a
    steady rate while it is pending (bridge.agent.listener)."""

    per_event: float  # reads in its first FIRST_READS_FOR beyond the steady rate's
    per_second: float  # after those, while it is pending
    events: int  # the runs of reads that measured both
    short: int  # runs over before their burst was: left out
    note: str

    def charged(self, pending_seconds: float) -> float:
        """The reads the quota model charges these events for this much pending time."""
        return self.events * self.per_event + pending_seconds * self.per_second


def queue_reads(reads: Mapping[str, Sequence[float]]) -> QueueReads:
    """Each VM's queue reads (seconds, by queue) cut into runs, one per event that affects it:
    an agent reads only while one is Scheduled (commands.idle_interval 0, no neighbours'
    events in this window), and the first read of a run is the event appearing (the agent
    wakes its listener at once). Two events that appear together are one run, as they are
    one burst. A run's reads in its first FIRST_READS_FOR are its burst; the gaps between the
    rest, its steady rate. Counted per run rather than from all reads over the pending time,
    which charged the burst to every second an event is pending: 15 minutes at worst."""
    burst = FIRST_READS_FOR.total_seconds()
    early, gaps, spanned, short = 0, 0, 0.0, 0
    runs = [run for times in reads.values() for run in _runs(sorted(times))]
    for run in runs:
        if run[-1] - run[0] < burst:
            short += 1  # approved within its burst: it tells neither
            continue
        early += sum(t < run[0] + burst for t in run)
        rest = [t for t in run if t >= run[0] + burst]
        gaps, spanned = gaps + len(rest) - 1, spanned + rest[-1] - rest[0]
    events = len(runs) - short
    if not events or not spanned:
        raise RuntimeError("no event was pending past its first reads in the event window")
    rate = gaps / spanned
    per_event = early / events - burst * rate
    note = (
        f"{sum(map(len, runs))} queue reads in {len(runs)} runs (one per VM and event that "
        f"appeared), {short} over within {burst:g} s; {early / events:.1f} reads in a run's "
        f"first {burst:g} s, {rate:.2f} a second after"
    )
    return QueueReads(per_event, rate, events, short, note)


def _runs(times: list[float]) -> list[list[float]]:
    """`times` cut where reads stopped for longer than RUN_GAP."""
    runs: list[list[float]] = []
    for t in times:
        if runs and t - runs[-1][-1] <= RUN_GAP:
            runs[-1].append(t)
        else:
            runs.append([t])
    return runs


def _covered(spans: list[tuple[datetime, datetime]]) -> float:
    total, reach = 0.0, None
    for began, end in sorted(spans):
        start = began if reach is None else max(began, reach)
        if end > start:
            total += (end - start).total_seconds()
        reach = end if reach is None else max(reach, end)
    return total


def _result(m: quotas.Measured, notes: list[str]) -> Result:
    rows = []
    for fanout in FANOUTS:
        failing = [
            q
            for q in quotas.QUOTAS
            if min(q.breaks_at(m, w, fanout) for w in quotas.WAVES) < 100_000
        ]
        who = (
            "VMs named by Resources see an event"
            if fanout == 1
            else f"every VM of a {fanout:.0f}-VM placement group sees each event"
        )
        rows.append(
            Row(
                "8a" if fanout == 1 else "8b",
                f"Quotas of a Standard deployment that hold at 100,000 VMs, steady and every wave "
                f"({who})",
                f"{len(quotas.QUOTAS) - len(failing)} of {len(quotas.QUOTAS)}"
                + (
                    f"; breaks: {', '.join(f'{q.service} {q.name} ({q.tier})' for q in failing)}"
                    if failing
                    else ""
                ),
                "all",
                not failing,
            )
        )
    notes = [
        *notes,
        "8: per VM, measured: "
        f"{m.connection_seconds_per_send:.1f} Event Hubs connection-seconds per send, "
        f"{m.la_requests_per_send:.2f} Logs Ingestion requests per send, "
        f"{m.records_per_event:.1f} records and {m.sends_per_event:.1f} sends per event seen, "
        f"{m.queue_reads_per_event:.1f} queue reads as an event that affects it appears (beyond "
        f"the steady rate) and {m.queue_reads_per_pending_second:.2f} a second while it is "
        f"Scheduled; the consumer: {m.table_ops_per_heartbeat:.2f} table requests per "
        f"heartbeat (entities: {_fmt(m.table_entities_per_heartbeat)}), "
        f"{m.table_ops_per_event_record:.2f} per record of an event from a VM it names "
        f"({_fmt(m.table_entities_per_event_record)}) and {m.neighbour[2]:.2f} per record of "
        f"a neighbour's ({_fmt(m.neighbour[3])}), {m.blob_ops_per_second:.2f} blob requests/s.",
        *(f"8: {line}" for line in quotas.FIXED),
    ]
    for fanout in FANOUTS:
        notes.append(
            f"8: fan-out {fanout:g} (VMs that see each event), the quota table:\n\n"
            + "\n".join("  " + line for line in quotas.table(m, fanout))
            + "\n"
        )
    return Result(rows, notes)

"""The live run: a wave played into local hubs or the Event Hubs test broker for real
`se-bridge consume` processes.

With local hubs (`source="local"`), one hub directory per consumer process: a VM's records
always go to the same hub (a stable hash of its VmId), as Event Hubs gives each consumer its
own partitions. With the broker (`source="broker"`), one event hub of `partitions`
partitions, served over AMQP by tests/doubles/eventhubs_broker.py in this process: the
records go in through the real azure-eventhub producer, each with its VM's partition key as
an agent's sink sends it, and the consumers read them with their Event Hubs source, sharing
the partitions through ownership blobs and writing checkpoints to a blob container in
Azurite: the path a deployment runs; a partition can be held back from the consumers for a
while (`hold`: the broker delivers nothing of it), as from a consumer that fell behind on it.
Either way the processes share one fleet state and one local command directory, as consumers
share Table Storage and the queues, and each writes its Decision records to its own JSONL
sink. The fleet state is a SQLite file
(`state="sqlite"`) or a table in Azurite (`state="tables"`), the emulator the test suite
runs: one node process on this machine, in memory, started for the run.

The run, in wall time:

1. warm-up: every VM's Start heartbeat goes in at once, and the run waits until the consumers
   have read them all (the fleet is known: steady state begins);
2. `lead_in` fleet seconds of heartbeats, then the wave, then `tail` fleet seconds, every
   `TICK`: what the fleet made by then is appended to the hubs (one transaction per local
   hub; one batch per partition to the broker); every `COMMAND_POLL` the command directory
   is read and each new command handed to its VM's model agent, which answers it (an
   Approval record) and, if it approved, starts the event as the platform would;
3. the hubs are drained (every record handled), then the consumers are stopped.

Every second the checkpoints are sampled (records written and handled, how long the oldest
unhandled one has waited) with the consumers' (and Azurite's) memory and CPU; every
`STATE_EVERY` seconds (`TABLES_STATE_EVERY` with Tables) the largest document of each state
collection other than the VMs'. With the broker the checkpoints are those the consumers wrote
to their blob container, read as an operator reads a consumer group's lag: a partition's
moves at most every `checkpoint_interval` seconds, so the lag read includes up to that.

The local hubs are appended by `HubWriter`, not `LocalHub.append`: that one reads the last
offset of every partition with a query that scans the whole hub (`SELECT "partition",
MAX("offset") ... GROUP BY "partition"`), so each append costs time in proportion to all the
records ever written (0.19 s per append at 660,000 records here); a load test writes millions.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient, TableEntity
from azure.eventhub import (
    EventData,
    EventDataBatch,
    EventHubProducerClient,
    parse_connection_string,
)
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore

from bridge import sqlitewal
from bridge.commands.message import Command, CommandError, parse
from bridge.consumer.state.tables import collection_of, unescape_key
from bridge.localhub import PARTITIONS, LocalHub, partition_for
from tests.benchmarks import procstat
from tests.benchmarks.loadgen import waves
from tests.benchmarks.loadgen.fleet import Fleet, build
from tests.benchmarks.loadgen.measure import CpuSample, LagSample
from tests.benchmarks.loadgen.policy import POLICY_YAML
from tests.benchmarks.loadgen.sim import Emitted, Sim, WallClock
from tests.benchmarks.rig import ROOT, say
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.support.azurite import Azurite
from tests.support.processes import Proc, Processes, scrape

CONSUMER_GROUP = "$Default"
RESULT = "result.pickle"  # in a kept work directory: what the run recorded
TICK = 0.1  # wall seconds between appends
COMMAND_POLL = 0.5  # wall seconds between reads of the command directory (the agent's is 1 s)
SAMPLE_EVERY = 1.0
STATE_EVERY = 5.0
# A Tables probe reads every document of a collection through the one Azurite process the
# consumers wait on (SQLite's reader takes none of their time): less often, to weigh less on
# what is measured.
TABLES_STATE_EVERY = 20.0
STATES = {"sqlite": "SQLite", "tables": "Tables on Azurite"}  # --state: the report's names
SOURCES = {"local": "local hubs", "broker": "Event Hubs test broker"}  # --source
BROKER_HUB = "records"  # the broker's event hub (infra/ names the deployment's so)
CHECKPOINTS = "loadgen-checkpoints"  # the consumers' checkpoint container, with the broker
# The consumer's settings that are durations of the fleet, at time scale 1 (their defaults);
# a faster run divides them by its scale, within the bounds the settings allow.
FLEET_SETTINGS = {
    "alive_within": (660.0, 10.0),
    "approval_timeout": (30.0, 1.0),
    "stale_after": (6 * 3600.0, 60.0),
}


@dataclass(frozen=True)
class RunConfig:
    size: int = 100_000
    seed: int = 1
    wave: str = "freeze"
    options: waves.WaveOptions = field(default_factory=waves.WaveOptions)
    scale: float = 1.0  # fleet seconds per wall second
    consumers: int = 1
    lead_in: float = 300.0  # fleet seconds of steady state before the wave
    tail: float = 60.0  # fleet seconds of steady state after it
    drain_timeout: float = 900.0  # wall seconds to wait for the consumers to catch up
    workdir: Path | None = None  # kept when given; a temporary directory otherwise
    log_level: str = "INFO"
    state: str = "sqlite"  # the consumers' fleet state: a key of STATES
    source: str = "local"  # where the records go: a key of SOURCES
    partitions: int = 4  # the broker's event hub (infra/'s eventHubPartitionCount default)
    checkpoint_interval: float = 5.0  # the consumers' setting with the broker (its default)
    fan_out: str = "named"  # who sees an event: sim.FAN_OUTS
    # broker: (partition, from, until) fleet seconds of the run (lead-in included) in which the
    # consumers' receivers get nothing of that partition (its events are stored): they fall
    # behind on it (issue 27)
    hold: tuple[int, float, float] | None = None

    @property
    def state_name(self) -> str:
        return STATES[self.state]

    @property
    def azurite(self) -> bool:
        """Whether the run starts Azurite: for the Tables state or the broker's checkpoints."""
        return self.state == "tables" or self.source == "broker"

    def consumer_settings(self) -> dict[str, float]:
        return {name: max(low, value / self.scale) for name, (value, low) in FLEET_SETTINGS.items()}


@dataclass
class ConsumerStats:
    name: str
    peak_rss_kb: int = 0
    cpu_seconds: float = 0.0  # during the wave's window and the drain after it
    warnings: int = 0
    errors: int = 0
    samples: list[str] = field(default_factory=list)  # a few distinct WARNING/ERROR lines
    poison: int = 0  # records set aside as not records
    # The approval ledger's looks, conflicts and documents read by key, wave start to
    # drained (its metrics, bridge/consumer/metrics.py); None: not scraped.
    ledger: tuple[int, int, int] | None = None


@dataclass
class RunResult:
    config: RunConfig
    fleet: Fleet
    plan: waves.WavePlan
    sim: Sim
    samples: list[LagSample]
    decisions: list[dict[str, Any]]
    commands: int
    warm_records: int
    warm_seconds: float
    lead_start: float  # the steady state before the wave begins
    wave_start: float
    wave_end: float
    drained_at: float | None
    consumers: list[ConsumerStats]
    largest: dict[str, tuple[str, int]]  # collection -> (key, characters), the largest seen
    documents: dict[str, int]  # collection -> documents at the end
    # collection -> write transactions from wave start to the end; None: the store keeps no
    # count (Tables)
    writes: dict[str, int] | None
    state_bytes: int | None  # the SQLite file with its WAL; None: no file (Azurite, in memory)
    generator_cpu: float
    generator_rss_kb: int
    load_max: float
    revision: str = ""  # the commit the consumers ran, and whether bridge/ differed from it
    state_chars: int = 0  # the documents' JSON text at the end, all collections
    cpu: list[CpuSample] = field(default_factory=list)  # every second, from the warm-up on
    azurite_rss_kb: int = 0  # Azurite's peak (VmHWM); 0 without it
    # With a hold: per VM, the wall times its records went into the hub
    sent_at: dict[int, list[float]] = field(default_factory=dict)

    @property
    def stopped(self) -> dict[int, float]:
        return {**self.sim.silent, **self.sim.deleted}


class Target(Protocol):
    """Where the run's records go, and how far the consumers have read them."""

    last: list[int]  # per partition: the position of the last record written (-1: none)

    def append(self, messages: Sequence[tuple[str, Record]]) -> list[tuple[int, int]]:
        """Write (partition key, record) `messages` in order: each one's (partition,
        position)."""
        ...

    def checkpoints(self) -> list[int]:
        """Per partition: the position of the last record the consumers checkpointed."""
        ...

    def close(self) -> None: ...


Record = dict[str, Any]


def _text(record: Record) -> str:
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


class HubWriter:
    """Appends to one local hub as `LocalHub.append` does (one transaction, FULL sync, the
    same rows), keeping each partition's last offset itself: the run is the hub's only writer.
    """

    def __init__(self, directory: Path) -> None:
        LocalHub(directory).close()  # the product's own schema
        self.path = directory / "hub.db"
        self.conn = sqlitewal.connect(self.path, synchronous="FULL", busy_timeout_ms=5000)
        self.last = [
            self.conn.execute(
                'SELECT MAX("offset") FROM records WHERE "partition" = ?', (p,)
            ).fetchone()[0]
            for p in range(PARTITIONS)
        ]
        self.last = [-1 if v is None else int(v) for v in self.last]

    def append(self, messages: Sequence[tuple[str, Record]]) -> list[tuple[int, int]]:
        enqueued = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        placed, rows = [], []
        for key, record in messages:
            partition = partition_for(key)
            self.last[partition] += 1
            placed.append((partition, self.last[partition]))
            rows.append((partition, self.last[partition], key, _text(record), enqueued))
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(
            'INSERT INTO records ("partition", "offset", partition_key, body, enqueued_time)'
            " VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        self.conn.execute("COMMIT")
        return placed

    def checkpoints(self) -> list[int]:
        rows = self.conn.execute(
            'SELECT "partition", "offset" FROM checkpoints WHERE consumer_group = ?',
            (CONSUMER_GROUP,),
        ).fetchall()
        found = {int(p): int(o) for p, o in rows}
        return [found.get(p, -1) for p in range(PARTITIONS)]

    def close(self) -> None:
        self.conn.close()


class BrokerWriter:
    """Sends to the Event Hubs test broker through the real producer, and reads the consumers'
    checkpoints from their blob container through the real checkpoint store.

    Each event is what bridge/sinks/eventhubs.py sends (JSON body, content type, application
    properties, the VM's partition key), but batched per partition rather than per VM: one
    producer speaks for the whole fleet, and a batch per VM would cost this process (which
    also runs the broker) more than the consumers it measures. The partition key still rides
    on every event, set where the SDK sets it (the message annotation
    `x-opt-partition-key`), so the consumers' sender check sees each VM speak for itself; the
    partition is the broker's own hash of that key. Positions are sequence numbers: this is
    the hub's only sender, so the broker numbers a partition's events in the order sent.
    """

    def __init__(self, broker: EventHubsBroker, storage: str, container: str) -> None:
        self.partitions = len(broker.partition_ids)
        self.last = [-1] * self.partitions
        self.producer = EventHubProducerClient.from_connection_string(
            broker.connection_string, logging_enable=False
        )
        # As the consumers' SDK names it in their checkpoint blobs (host:port here).
        self.namespace = parse_connection_string(broker.connection_string).fully_qualified_namespace
        self.store = BlobCheckpointStore.from_connection_string(storage, container)
        self.sent = 0  # SDK send_batch calls

    def append(self, messages: Sequence[tuple[str, Record]]) -> list[tuple[int, int]]:
        per_partition: dict[int, list[tuple[int, EventData]]] = {}
        for index, (key, record) in enumerate(messages):
            partition = zlib.crc32(key.encode("utf-8")) % self.partitions  # as the broker routes
            per_partition.setdefault(partition, []).append((index, _event(key, record)))
        placed: list[tuple[int, int]] = [(0, 0)] * len(messages)
        for partition, events in per_partition.items():
            batch = self._batch(partition)
            for index, event in events:
                try:
                    batch.add(event)
                except ValueError:  # full: this one starts the next batch
                    self._send(batch)
                    batch = self._batch(partition)
                    batch.add(event)
                self.last[partition] += 1
                placed[index] = (partition, self.last[partition])
            self._send(batch)
        return placed

    def _batch(self, partition: int) -> EventDataBatch:
        return self.producer.create_batch(partition_id=str(partition))

    def _send(self, batch: EventDataBatch) -> None:
        self.producer.send_batch(batch)
        self.sent += 1

    def checkpoints(self) -> list[int]:
        found = [-1] * self.partitions
        try:
            marks = self.store.list_checkpoints(self.namespace, BROKER_HUB, CONSUMER_GROUP)
        except AzureError:  # no container yet (a consumer makes it), or Azurite busy: none
            return found
        for mark in marks:
            found[int(mark["partition_id"])] = int(mark["sequence_number"])
        return found

    def owners(self) -> set[str]:
        """The consumers (their owner ids) that own a partition now."""
        try:
            rows = self.store.list_ownership(self.namespace, BROKER_HUB, CONSUMER_GROUP)
        except AzureError:  # no container yet (a consumer makes it), or Azurite busy: none
            return set()
        return {str(row["owner_id"]) for row in rows if row.get("owner_id")}

    def close(self) -> None:
        self.producer.close()
        self.store.close()


def _event(key: str, record: Record) -> EventData:
    event = EventData(_text(record))
    event.content_type = "application/json"
    event.properties = {
        "RecordType": record["RecordType"],
        "SchemaVersion": record["SchemaVersion"],
        "VmId": record["VmId"],
        "RecordId": record["RecordId"],
    }
    # Where the SDK puts a batch's partition key (azure.eventhub._transport's
    # PROP_PARTITION_KEY_AMQP_SYMBOL under pyamqp): the annotations are the message's own.
    event.raw_amqp_message.annotations = {b"x-opt-partition-key": key}
    return event


class CommandWatcher:
    """The model agents' end of the local command channel (bridge.channels.local): a VM's
    folder is listed when its modification time moved, each command read and removed.

    Signatures are not checked: the model agents trust the consumer (the real agent's check
    is measured by the agent's own benchmarks, not here).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._seen: dict[str, int] = {}  # folder -> st_mtime_ns when last listed
        self.read = 0
        self.unreadable = 0

    def poll(self) -> list[Command]:
        found: list[Command] = []
        try:
            folders = list(os.scandir(self.directory))
        except FileNotFoundError:
            return found
        for folder in folders:
            if not folder.is_dir(follow_symlinks=False):
                continue
            # Taken before listing: a command written meanwhile moves it again, and is seen
            # at the next poll.
            mtime = folder.stat(follow_symlinks=False).st_mtime_ns
            if self._seen.get(folder.name) == mtime:
                continue
            self._seen[folder.name] = mtime
            for name in os.listdir(folder.path):
                if name.startswith(".") or not name.endswith(".json"):
                    continue  # a sender's temporary file, or a message another reader holds
                command = self._take(Path(folder.path) / name)
                if command is not None:
                    found.append(command)
        return found

    def _take(self, path: Path) -> Command | None:
        try:
            text = path.read_text(encoding="utf-8")
            path.unlink()
        except FileNotFoundError:
            return None
        self.read += 1
        try:
            return parse(json.loads(text)["Body"])
        except (CommandError, ValueError, KeyError, TypeError):
            self.unreadable += 1
            return None


class Probe(Protocol):
    """What the run reads of the consumers' fleet state, whichever store holds it."""

    largest: dict[str, tuple[str, int]]  # collection -> (key, characters), the largest seen
    text: int  # characters of JSON of every document, at the last `everything` sample

    def sample(self, *, everything: bool = False) -> dict[str, int]: ...

    def revisions(self) -> dict[str, int] | None: ...


class StateProbe:
    """Reads the consumers' SQLite fleet state (read only) for the size of its documents."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.largest: dict[str, tuple[str, int]] = {}
        self.text = 0

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10)
        try:
            yield conn
        finally:
            conn.close()

    def collections(self, conn: sqlite3.Connection) -> list[str]:
        rows = conn.execute("SELECT DISTINCT collection FROM docs").fetchall()
        return sorted(str(r[0]) for r in rows)

    def sample(self, *, everything: bool = False) -> dict[str, int]:
        """Note each collection's largest document (the VMs' only when `everything`: there
        are a fleet of them, and they are all alike); its document counts."""
        counts: dict[str, int] = {}
        if not self.path.exists():
            return counts
        try:
            with self._connection() as conn:
                for name in self.revisions(conn) or self.collections(conn):
                    if name == "vm" and not everything:
                        continue
                    row = conn.execute(
                        "SELECT key, LENGTH(value) AS n FROM docs WHERE collection = ?"
                        " ORDER BY n DESC LIMIT 1",
                        (name,),
                    ).fetchone()
                    counts[name] = conn.execute(
                        "SELECT COUNT(*) FROM docs WHERE collection = ?", (name,)
                    ).fetchone()[0]
                    if row is not None and row[1] > self.largest.get(name, ("", -1))[1]:
                        self.largest[name] = (str(row[0]), int(row[1]))
                if everything:
                    total = conn.execute("SELECT SUM(LENGTH(value)) FROM docs").fetchone()[0]
                    self.text = int(total or 0)
        except sqlite3.OperationalError:
            pass  # busy past the timeout, or a table not there yet: the next sample looks again
        return counts

    def revisions(self, conn: sqlite3.Connection | None = None) -> dict[str, int]:
        """Write transactions per collection so far (bridge.consumer.state.sqlite's `revs`)."""
        if conn is None:
            if not self.path.exists():
                return {}
            with self._connection() as own:
                return self.revisions(own)
        try:
            rows = conn.execute("SELECT collection, rev FROM revs WHERE collection != ''")
            return {str(c): int(r) for c, r in rows.fetchall()}
        except sqlite3.OperationalError:
            return {}


class TableProbe:
    """Reads the consumers' fleet state in a table (bridge.consumer.state.tables: PartitionKey
    = collection, or `collection-NN` where it is spread; the JSON text in Body0..BodyN) for
    the size of its documents.

    Table Storage keeps no count of writes (an entity's ETag is a timestamp, not a revision),
    and counting the consumers' requests would take a proxy in their path, which would then
    be measured too (tests/benchmarks/bench_quota.py counts them so): `revisions` is None.
    """

    def __init__(self, connection_string: str, table_name: str) -> None:
        self.largest: dict[str, tuple[str, int]] = {}
        self.text = 0
        self.table = TableClient.from_connection_string(connection_string, table_name)

    def collections(self) -> list[str]:
        """The table's PartitionKeys as stored, one query each: the first entity above the
        last one found (the service lists by PartitionKey; there is no DISTINCT)."""
        found: list[str] = []
        while True:
            if found:
                pages = self.table.query_entities(
                    "PartitionKey gt @after",
                    parameters={"after": found[-1]},
                    select=["PartitionKey"],
                    results_per_page=1,
                )
            else:
                pages = self.table.list_entities(select=["PartitionKey"], results_per_page=1)
            first = next(iter(pages), None)
            if first is None:
                return found
            found.append(str(first["PartitionKey"]))

    def sample(self, *, everything: bool = False) -> dict[str, int]:
        """As `StateProbe.sample`: the VMs' documents only when `everything`."""
        counts: dict[str, int] = {}
        text = 0
        try:
            for stored in self.collections():
                name = collection_of(stored)
                if name == "vm" and not everything:
                    continue
                count, top = 0, ("", -1)
                for entity in self.table.query_entities(
                    "PartitionKey eq @pk", parameters={"pk": stored}
                ):
                    count += 1
                    size = _chars(entity)
                    text += size
                    if size > top[1]:
                        top = (unescape_key(str(entity["RowKey"])), size)
                counts[name] = counts.get(name, 0) + count
                if top[1] > self.largest.get(name, ("", -1))[1]:
                    self.largest[name] = top
        except AzureError:
            return counts  # no table yet, or Azurite slow past the timeout: the next sample
        if everything:
            self.text = text
        return counts

    def revisions(self) -> None:
        return None

    def close(self) -> None:
        self.table.close()


def _chars(entity: TableEntity) -> int:
    """The length of the document's JSON text, as SQLite's LENGTH(value) counts it."""
    return sum(len(entity[f"Body{i}"]) for i in range(int(entity["Chunks"])))


def proc_status(pid: int, field_name: str) -> int:
    """A /proc/PID/status field in kB (VmRSS, VmHWM); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


class Run:
    """One live run; `go` plays it and returns what was recorded."""

    def __init__(self, config: RunConfig, say: Callable[[str], None]) -> None:
        self.config, self.say = config, say
        self.fleet = build(config.size, config.seed)
        self.plan = waves.plan(config.wave, self.fleet, config.seed, config.options)
        self.clock = WallClock(config.scale)
        self.sim = Sim(
            self.fleet,
            self.plan,
            self.clock,
            seed=config.seed,
            offset=config.lead_in,
            fan_out=config.fan_out,
        )
        self.samples: list[LagSample] = []
        # Local hubs: one per consumer, a VM's always the same. The broker: its one hub.
        hubs = config.consumers if config.source == "local" else 1
        self._hub_of = [zlib.crc32(f"hub:{vm.vm_id}".encode()) % hubs for vm in self.fleet]
        # Per hub and partition: (last position of an append, when), until a checkpoint passes
        # it; made with the hubs.
        self._queued: list[list[deque[tuple[int, float]]]] = []
        self.load_max = 0.0
        self.peak_rss: dict[int, int] = {}
        self.hubs: list[Target] = []
        self.broker: EventHubsBroker | None = None
        self.consumers: list[Proc] = []
        self.ledger_start: list[tuple[int, int, int] | None] = []
        self.revision = ""
        self.azurite_pid: int | None = None
        self.azurite_rss = 0
        self.cpu: list[CpuSample] = []
        self.sent_at: dict[int, list[float]] = {}
        self.held = False

    def go(self) -> RunResult:
        self.say(f"fleet: {self.fleet.summary()}")
        self.say(f"wave: {self.plan.description}")
        with self._workdir() as root:
            procs = Processes(root)
            try:
                result = self._play(root, procs)
            finally:
                procs.close()
            if self.config.workdir is not None:
                save(result, root / RESULT)
            return result

    @contextlib.contextmanager
    def _workdir(self) -> Iterator[Path]:
        if self.config.workdir is not None:
            root = self.config.workdir
            if root.exists():
                shutil.rmtree(root)
            root.mkdir(parents=True)
            yield root
            return
        with tempfile.TemporaryDirectory(prefix="se-loadgen-") as tmp:
            yield Path(tmp)

    def _play(self, root: Path, procs: Processes) -> RunResult:
        config = self.config
        commands = root / "commands"
        commands.mkdir(mode=0o750)
        state = root / "fleet.db"
        policy = root / "policy.yaml"
        policy.write_text(POLICY_YAML, encoding="utf-8")
        key = root / "signing.pem"
        subprocess.run(
            [sys.executable, "-m", "bridge", "keygen", "--out", str(key)],
            check=True,
            capture_output=True,
            timeout=60,
        )
        env = {"SE_BRIDGE_COMMANDS_SIGNING_KEY": f"file:{key}"}
        env |= {
            f"SE_BRIDGE_CONSUMER_{name.upper()}": f"{value:g}"
            for name, value in config.consumer_settings().items()
        }
        with contextlib.ExitStack() as stack:
            probe: Probe
            storage = ""
            if config.azurite:
                azurite = Azurite(root / "azurite").start()
                stack.callback(azurite.stop)
                # Its CPU and memory are the run's to report; the helper keeps its process
                # to itself (node runs the script in the process Popen started).
                self.azurite_pid = azurite._proc.pid if azurite._proc is not None else None
                storage = azurite.connection_string
                # As tests/integration/consumer_cloud.py configures a consumer on Azurite.
                env |= {
                    "SE_BRIDGE_STORAGE_CONNECTION_STRING": storage,
                    "NO_PROXY": "127.0.0.1,localhost",
                }
            if config.state == "tables":
                table = f"loadgen{uuid.uuid4().hex[:12]}"
                env["SE_BRIDGE_CONSUMER_TABLE_NAME"] = table
                spec = "tables"
                tables = TableProbe(storage, table)
                stack.callback(tables.close)
                probe = tables
            else:
                spec = f"sqlite:{state}"
                probe = StateProbe(state)
            source = self._hubs(root, storage, env, stack)
            # The code under test is read when the consumers start: say which it was.
            self.revision = revision()
            for k in range(config.consumers):
                self.consumers.append(
                    procs.bridge(
                        f"consumer-{k}",
                        "consume",
                        *source(k),
                        "--commands",
                        f"local:{commands}",
                        "--state",
                        spec,
                        "--policy",
                        str(policy),
                        "--sink",
                        f"jsonl:{root / f'decisions-{k}.jsonl'}",
                        "--state-dir",
                        str(root / f"consumer-{k}"),
                        "--log-level",
                        config.log_level,
                        "--metrics-address",
                        "0",
                        env=env,
                    )
                )
            watcher = CommandWatcher(commands)
            try:
                return self._phases(root, probe, watcher)
            finally:
                for hub in self.hubs:
                    hub.close()

    def _hubs(
        self, root: Path, storage: str, env: dict[str, str], stack: contextlib.ExitStack
    ) -> Callable[[int], list[str]]:
        """Open where the records go; the consumer `k`'s arguments that read it."""
        config = self.config
        if config.source == "local":
            self.hubs = [HubWriter(root / f"hub-{k}") for k in range(config.consumers)]
            self._queued = [[deque() for _ in range(PARTITIONS)] for _ in self.hubs]
            return lambda k: ["--hub", str(root / f"hub-{k}")]
        self.broker = EventHubsBroker(hub=BROKER_HUB, partitions=config.partitions).start()
        stack.callback(self.broker.stop)
        # The consumers' Event Hubs source: a connection string, as bench_quota's consumer
        # (tests/benchmarks/bench_cost.py) and the Functions app's setting give it.
        interval = f"{config.checkpoint_interval:g}"
        env |= {
            "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": self.broker.connection_string,
            "SE_BRIDGE_CONSUMER_CHECKPOINT_CONTAINER": CHECKPOINTS,
            "SE_BRIDGE_CONSUMER_CHECKPOINT_INTERVAL": interval,
        }
        self.hubs = [BrokerWriter(self.broker, storage, CHECKPOINTS)]
        self._queued = [[deque() for _ in range(config.partitions)]]
        return lambda k: []

    def _phases(self, root: Path, probe: Probe, watcher: CommandWatcher) -> RunResult:
        config = self.config
        self._share_partitions(config.drain_timeout)
        began = time.time()
        for chunk in self.sim.warm_up():
            self._place(chunk)
            self._sample()
        self._drain(config.drain_timeout, f"{len(self.fleet):,} Start heartbeats")
        warm_seconds = time.time() - began
        self.say(f"warm-up: {len(self.fleet):,} Start heartbeats handled in {warm_seconds:.1f} s")
        self.clock.start()
        lead_start = time.time()
        cpu0 = time.process_time()
        wave_start = wave_end = 0.0
        end_fleet = 0.0
        state_every = TABLES_STATE_EVERY if config.state == "tables" else STATE_EVERY
        revs0: dict[str, int] | None = {}
        cpu_start: dict[int, float] = {}
        next_poll = next_sample = next_state = next_say = time.monotonic()
        while True:
            tick = time.monotonic()
            now = self.clock.fleet_now()
            self._place(self.sim.advance(now))
            if tick >= next_poll:
                next_poll = tick + COMMAND_POLL
                for command in watcher.poll():
                    self.sim.answer(command, now)
            if tick >= next_sample:
                next_sample = tick + SAMPLE_EVERY
                self._sample()
                self._check_alive()
            if tick >= next_state:
                next_state = tick + state_every
                probe.sample()
            if not wave_start and now >= config.lead_in:
                wave_start = time.time()
                revs0 = probe.revisions()
                cpu_start = {
                    p.popen.pid: procstat.ticks_seconds(p.popen.pid) for p in self.consumers
                }
                self.ledger_start = [ledger_counts(p) for p in self.consumers]
                self.say("wave begins")
            if wave_start and not wave_end and self.sim.finished(now):
                wave_end, end_fleet = time.time(), now
                self.say(f"wave over after {wave_end - wave_start:.0f} s; tail")
            if wave_end and now >= end_fleet + config.tail:
                break
            if tick >= next_say:
                next_say = tick + 30.0
                self._progress(now)
            self._hold(now)
            time.sleep(max(0.0, TICK - (time.monotonic() - tick)))
        drained = self._drain(config.drain_timeout, "the wave")
        drained_at = time.time() if drained else None
        probe.sample(everything=True)
        revs1 = probe.revisions()
        if self.azurite_pid is not None:
            self.azurite_rss = max(self.azurite_rss, proc_status(self.azurite_pid, "VmHWM"))
        stats = self._stop(cpu_start, root)
        writes = (
            None
            if revs1 is None or revs0 is None
            else {c: revs1.get(c, 0) - revs0.get(c, 0) for c in revs1}
        )
        files = list(root.glob("fleet.db*"))
        decisions = _read_jsonl(root.glob("decisions-*.jsonl"))
        return RunResult(
            config=config,
            fleet=self.fleet,
            plan=self.plan,
            sim=self.sim,
            samples=self.samples,
            decisions=decisions,
            commands=watcher.read,
            warm_records=len(self.fleet),
            warm_seconds=warm_seconds,
            lead_start=lead_start,
            wave_start=wave_start,
            wave_end=wave_end,
            drained_at=drained_at,
            consumers=stats,
            largest=probe.largest,
            documents=probe.sample(everything=True),
            writes=writes,
            state_bytes=sum(p.stat().st_size for p in files) if files else None,
            generator_cpu=time.process_time() - cpu0,
            generator_rss_kb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            load_max=self.load_max,
            revision=self.revision,
            state_chars=probe.text,
            cpu=self.cpu,
            azurite_rss_kb=self.azurite_rss,
            sent_at=self.sent_at,
        )

    def _hold(self, now: float) -> None:
        """Hold the partition of `config.hold` back from the consumers, or let it go."""
        hold = self.config.hold
        if hold is None or self.broker is None:
            return
        partition, start, end = hold
        if not self.held and start <= now < end:
            self.broker.hold(str(partition))
            self.held = True
            self.say(f"partition {partition} held back from the consumers")
        elif self.held and now >= end:
            self.broker.release(str(partition))
            self.held = False
            self.say(f"partition {partition} read again")

    def _place(self, emitted: list[Emitted]) -> None:
        """Append what the fleet made, one transaction per hub; note where events landed."""
        if not emitted:
            return
        per_hub: list[list[Emitted]] = [[] for _ in self.hubs]
        for item in emitted:
            per_hub[self._hub_of[item[0]]].append(item)
        vms = self.fleet.vms
        for k, items in enumerate(per_hub):
            if not items:
                continue
            messages = [(vms[i].vm_id, r) for i, r in items]
            placed = self.hubs[k].append(messages)
            wall = time.time()
            if self.config.hold is not None:
                for index, _ in items:
                    self.sent_at.setdefault(index, []).append(wall)
            last: dict[int, int] = {}
            for (_, record), (partition, offset) in zip(items, placed, strict=True):
                last[partition] = offset
                if record["RecordType"] != "Event":
                    continue
                event = self.sim.events.get(record["EventId"])
                if event is None:
                    continue
                if event.first_record is None:
                    event.first_record = wall
                if record["Transition"] == "Started" and event.start_place is None:
                    event.start_place = (k, partition, offset)
            for partition, offset in last.items():
                self._queued[k][partition].append((offset, wall))

    def _sample(self) -> LagSample:
        now = time.time()
        written = consumed = 0
        oldest = 0.0
        checkpoints = []
        for k, hub in enumerate(self.hubs):
            marks = hub.checkpoints()
            checkpoints.append(tuple(marks))
            for partition, mark in enumerate(marks):
                written += hub.last[partition] + 1
                consumed += mark + 1
                queue = self._queued[k][partition]
                while queue and queue[0][0] <= mark:
                    queue.popleft()
                if queue:
                    oldest = max(oldest, now - queue[0][1])
        sample = LagSample(now, written, consumed, oldest, tuple(checkpoints))
        self.samples.append(sample)
        self.load_max = max(self.load_max, os.getloadavg()[0])
        for proc in self.consumers:
            rss = proc_status(proc.popen.pid, "VmRSS")
            self.peak_rss[proc.popen.pid] = max(self.peak_rss.get(proc.popen.pid, 0), rss)
        self.cpu.append(
            CpuSample(
                now,
                tuple(_cpu(p.popen.pid) for p in self.consumers),
                None if self.azurite_pid is None else _cpu(self.azurite_pid),
            )
        )
        if self.azurite_pid is not None:
            self.azurite_rss = max(self.azurite_rss, proc_status(self.azurite_pid, "VmRSS"))
        return sample

    def _drain(self, timeout: float, what: str) -> bool:
        """Wait, writing nothing more, until the consumers have handled every record written;
        False on timeout. (After the wave no event is open: nothing waits for an answer.)"""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sample = self._sample()
            self._check_alive()
            if sample.written == sample.consumed:
                return True
            time.sleep(SAMPLE_EVERY)
        self.say(f"the consumers did not catch up with {what} within {timeout:g} s")
        return False

    def _share_partitions(self, timeout: float) -> None:
        """With the broker and several consumers: wait until each owns a partition. A consumer
        that starts later than another (a slow start on a busy machine) finds every partition
        owned and takes its share only at its next load-balancing look, which a short run may
        not reach: the run would then measure one consumer, not the ones it names."""
        writer = self.hubs[0] if self.hubs else None
        if not isinstance(writer, BrokerWriter) or self.config.consumers < 2:
            return
        deadline = time.monotonic() + timeout
        while len(owners := writer.owners()) < self.config.consumers:
            self._check_alive()
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"the partitions were not shared by the "
                    f"{self.config.consumers} consumers within {timeout:g} s "
                    f"(owners: {sorted(owners)})"
                )
            time.sleep(SAMPLE_EVERY)
        self.say(f"the partitions are shared by {len(owners)} consumers")

    def _check_alive(self) -> None:
        for proc in self.consumers:
            if not proc.alive:
                raise RuntimeError(f"consumer {proc.name} exited\n{proc.output()}")

    def _progress(self, now: float) -> None:
        sample = self.samples[-1] if self.samples else None
        backlog = sample.written - sample.consumed if sample else 0
        age = sample.oldest_age if sample else 0.0
        self.say(
            f"fleet t={now:,.0f} s: {self.sim.counts['records']:,} records, "
            f"{self.sim.open_events():,} events open, backlog {backlog:,} "
            f"(oldest waiting {age:.1f} s)"
        )

    def _stop(self, cpu_start: dict[int, float], root: Path) -> list[ConsumerStats]:
        stats = []
        for k, proc in enumerate(self.consumers):
            pid = proc.popen.pid
            stat = ConsumerStats(proc.name)
            stat.peak_rss_kb = max(proc_status(pid, "VmHWM"), self.peak_rss.get(pid, 0))
            stat.cpu_seconds = procstat.ticks_seconds(pid) - cpu_start.get(pid, 0.0)
            start, end = self.ledger_start[k] if self.ledger_start else None, ledger_counts(proc)
            if start is not None and end is not None:
                stat.ledger = (end[0] - start[0], end[1] - start[1], end[2] - start[2])
            proc.stop(timeout=120)
            for line in proc.stderr().splitlines():
                parts = line.split(" ", 3)
                level = parts[2] if len(parts) > 2 else ""
                if level in ("WARNING", "ERROR", "CRITICAL"):
                    stat.warnings += level == "WARNING"
                    stat.errors += level != "WARNING"
                    text = parts[3][:300] if len(parts) > 3 else line
                    if len(stat.samples) < 5 and not any(text[:60] in s for s in stat.samples):
                        stat.samples.append(f"{level} {text}")
            poison = root / f"consumer-{k}" / "poison.jsonl"
            if poison.exists():
                with poison.open(encoding="utf-8") as lines:
                    stat.poison = sum(1 for _ in lines)
            stats.append(stat)
        return stats


LEDGER_METRICS = (
    "se_bridge_consumer_ledger_reads_total",
    "se_bridge_consumer_ledger_conflicts_total",
    "se_bridge_consumer_ledger_documents_fetched_total",
)


def ledger_counts(proc: Proc) -> tuple[int, int, int] | None:
    """A consumer's approval-ledger counters now (looks, conflicts, documents read by key);
    None when its metrics cannot be read (the report then says n/a). A scrape waits for the
    consumer's batch in hand (the budgets' gauge reads the fleet state under its lock): in a
    storm on Azurite that took more than 5 s."""
    try:
        samples = scrape(proc.stderr, timeout=120)
        looks, conflicts, fetched = (int(samples[name]) for name in LEDGER_METRICS)
    except (AssertionError, OSError, KeyError, ValueError) as err:  # wait_until's timeout
        say(f"{proc.name}'s ledger counters could not be read: {err}")
        return None
    return looks, conflicts, fetched


def _cpu(pid: int) -> float:
    """utime + stime so far; 0 once the process is gone (a dead consumer stops the run)."""
    try:
        return procstat.ticks_seconds(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0


def revision() -> str:
    """HEAD's short hash, and whether bridge/ has changes of its own: what a run measured."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" with bridge/ modified" if git("status", "--porcelain", "bridge") else "")


def save(result: RunResult, path: Path) -> None:
    """Keep what a run recorded (a run takes up to an hour; its report may change later)."""
    with path.open("wb") as out:
        pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)


def load(path: Path) -> RunResult:
    """A run `save` kept: only ever files this program wrote itself."""
    with path.open("rb") as source:
        result = pickle.load(source)  # our own file, written by `save`
    if not isinstance(result, RunResult):
        raise TypeError(f"{path} holds no load run")
    return result


def _read_jsonl(paths: Iterator[Path]) -> list[dict[str, Any]]:
    records = []
    for path in sorted(paths):
        with path.open(encoding="utf-8") as lines:
            records += [json.loads(line) for line in lines if line.strip()]
    return records

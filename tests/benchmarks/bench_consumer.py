"""5. Consumer throughput: records per second through dedup, fleet state and policy.

The consumer core (bridge.consumer.core.Consumer) in this process, pinned to one CPU, is fed
batches of 100 records as Event Hubs would hand them: heartbeats of a fleet, and every
50th record a new event (half user reboots, which are approved and sent to a local
command directory; half platform reboots, which are held). State in SQLite, or in Table
Storage on Azurite. The fleet size is a parameter because each batch reads the VM index.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bridge import recordtypes as rt
from bridge.channels.local import LocalSender
from bridge.config import Config, ConsumerSettings, StorageSettings
from bridge.consumer import documents as fs
from bridge.consumer.core import Consumer
from bridge.consumer.state import Store
from bridge.consumer.state.kinds import table_store
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import DEFAULT_POLICY
from tests.benchmarks.report import Row, rate
from tests.benchmarks.rig import Options, Result, say, scratch
from tests.support.azurite import Azurite
from tests.support.fleetrecords import FleetRecords

SQLITE_TARGET = 5000.0
BATCH = 100


def stream(vms: int, count: int) -> list[dict[str, Any]]:
    fleet = FleetRecords(datetime.now(timezone.utc))
    names = [f"vm{i:04d}" for i in range(vms)]
    for i, name in enumerate(names):
        fleet.vm(name, scale_set=f"ss{i % 20}")
    out: list[dict[str, Any]] = []
    while len(out) < count:
        fleet.advance(1)
        name = names[len(out) % vms]
        if len(out) % 50 == 49:
            source = "User" if len(out) % 100 == 99 else "Platform"
            out.append(fleet.event(name, str(uuid.uuid4()).upper(), source=source))
        else:
            out.append(fleet.heartbeat(name))
    return out


@contextlib.contextmanager
def one_cpu() -> Iterator[int]:
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, allowed)


def throughput(store: Store, root: Path, records: list[dict[str, Any]]) -> float:
    decisions: list[rt.Decision] = []
    # The stream's time runs a second a record; the consumer's clock keeps up with it (the
    # consumer takes a record from its future as of now, which would not be steady state).
    clock = [datetime.now(timezone.utc)]
    consumer = Consumer(
        store,
        LocalSender(root / "commands"),
        DEFAULT_POLICY,
        decisions.extend,
        ConsumerSettings(),
        now=lambda: clock[0],
    )

    def process(batch: list[dict[str, Any]]) -> None:
        clock[0] = datetime.fromisoformat(batch[-1]["TimeGenerated"].replace("Z", "+00:00"))
        consumer.process(batch)

    try:
        # The fleet's first records (every VM's first heartbeat) are its set-up, not steady state.
        warm = len({r["VmId"] for r in records})
        process(records[:warm])
        with one_cpu():
            began = time.monotonic()
            for start in range(warm, len(records), BATCH):
                process(records[start : start + BATCH])
            wall = time.monotonic() - began
        if not any(d["DecisionAction"] == "Approve" for d in decisions):
            raise RuntimeError("the consumer approved nothing: the stream is not what it should be")
        return rate(len(records) - warm, wall)
    finally:
        consumer.close()


def run(options: Options) -> Result:
    sizes = (100, 2000)
    count = options.pick(quick=2_000, default=20_000)
    tables_count = options.pick(quick=300, default=2_000)
    found: dict[str, float] = {}
    with scratch("consumer") as procs:
        for vms in sizes:
            say(f"consumer: {count} records, {vms} VMs, SQLite state")
            store: Store = SqliteStore(procs.workdir / f"fleet{vms}.db")
            found[f"sqlite-{vms}"] = throughput(store, procs.workdir, stream(vms, count + vms))
        azurite = Azurite(procs.workdir / "azurite").start()
        try:
            say(f"consumer: {tables_count} records, 100 VMs, Table Storage on Azurite")
            config = Config(storage=StorageSettings(connection_string=azurite.connection_string))
            store = table_store(config, f"bench{uuid.uuid4().hex[:10]}", spread=fs.PARTITIONS)
            found["tables-100"] = throughput(store, procs.workdir, stream(100, tables_count + 100))
        finally:
            azurite.stop()
    return _result(found)


def _result(found: dict[str, float]) -> Result:
    small, large = found["sqlite-100"], found["sqlite-2000"]
    rows = [
        Row("5a", "Consumer throughput, SQLite state, 100-VM fleet, one core",
            f"{small:,.0f} records/s", f"≥ {SQLITE_TARGET:,.0f}/s", small >= SQLITE_TARGET),
        Row("5b", "Consumer throughput, SQLite state, 2,000-VM fleet, one core",
            f"{large:,.0f} records/s", f"≥ {SQLITE_TARGET:,.0f}/s", large >= SQLITE_TARGET),
        Row("5c", "Consumer throughput, Table Storage (Azurite), 100-VM fleet",
            f"{found['tables-100']:,.0f} records/s", "", None),
    ]  # fmt: skip
    return Result(rows, [])

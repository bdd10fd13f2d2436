"""10. Event Grid deliveries per second through the consumer (issue 36, the second source).

Deliveries as Azure sends them (tests/support/eventgrid.py, the Event Grid schema), each event
Scheduled then Completed, of VMs no agent reports, spread over 20 scale sets, handed to the
consumer's intake (bridge.consumer.secondsource) 100 at a time, as Event Hubs hands a batch:
parsed and checked (10a), and parsed, folded into SQLite state and decided (10b), on one CPU.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.secondsource import EventGridIntake
from bridge.consumer.sources.eventgrid import Trust, parse
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import DEFAULT_POLICY
from tests.benchmarks.bench_consumer import BATCH, one_cpu
from tests.benchmarks.report import Row, rate
from tests.benchmarks.rig import Options, Result, say
from tests.support import eventgrid as eg
from tests.support.fleetrecords import SUBSCRIPTION
from tests.support.records import Sender

TRUST = Trust(frozenset({SUBSCRIPTION}), health=True)


def deliveries(events: int, now: datetime) -> list[str]:
    ids = [str(uuid.uuid4()).upper() for _ in range(events)]
    where = [([f"web_{n % 50}"], f"set{n % 20}") for n in range(events)]
    return [
        eg.scheduled(event_id, status, names, now, scale_set=scale_set)
        for status in ("Scheduled", "Completed")
        for event_id, (names, scale_set) in zip(ids, where, strict=True)
    ]


def run(options: Options) -> Result:
    events = options.pick(quick=200, default=5000)
    now = datetime.now(timezone.utc)
    bodies = deliveries(events, now)
    with one_cpu(), tempfile.TemporaryDirectory(prefix="se-bench-eventgrid-") as tmp:
        parse(bodies[0], TRUST)  # the schema is compiled once, on the first check
        began = time.perf_counter()
        for body in bodies:
            parse(body, TRUST)
        parsed = rate(len(bodies), time.perf_counter() - began)
        store = SqliteStore(Path(tmp) / "fleet.db")
        consumer = Consumer(
            store, Sender(), DEFAULT_POLICY, lambda _: None, ConsumerSettings(), now=lambda: now
        )
        intake = EventGridIntake(consumer, TRUST)
        began = time.perf_counter()
        for start in range(0, len(bodies), BATCH):
            intake.handle(bodies[start : start + BATCH])
        folded = rate(len(bodies), time.perf_counter() - began)
        store.close()
    say(f"Event Grid: {parsed:,.0f} parsed/s, {folded:,.0f} folded/s")
    return Result(
        rows=[
            Row(
                "10a",
                f"Event Grid deliveries parsed and checked, {len(bodies):,}, one core",
                f"{parsed:,.0f} deliveries/s",
                "",
                None,
            ),
            Row(
                "10b",
                "Event Grid deliveries through the consumer (parse, fold, decide), "
                "SQLite state, one core",
                f"{folded:,.0f} deliveries/s",
                "",
                None,
            ),
        ],
        notes=[
            "10: each event of a VM no agent reports, Scheduled then Completed (held: no agent "
            "to carry an approval), 100 deliveries a batch; the schema check of each record "
            "is most of 10a."
        ],
    )

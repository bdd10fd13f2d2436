"""12. What the Resource Graph reconciler costs per pass and per 1,000 VMs (issue 36, item 4).

A fleet of VMs in scale sets of 100, every VM with its health row (a few Unavailable) and one
VM in 20 with an open scheduled event, held by Resource Graph as the docs shape its rows (the
health rows with the properties a VM's availability status carries). The consumer already
holds what Event Grid delivered, as in steady state; the reconciler's real client reads the
Resource Graph double over HTTPS (TLS on loopback), page by page. Per pass: requests (each one
of the identity's Resource Graph quota, 15 per 5 s), bytes each way, rows, what was folded
(nothing in steady state), and its wall and CPU time.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from azure.core.credentials import AccessToken

from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.secondsource import EventGridIntake, FleetKnown
from bridge.consumer.sources.eventgrid import Trust
from bridge.consumer.sources.resourcegraph import Reconciler, RequestsTransport, ResourceGraph
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import DEFAULT_POLICY
from tests.benchmarks.report import Row
from tests.benchmarks.rig import Options, Result, say
from tests.doubles.resourcegraph import ResourceGraphDouble, row_of
from tests.support import eventgrid as eg
from tests.support.fleetrecords import SUBSCRIPTION
from tests.support.records import Sender

TRUST = Trust(frozenset({SUBSCRIPTION}), health=True)
INTERVAL = 300.0  # the interval docs/second-source.md suggests


class _Token:
    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("eyJ0eXAiOiJKV1QifQ.e30.c2ln", 2**31)


@contextlib.contextmanager
def _ca(bundle: Path) -> Iterator[None]:
    was = os.environ.get("REQUESTS_CA_BUNDLE")
    os.environ["REQUESTS_CA_BUNDLE"] = str(bundle)
    try:
        yield
    finally:
        if was is None:
            os.environ.pop("REQUESTS_CA_BUNDLE", None)
        else:
            os.environ["REQUESTS_CA_BUNDLE"] = was


def _fleet(graph: ResourceGraphDouble, vms: int, now: datetime) -> list[str]:
    """Fill `graph`; the deliveries Event Grid made of the same (the consumer's state)."""
    delivered = []
    for n in range(vms):
        scale_set, name = f"set{n // 100}", f"set{n // 100}_{n % 100}"
        state = "Unavailable" if n % 250 == 0 else "Available"
        health = eg.health(name, state, now, scale_set=scale_set)
        row = row_of(health)
        row["properties"].update({
            "title": "Available" if state == "Available" else "Unavailable",
            "summary": "There aren't any known Azure platform problems affecting this virtual "
                       "machine.", "reasonType": "", "reasonChronicity": "Persistent",
            "reportedTime": row["properties"]["occurredTime"], "category": "Unplanned",
            "context": "Platform Initiated"})  # fmt: skip
        graph.tables["healthresources"].append(row)
        delivered.append(health)
        if n % 20 == 0:
            event = eg.scheduled(str(uuid.uuid4()).upper(), "Scheduled", [name], now,
                                 scale_set=scale_set)  # fmt: skip
            graph.tables["maintenanceresources"].append(row_of(event))
            delivered.append(event)
    return delivered


def measure(vms: int) -> dict[str, float]:
    now = datetime.now(timezone.utc)
    with ResourceGraphDouble(quota=10**6) as graph, _ca(graph.ca_bundle), \
            tempfile.TemporaryDirectory(prefix="se-bench-reconciler-") as tmp:  # fmt: skip
        delivered = _fleet(graph, vms, now)
        store = SqliteStore(Path(tmp) / "fleet.db")
        consumer = Consumer(store, Sender(), DEFAULT_POLICY, lambda _: None, ConsumerSettings(),
                            now=lambda: now, health=True)  # fmt: skip
        intake = EventGridIntake(consumer, TRUST)
        for start in range(0, len(delivered), 100):
            intake.handle(delivered[start : start + 100])
        client = ResourceGraph(graph.url, _Token(), RequestsTransport())
        reconciler = Reconciler(client, intake, FleetKnown(consumer), lambda: now)
        wall, cpu = time.perf_counter(), time.process_time()
        chosen = reconciler.reconcile()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        store.close()
        cost = reconciler.cost
        return {"requests": cost.requests, "sent": cost.bytes_sent,
                "received": cost.bytes_received, "rows": cost.rows, "wall": wall, "cpu": cpu,
                "folded": len(chosen.events) + len(chosen.health)}  # fmt: skip


def run(options: Options) -> Result:
    sizes = [200] if options.quick else [1000, 5000]
    rows, per = [], {}
    for vms in sizes:
        found = measure(vms)
        per[vms] = found
        say(f"reconciler, {vms} VMs: {found}")
        day = 86400 / INTERVAL
        rows.append(Row(
            f"12{'ab'[sizes.index(vms)]}",
            f"Resource Graph reconciler, one pass over {vms:,} VMs ({vms // 20} open events)",
            f"{found['requests']:.0f} requests, {found['sent'] / 1024:.1f} KiB sent, "
            f"{found['received'] / 1024:,.0f} KiB received, {found['wall']:.2f} s wall, "
            f"{found['cpu']:.2f} s CPU, {found['folded']:.0f} folded; every 5 min: "
            f"{found['requests'] * day:,.0f} requests and "
            f"{found['received'] * day / 2**20:,.0f} MiB a day",
            "", None))  # fmt: skip
    first = per[sizes[0]]
    return Result(
        rows=rows,
        notes=[
            f"12: per 1,000 VMs a pass is {first['requests'] * 1000 / sizes[0]:.1f} requests "
            f"and {first['received'] * 1000 / sizes[0] / 1024:,.0f} KiB (1,000 rows a page); "
            "Resource Graph bills nothing, its cost is the identity's quota (15 requests per "
            "5 s), of which a pass takes its requests once every eventgrid.reconcile_interval. "
            "The double returns rows as the documented shapes; a real health row may carry "
            "more properties."
        ],
    )

"""6. Cloud cost per VM-month in steady state (no maintenance), from counted operations.

A measured run of three agents (Event Hubs, Log Analytics, a Storage queue command channel,
signed commands) and one consumer (Table Storage state, blob checkpoints). Heartbeats come
every 2 s instead of 300 s so a short run sees many; the count per heartbeat is then scaled
to the default interval. Storage transactions are counted by a proxy in front of each
Azurite service; Event Hubs events and Log Analytics bytes by the doubles.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bridge import schema
from tests.benchmarks.bench_approval import signing_pair
from tests.benchmarks.countingproxy import CountingProxy, counted_azurite
from tests.benchmarks.report import (
    GB,
    HOURS_PER_MONTH,
    SECONDS_PER_MONTH,
    MonthlyUse,
    Prices,
    Row,
    billed_row_size,
    eventhubs_units,
    monthly_cost,
    naive_queue_cost,
    per_month,
    usd,
)
from tests.benchmarks.rig import (
    Options,
    Result,
    agent_options,
    consumer_options,
    say,
    scratch,
)
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.doubles.logs_ingestion import LogsIngestionDouble
from tests.support.azurite import ACCOUNT, KEY
from tests.support.cloud import RULE, cloud_env
from tests.support.processes import Processes, Simulator

VMS = ("vm-0", "vm-1", "vm-2")
RUN_HEARTBEAT = 2.0
DEFAULT_HEARTBEAT = 300.0  # agent.heartbeat_interval's default
TARGET = 0.01

PRICES = Prices(
    eventhubs_per_million_events=0.028,
    eventhubs_tu_per_hour=0.03,
    loganalytics_per_gb=2.30,
    queue_per_10k_operations=0.004,
    table_per_10k_transactions=0.00036,
    blob_write_per_10k_operations=0.065,
    as_of="2026-11-21 (pay-as-you-go list prices, USD)",
    sources=(
        "Event Hubs Standard: $0.028 per million ingress events, throughput unit $21.90/month "
        "($0.03/h): https://azure.microsoft.com/pricing/details/event-hubs/ (as quoted by "
        "https://github.com/infracost/infracost/issues/1354)",
        "Log Analytics, Analytics logs: ~$2.30 per GB ingested, first 5 GB a month free "
        "(not deducted here): https://azure.microsoft.com/pricing/details/monitor/ (as quoted by "
        "https://monitoringcost.com/azure-monitor-cost); billed size rules: "
        "https://learn.microsoft.com/azure/azure-monitor/logs/cost-logs",
        "Storage queue operations $0.004 per 10,000, Table transactions $0.00036 per 10,000, "
        "blob write operations (hot) $0.065 per 10,000 (GPv2, LRS): NOT confirmed from a "
        "source reachable here; check https://azure.microsoft.com/pricing/details/storage/queues/,"
        " .../storage/tables/ and .../storage/blobs/",
    ),
)


@dataclass
class Counted:
    seconds: float
    hub_sizes: list[int]
    heartbeats: int
    analytics_bytes: int  # JSON as sent
    analytics_billed: int  # by the service's billed-size rule (report.billed_row_size)
    analytics_records: int
    queue: int
    table: int
    blob: int


def run(options: Options) -> Result:
    window = options.pick(quick=20, default=60)
    broker = EventHubsBroker(hub="records", partitions=4)
    logs = LogsIngestionDouble(RULE, schema.DCR_STREAM, schema.dcr_stream_declaration())
    with (
        broker,
        logs,
        scratch("cost") as procs,
        counted_azurite(procs.workdir / "azurite") as proxies,
    ):
        counted = _measure(procs, broker, logs, proxies, window)
    return _result(counted)


def _connection_string(proxies: dict[str, CountingProxy]) -> str:
    ends = {s: f"{p.url}/{ACCOUNT}" for s, p in proxies.items()}
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint={ends['blob']};QueueEndpoint={ends['queue']};"
        f"TableEndpoint={ends['table']};"
    )


def _start(
    procs: Processes, broker: EventHubsBroker, logs: LogsIngestionDouble, storage: str
) -> Simulator:
    tag = uuid.uuid4().hex[:8]
    signing, verify = signing_pair(procs.workdir)
    start_consumer(procs, broker, storage, tag, signing)
    return start_agents(procs, broker, logs, storage, tag, verify=verify, heartbeat=RUN_HEARTBEAT)


def start_agents(
    procs: Processes,
    broker: EventHubsBroker,
    logs: LogsIngestionDouble,
    storage: str,
    tag: str,
    *,
    verify: str,
    heartbeat: float,
    vms: tuple[str, ...] = VMS,
    fleet: Path | None = None,
    name: str = "sim",
) -> Simulator:
    """The simulator and an agent per VM: Event Hubs, Log Analytics, a Storage queue each.

    `vms`: the simulator's VMs, standalone `vm-N` unless `fleet` (a fleet file) names them."""
    shared = {
        "SE_BRIDGE_STORAGE_CONNECTION_STRING": storage,
        "SE_BRIDGE_COMMANDS_QUEUE_PREFIX": f"c{tag}-",
    }
    fleet_args = ("--fleet", str(fleet), "--seed", "1") if fleet else ("--vms", str(len(vms)))
    sim = Simulator.launch(procs, name, *fleet_args)
    for vm in vms:
        env = {
            **cloud_env(broker, logs, sim.vm_url(vm)),
            **shared,
            "SE_BRIDGE_COMMANDS_VERIFY_KEY": verify,
            "SE_BRIDGE_AGENT_HEARTBEAT_INTERVAL": str(heartbeat),
            # Every send uploads: the quota model applies loganalytics.send_interval.
            "SE_BRIDGE_LOGANALYTICS_SEND_INTERVAL": "0",
        }
        procs.bridge(
            vm,
            "agent",
            *agent_options(sim, vm, procs.workdir / vm, "eventhubs", "loganalytics"),
            "--commands",
            "storagequeue",
            env=env,
        )
    return sim


def start_consumer(
    procs: Processes, broker: EventHubsBroker, storage: str, tag: str, signing: str
) -> None:
    """One standalone consumer: Table Storage state, blob checkpoints, Storage queues."""
    consumer_env = {
        "SE_BRIDGE_STORAGE_CONNECTION_STRING": storage,
        "SE_BRIDGE_COMMANDS_QUEUE_PREFIX": f"c{tag}-",
        "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": broker.connection_string,
        "SE_BRIDGE_COMMANDS_SIGNING_KEY": signing,
        "SE_BRIDGE_CONSUMER_TABLE_NAME": f"fleet{tag}",
        "SE_BRIDGE_CONSUMER_CHECKPOINT_CONTAINER": f"checkpoints-{tag}",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    decisions = procs.workdir / "decisions.jsonl"
    procs.bridge(
        "consumer",
        "consume",
        *consumer_options(procs.workdir, decisions),
        env=consumer_env,
    )


def _measure(
    procs: Processes,
    broker: EventHubsBroker,
    logs: LogsIngestionDouble,
    proxies: dict[str, CountingProxy],
    window: int,
) -> Counted:
    sim = _start(procs, broker, logs, _connection_string(proxies))
    sim.wait_polls(dict.fromkeys(VMS, 3))
    say(f"cost: warming up 20 s, then {window} s counted (heartbeats every {RUN_HEARTBEAT:g} s)")
    time.sleep(20)
    hub0, logs0, rows0 = len(broker.events()), len(logs.requests), len(logs.records())
    storage0 = {s: p.total() for s, p in proxies.items()}
    began = time.monotonic()
    time.sleep(window)
    seconds = time.monotonic() - began
    events = broker.events()[hub0:]
    requests = [r for r in logs.requests[logs0:] if r.status == 204]
    storage = {s: p.total() - storage0[s] for s, p in proxies.items()}
    kinds = Counter(json.loads(e.body)["RecordType"] for e in events)
    types = dict(schema.columns())
    return Counted(
        seconds,
        [len(e.body) for e in events],
        kinds["Heartbeat"],
        sum(r.uncompressed_size or 0 for r in requests),
        sum(billed_row_size(row, types) for row in logs.records()[rows0:]),
        sum(r.record_count or 0 for r in requests),
        storage["queue"],
        storage["table"],
        storage["blob"],
    )


def _result(c: Counted) -> Result:
    if not c.heartbeats:
        raise RuntimeError("no heartbeat reached Event Hubs during the counted window")
    per_vm_month = SECONDS_PER_MONTH / DEFAULT_HEARTBEAT  # heartbeats one VM sends a month

    def scaled(count: float) -> float:  # record-driven: per heartbeat, then per VM-month
        return per_month(count, measured=c.heartbeats, month=per_vm_month)

    use = MonthlyUse(
        eventhubs_events=scaled(eventhubs_units(c.hub_sizes)),
        eventhubs_bytes=scaled(sum(c.hub_sizes)),
        loganalytics_bytes=scaled(c.analytics_billed),
        queue_operations=c.queue / len(VMS) * SECONDS_PER_MONTH / c.seconds,
        table_transactions=scaled(c.table),
    )
    cost = monthly_cost(use, PRICES)
    total = sum(cost.values())
    json_bytes = scaled(c.analytics_bytes)
    upper = total - cost["loganalytics"] + json_bytes / GB * PRICES.loganalytics_per_gb
    naive = naive_queue_cost(PRICES)
    blob_month = c.blob * SECONDS_PER_MONTH / c.seconds
    blob_cost = blob_month / 1e4 * PRICES.blob_write_per_10k_operations
    tu_month = PRICES.eventhubs_tu_per_hour * HOURS_PER_MONTH
    breakdown = ", ".join(f"{k} {usd(v)}" for k, v in cost.items())
    rows = [
        Row("6a", "Cloud cost per VM-month, steady state (EH ingress + TU share + LA + queue + "
            "table)", f"{usd(total)} ({breakdown})", f"≤ {usd(TARGET)}", total <= TARGET),
        Row("6b", "Naive design for comparison: same, plus reading the queue every second",
            f"{usd(total + naive)} (queue reads alone {usd(naive)})", "", None),
    ]  # fmt: skip
    stored = max(1, c.analytics_records)
    notes = [
        f"6: counted in {c.seconds:.0f} s with {len(VMS)} agents and one consumer: "
        f"{len(c.hub_sizes)} Event Hubs events ({c.heartbeats} heartbeats, "
        f"{sum(c.hub_sizes) / max(1, len(c.hub_sizes)):.0f} B each on average), "
        f"{c.analytics_records} Log Analytics rows "
        f"({c.analytics_bytes / stored:.0f} B of JSON each, {c.analytics_billed / stored:.0f} B "
        f"billed), {c.queue} queue, {c.table} table and "
        f"{c.blob} blob requests.",
        f"6: per VM-month at the default 300 s heartbeat: {use.eventhubs_events:,.0f} billed EH "
        f"events, {use.loganalytics_bytes / 1e6:.1f} MB billed by Log Analytics, "
        f"{use.queue_operations:,.0f} queue operations, {use.table_transactions:,.0f} table "
        "transactions (the consumer's, per record).",
        "6: fleet-wide, not per VM: the namespace's first throughput unit "
        f"({usd(tu_month)}/month whatever the fleet size), and the "
        f"consumer's checkpoint/ownership blob requests ({blob_month:,.0f}/month measured, "
        f"{usd(blob_cost)}/month all priced as writes; they grow with partitions and consumers, "
        "not VMs: a partition's checkpoint is written at most every "
        "consumer.checkpoint_interval, 5 s). Spread over a fleet of 1,000 VMs these two add "
        f"{usd((tu_month + blob_cost) / 1000)} per VM-month.",
        "6: Log Analytics bytes follow the service's billed-size rule: the string form of each "
        "stored column's value, plus TenantId, datetimes as 28 characters; null columns and "
        "column names count nothing (the rule does not say so in as many words). Billed on "
        f"the JSON the double received instead, {json_bytes / 1e6:.1f} MB, the total would "
        f"be {usd(upper)}: the upper bound.",
        f"6: prices as of {PRICES.as_of}: " + " | ".join(PRICES.sources),
    ]
    return Result(rows, notes)

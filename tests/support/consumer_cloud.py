"""`se-bridge consume` processes against Azurite and the Event Hubs test broker, and what they did.

`CloudConsumers` holds one test's names (fleet state table, checkpoint container, queue prefix:
all unique, so tests share one Azurite), starts consumer processes configured by environment
as an operator would, sends records through the agent's own Event Hubs sink, and reads back
the three things a consumer leaves behind: commands in the per-VM queues, the approval ledger
in Table Storage, and partition ownership in the checkpoint container.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar, cast

from azure.core.exceptions import ResourceNotFoundError
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
from azure.storage.queue import QueueServiceClient

from bridge.commands import message as commands
from bridge.config import Config, EventHubsSettings
from bridge.consumer import documents as fs
from bridge.consumer.ledger import read_ledger
from bridge.consumer.state.kinds import table_store
from bridge.sinks import SpooledRecord
from bridge.sinks.eventhubs import EventHubsSink
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.support.azurite import Azurite
from tests.support.fleetrecords import FleetRecords
from tests.support.processes import Proc, Processes, Record, read_records, tail
from tests.support.state import tables_config
from tests.support.wait import eventually

HUB = "records"
GROUP = "$Default"
WAIT = 90.0  # a timeout only costs time when something is already wrong
T = TypeVar("T")

# Every budget counts every approval; the one rule approves whatever is still Scheduled.
ONE_PER_SCALE_SET = """\
version: 1
budgets:
  - name: one-vm-per-scale-set
    group: scale_set
    max_vms: 1
rules:
  - name: approve-scheduled
    match: {status: Scheduled}
    action: approve
"""


@dataclass(frozen=True)
class PlannedEvent:
    """An event the test sends: it affects (and is reported by) one VM."""

    event_id: str
    vm: str
    scale_set: str | None
    source: str
    event_type: str


class CloudConsumers:
    """One test's consumer processes and the Azure names they share."""

    def __init__(
        self,
        procs: Processes,
        broker: EventHubsBroker,
        azurite: Azurite,
        policy: str = ONE_PER_SCALE_SET,
    ) -> None:
        self.procs, self.broker, self.azurite = procs, broker, azurite
        uid = uuid.uuid4().hex[:10]
        self.table = f"t{uid}"
        self.container = f"cp-{uid}"
        self.prefix = f"q{uid}-"
        self.policy_path = procs.workdir / "policy.yaml"
        self.policy_path.write_text(policy, encoding="utf-8")
        self.fleet = FleetRecords(datetime.now(timezone.utc))
        self.running: dict[str, Proc] = {}
        self._store = table_store(
            tables_config(azurite.connection_string), self.table, spread=fs.PARTITIONS
        )
        self._queues = QueueServiceClient.from_connection_string(azurite.connection_string)
        self._checkpoints = BlobCheckpointStore.from_connection_string(
            azurite.connection_string, self.container
        )
        self._seq = 0
        self._seq_lock = threading.Lock()

    def close(self) -> None:
        self._store.close()
        self._queues.close()
        self._checkpoints.close()

    # --- consumer processes ------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {
            "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": self.broker.connection_string,
            "SE_BRIDGE_EVENTHUBS_NAME": HUB,
            "SE_BRIDGE_STORAGE_CONNECTION_STRING": self.azurite.connection_string,
            "SE_BRIDGE_CONSUMER_STATE": "tables",
            "SE_BRIDGE_CONSUMER_TABLE_NAME": self.table,
            "SE_BRIDGE_CONSUMER_CHECKPOINT_CONTAINER": self.container,
            "SE_BRIDGE_COMMANDS_CHANNEL": "storagequeue",
            # The commands' signatures are not what these tests are about.
            "SE_BRIDGE_COMMANDS_ALLOW_UNSIGNED": "true",
            "SE_BRIDGE_COMMANDS_QUEUE_PREFIX": self.prefix,
            "SE_BRIDGE_CONSUMER_LOAD_BALANCING_INTERVAL": "2",
            "SE_BRIDGE_CONSUMER_REEVALUATE_INTERVAL": "0.5",
            "SE_BRIDGE_CONSUMER_POLICY": str(self.policy_path),
            # Nothing here plays the agent's listener: no Approval record arrives for most
            # commands, and the fallback to another VM must not be what the test sees.
            "SE_BRIDGE_CONSUMER_APPROVAL_TIMEOUT": "3600",
            "SE_BRIDGE_CONSUMER_LOG_LEVEL": "INFO",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def start(self, name: str, *, home: str | None = None) -> Proc:
        """A consumer process; `home` names its state directory and Decision file (default:
        its own), so a restarted consumer can take over the spool of the one it replaces."""
        home = home or name
        proc = self.procs.bridge(
            name, "consume", "--state-dir", str(self.procs.workdir / home),
            "--sink", f"jsonl:{self.decisions_path(home)}", env=self.env(),
        )  # fmt: skip
        self.running[name] = proc
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL (TerminateProcess on Windows): no handler runs, nothing is flushed."""
        self.running.pop(name).kill()

    def stop_all(self) -> None:
        """Stop every running consumer as a service manager would; each must exit 0."""
        procs = list(self.running.values())
        for proc in procs:
            proc.interrupt()
        for proc in procs:
            assert proc.wait() == 0, proc.output()
            assert "Traceback" not in proc.stderr(), proc.output()
        self.running.clear()

    def decisions_path(self, home: str) -> Path:
        return self.procs.workdir / f"{home}.decisions.jsonl"

    def decisions(self, home: str) -> list[Record]:
        return read_records(self.decisions_path(home))

    def check_alive(self) -> None:
        """Fail at once, with its output, when a consumer that should run has exited."""
        for proc in self.running.values():
            if not proc.alive:
                raise AssertionError(f"{proc.name} exited\n{proc.output()}")

    def wait(self, predicate: Callable[[], T | None], what: str, interval: float = 0.05) -> T:
        """`predicate`'s first truthy value; fails at once if a running consumer exited."""

        def check() -> T | None:
            self.check_alive()
            return predicate()

        return eventually(check, what=what, timeout=WAIT, details=self.describe, interval=interval)

    def describe(self) -> str:
        parts = [f"--- ledger: {json.dumps(self.ledger_brief(), indent=1)}"]
        parts += [f"--- commands: {sorted(c.event_id for c in self.commands())}"]
        for proc in self.running.values():
            parts.append(f"--- {proc.name} stderr:\n{tail(proc.stderr(), 40)}")
        return "\n".join(parts)

    # --- records in ------------------------------------------------------------------------

    def send(self, records: Sequence[Record], *, senders: int = 4) -> None:
        """Send through the agent's Event Hubs sink, `senders` producers at once, each VM's
        records in order through one of them (the sink's partition key is the VmId)."""
        lanes: list[list[Record]] = [[] for _ in range(senders)]
        vms = sorted({str(r["VmId"]) for r in records})
        lane_of = {vm: i % senders for i, vm in enumerate(vms)}
        for record in records:
            lanes[lane_of[str(record["VmId"])]].append(record)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=self._send_lane, args=(lane, errors)) for lane in lanes if lane
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors, errors

    def _send_lane(self, records: list[Record], errors: list[BaseException]) -> None:
        config = Config(eventhubs=EventHubsSettings(
            connection_string=self.broker.connection_string, name=HUB))  # fmt: skip
        sink = EventHubsSink(config.eventhubs, config.identity)
        try:
            batch = []
            for record in records:
                with self._seq_lock:
                    self._seq += 1
                    seq = self._seq
                batch.append(SpooledRecord(seq, record["RecordId"], record["RecordType"],
                                           json.dumps(record)))  # fmt: skip
            sink.send(batch)
        except BaseException as err:
            errors.append(err)
        finally:
            sink.close()

    def now(self) -> datetime:
        """Records carry the real time: the consumer judges liveness by its own clock."""
        self.fleet.now = max(datetime.now(timezone.utc), self.fleet.now + timedelta(milliseconds=1))
        return self.fleet.now

    def heartbeats(self, names: Iterable[str]) -> list[Record]:
        self.now()
        return [self.fleet.heartbeat(name) for name in names]

    def scheduled(self, events: Iterable[PlannedEvent]) -> list[Record]:
        out = []
        for event in events:
            self.now()
            out.append(
                self.fleet.event(
                    event.vm, event.event_id, event_type=event.event_type, source=event.source,
                    not_before=self.fleet.now + timedelta(hours=1),
                )
            )  # fmt: skip
        return out

    def finished(self, events: Iterable[PlannedEvent], approved: Mapping[str, Any]) -> list[Record]:
        """What the agent of each event's VM reports once it carried the approval out: its
        Approval record, then Started, then Completed, in that order on its partition."""
        out = []
        for event in events:
            self.now()
            out.append(self.fleet.approval(approved[event.event_id]))
            for transition in ("Started", "Completed"):
                self.now()
                out.append(
                    self.fleet.event(event.vm, event.event_id, transition=transition,
                                     event_type=event.event_type, source=event.source)
                )  # fmt: skip
        return out

    # --- what the consumers left ---------------------------------------------------------------

    def messages(self) -> list[str]:
        """The text of every message in this test's per-VM queues (peeked: they stay)."""
        out: list[str] = []
        for queue in self._queues.list_queues(name_starts_with=self.prefix):
            client = self._queues.get_queue_client(queue.name)
            try:
                out += [str(m.content) for m in client.peek_messages(max_messages=32)]
            except ResourceNotFoundError:
                continue
        return out

    def commands(self) -> list[commands.Command]:
        return [commands.parse(text) for text in self.messages()]

    def ledger(self) -> dict[str, dict[str, Any]]:
        """The approval ledger's entries by event key (empty before the first approval)."""
        return cast(dict[str, dict[str, Any]], read_ledger(self._store).events)

    def known_vms(self) -> int:
        """How many VMs the fleet state holds (the consumers have merged their records)."""
        return len(self._store.scan(fs.VM))

    def ledger_brief(self) -> dict[str, dict[str, Any]]:
        keep = ("origin", "vms", "command_id", "sent", "confirmed")
        return {k: {f: e.get(f) for f in keep} for k, e in self.ledger().items()}

    def owners(self) -> dict[str, str]:
        """Partition id -> owner id, as the SDK's load balancing left it in blob storage."""
        namespace = f"{self.broker.host}:{self.broker.port}"
        try:
            found = self._checkpoints.list_ownership(namespace, HUB, GROUP)
        except ResourceNotFoundError:
            return {}
        return {str(o["partition_id"]): str(o["owner_id"]) for o in found if o.get("owner_id")}


def by_event(found: Iterable[commands.Command]) -> dict[str, list[commands.Command]]:
    out: dict[str, list[commands.Command]] = {}
    for command in found:
        out.setdefault(fs.event_key(command.event_id), []).append(command)
    return out


def assert_one_approval_per_event(found: Sequence[commands.Command]) -> dict[str, int]:
    """At most one CommandId per event, every copy of it identical; the copies per CommandId.

    A copy is the same command sent again: a consumer resends the command of a ledger entry
    left unsent for a while (bridge.consumer.dispatch.RESEND_UNSENT_AFTER), which after a crash
    between the send and marking the entry sent means twice. The agent acts once per EventId and
    CommandId, so a copy is never a second approval.
    """
    for key, mine in by_event(found).items():
        assert len({c.command_id for c in mine}) == 1, (
            f"event {key} was approved by {len(mine)} different commands: {mine}"
        )
        assert len({c.to_json() for c in mine}) == 1, f"copies of {key}'s command differ: {mine}"
    return dict(Counter(c.command_id for c in found))


def scale_set_of(events: Iterable[PlannedEvent]) -> dict[str, str | None]:
    return {fs.event_key(e.event_id): e.scale_set for e in events}


def assert_budget_held(
    ledger: Mapping[str, Mapping[str, Any]],
    found: Sequence[commands.Command],
    completed: set[str],
    scale_sets: Mapping[str, str | None],
) -> None:
    """At most one event per scale set approved and not completed: in the ledger, and in the
    commands (every command of an event not yet reported Completed counts as outstanding)."""
    in_ledger = Counter(
        scale_sets[key] for key, e in ledger.items() if e.get("origin") == "approved"
    )
    outstanding = Counter(scale_sets[key] for key in by_event(found) if key not in completed)
    for where, counts in (("ledger", in_ledger), ("queues", outstanding)):
        over = {s: n for s, n in counts.items() if s is not None and n > 1}
        assert not over, f"budget broken in the {where}: approved and not completed {over}"

"""3. Approval round trip: a user-initiated Reboot appears in the simulator; how long until its
StartRequests POST arrives there.

Central: agent → Event Hubs (test broker) → `se-bridge consume` (Table Storage state) → the
VM's Storage queue (Azurite) → the agent's listener → IMDS POST; commands signed with
Ed25519 as in production. Local: the agent's own policy (`--policy`). Every part is a real
process; agents poll IMDS every second and read their queue every second while an event is
pending. Both times are the simulator's and this process's wall clock, on one machine.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.commands.signing import verify_key_text
from tests.azurite import Azurite
from tests.benchmarks.report import Row, ms, percentile
from tests.benchmarks.rig import Options, Result, say, scratch
from tests.doubles.eventhubs_broker import EventHubsBroker
from tests.e2e.harness import Processes, Simulator, wait_until

VMS = ("vm-0", "vm-1")
CENTRAL_TARGET = 2.5
LOCAL_TARGET = 1.2
LOCAL_POLICY = """\
version: 1
rules:
  - name: user-initiated
    match: {event_source: User}
    action: approve
"""


def run(options: Options) -> Result:
    count = options.pick(quick=5, default=50)
    central = _central(count)
    local = _local(count)
    rows = [
        _row("3a", "central (EH → consumer → Storage queue → agent, signed)", central,
             CENTRAL_TARGET),
        _row("3b", "local mode (`agent --policy`)", local, LOCAL_TARGET),
    ]  # fmt: skip
    notes = [
        f"3: central max {ms(max(central))}, local max {ms(max(local))}; every approval "
        "reached the simulator exactly once per event."
    ]
    return Result(rows, notes)


def _row(number: str, what: str, values: list[float], target: float) -> Row:
    p99 = percentile(values, 99)
    result = f"p50 {ms(percentile(values, 50))}, p99 {ms(p99)}"
    return Row(number, f"Approval round trip, {what}, {len(values)} events, 1 s polling",
               result, f"p99 ≤ {target:g} s", p99 <= target)  # fmt: skip


def signing_pair(folder: Path) -> tuple[str, str]:
    """(commands.signing_key, commands.verify_key) of a fresh Ed25519 pair."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    path = folder / "signing.pem"
    path.write_bytes(pem)
    os.chmod(path, 0o600)
    return f"file:{path}", verify_key_text(private.public_key())


def _central(count: int) -> list[float]:
    with EventHubsBroker(hub="records", partitions=4) as broker, scratch("approval") as procs:
        azurite = Azurite(procs.workdir / "azurite").start()
        try:
            signing, verify = signing_pair(procs.workdir)
            tag = uuid.uuid4().hex[:8]
            env = {
                "SE_BRIDGE_EVENTHUBS_CONNECTION_STRING": broker.connection_string,
                "SE_BRIDGE_STORAGE_CONNECTION_STRING": azurite.connection_string,
                "SE_BRIDGE_COMMANDS_QUEUE_PREFIX": f"b{tag}-",
                "SE_BRIDGE_CONSUMER_TABLE_NAME": f"fleet{tag}",
                "SE_BRIDGE_CONSUMER_CHECKPOINT_CONTAINER": f"checkpoints-{tag}",
                "SE_BRIDGE_CONSUMER_LOAD_BALANCING_INTERVAL": "2",
                "NO_PROXY": "127.0.0.1,localhost",
            }
            sim = Simulator.launch(procs, "sim", "--vms", str(len(VMS)))
            for vm in VMS:
                _agent(procs, sim, vm, ["--sink", "eventhubs", "--commands", "storagequeue"],
                       {**env, "SE_BRIDGE_COMMANDS_VERIFY_KEY": verify})  # fmt: skip
            procs.bridge(
                "consumer", "consume", "--commands", "storagequeue", "--state", "tables",
                "--state-dir", str(procs.workdir / "consumer"),
                "--sink", f"jsonl:{procs.workdir / 'decisions.jsonl'}",
                env={**env, "SE_BRIDGE_COMMANDS_SIGNING_KEY": signing},
            )  # fmt: skip
            return _round_trips(sim, count, "central")
        finally:
            azurite.stop()


def _local(count: int) -> list[float]:
    with scratch("local") as procs:
        policy = procs.workdir / "policy.yaml"
        policy.write_text(LOCAL_POLICY, encoding="utf-8")
        sim = Simulator.launch(procs, "sim", "--vms", str(len(VMS)))
        for vm in VMS:
            _agent(procs, sim, vm, ["--policy", str(policy)], {})
        return _round_trips(sim, count, "local")


def _agent(procs: Processes, sim: Simulator, vm: str, args: Sequence[str],
           env: dict[str, str]) -> None:  # fmt: skip
    procs.bridge(
        vm, "agent", "--imds-url", sim.vm_url(vm), "--poll-interval", "1",
        "--state-dir", str(procs.workdir / vm), "--sink", f"jsonl:{procs.workdir / vm}.jsonl",
        *args, env=env,
    )  # fmt: skip


def _round_trips(sim: Simulator, count: int, mode: str) -> list[float]:
    sim.wait_polls(dict.fromkeys(VMS, 3))
    # The first approval also pays for queue creation and the consumer's partition claim.
    say(f"approval ({mode}): a warm-up event, then {count} user reboots")
    _one(sim, VMS[0])
    found = []
    for i in range(count):
        time.sleep(random.uniform(0.2, 1.2))
        found.append(_one(sim, VMS[i % len(VMS)]))
    return found


def _one(sim: Simulator, vm: str) -> float:
    before = time.time()
    event_id = sim.add_event(EventType="Reboot", EventSource="User", Resources=[vm],
                             notice=3600.0)  # fmt: skip

    def approved() -> float | None:
        found = [a for a in sim.call("GET", "/control/approvals")["approvals"]
                 if a["eventId"] == event_id]  # fmt: skip
        return float(found[0]["timestamp"]) if found else None

    at = wait_until(approved, f"the approval of {event_id}", 60, interval=0.05)
    sim.act(event_id, "complete")  # approved means Started (no approval delay)
    return at - before

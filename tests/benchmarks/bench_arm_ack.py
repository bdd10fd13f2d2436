"""11. Time from an Event Grid delivery to ARM's acknowledge (issue 36, the carrier of last resort).

Each delivery is a Scheduled event of a VM no agent reports (its own scale set, so no budget
holds it), handed to the consumer's intake (bridge.consumer.secondsource) alone, as Event Hubs
hands a batch of one; the consumer folds it into SQLite state, decides it (an `approve` rule),
writes the ledger entry and the Decision record, and acknowledges it through the real ARM client
(bridge.cloud.armack) to the ARM double over TLS on loopback, with a managed-identity token
from the IMDS simulator (fetched once, then kept, as in production). Measured: from the
intake's call to the double's receipt of the POST (11a), and to the intake's return, the
approval folded into the ledger (11b). ARM's own time to answer is not in it: the double
answers at once, where ARM takes its own round trip (hundreds of ms) on top.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bridge.cloud.armack import ArmAcknowledge
from bridge.cloud.identity import credential
from bridge.config import ConsumerSettings, IdentitySettings
from bridge.consumer import armcarrier
from bridge.consumer.core import Consumer
from bridge.consumer.secondsource import EventGridIntake
from bridge.consumer.sources.eventgrid import Trust
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import Action, Match, Policy, Rule
from bridge.simulator import Simulator, SimulatorServer
from bridge.simulator.fleet import Fleet
from bridge.simulator.vms import demo_vms
from tests.benchmarks.report import Row, ms, percentile
from tests.benchmarks.rig import Options, Result, say
from tests.doubles.arm import ArmDouble, client_environment, issued_for_arm
from tests.support import eventgrid as eg
from tests.support.fleetrecords import SUBSCRIPTION
from tests.support.records import Sender

TRUST = Trust(frozenset({SUBSCRIPTION}))
APPROVE = Policy(rules=(Rule("all", Match(), Action("approve")),))


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run(options: Options) -> Result:
    events = options.pick(quick=20, default=500)
    start = datetime.now(timezone.utc)
    ids = [str(uuid.uuid4()) for _ in range(events + 1)]  # the first warms the token up
    with (
        SimulatorServer(Simulator(Fleet(demo_vms(seed=0)))) as sim,
        ArmDouble() as arm,
        tempfile.TemporaryDirectory(prefix="se-bench-arm-") as tmp,
        _environment(client_environment(arm, sim.vm_url(sim.simulator.vm_names[0]))),
    ):
        arm.accept_token = issued_for_arm(sim.simulator.issued)
        for n, event_id in enumerate(ids):
            arm.offer(eg.compute_id("rg-app", "virtualMachineScaleSets", f"set{n}"), event_id)
        store = SqliteStore(Path(tmp) / "fleet.db")
        now = [start]
        consumer = Consumer(store, Sender(), APPROVE, lambda _: None, ConsumerSettings(),
                            now=lambda: now[0])  # fmt: skip
        client = ArmAcknowledge(credential(IdentitySettings(kind="managed")), arm.endpoint)
        armcarrier.install(consumer, client, lambda _: None, lambda: now[0], "bench")
        intake = EventGridIntake(consumer, TRUST)
        to_post, to_return = [], []
        for n, event_id in enumerate(ids):
            now[0] = start + timedelta(seconds=n)
            body = eg.scheduled(event_id, "Scheduled", [f"vm{n}"], now[0], scale_set=f"set{n}")
            before = len(arm.requests)
            began = time.monotonic()
            intake.handle([body])
            returned = time.monotonic()
            posts = arm.requests[before:]
            if len(posts) != 1 or posts[0].status != 200:
                raise AssertionError(f"event {n}: expected one acknowledge, saw {posts}")
            if n:  # the first fetched the token
                to_post.append(posts[0].at - began)
                to_return.append(returned - began)
        store.close()
        client.close()

    def spread(values: list[float]) -> str:
        return f"p50 {ms(percentile(values, 50))}, p99 {ms(percentile(values, 99))}"

    say(f"Event Grid delivery to ARM's acknowledge: {spread(to_post)}; intake done: "
        f"{spread(to_return)}")  # fmt: skip
    first = (f"Event Grid delivery to ARM's acknowledge received, {events} events of VMs "
             "without agents (ARM double, TLS, SQLite state)")  # fmt: skip
    second = "Event Grid delivery to the approval confirmed in the ledger (the intake returns)"
    return Result(
        rows=[
            Row("11a", first, spread(to_post), "", None),
            Row("11b", second, spread(to_return), "", None),
        ],
        notes=[
            "11: one delivery a batch; the double answers at once, so ARM's own round trip "
            "(not measurable here) adds to 11a and 11b in production; a 429 adds its Retry-After."
        ],
    )

"""`se-bridge consume`: the standalone consumer worker.

It reads record batches from Event Hubs (or a local hub directory), runs them through
the consumer core, sends approvals down the per-VM command channels, and writes each
Decision record to a local spool first, from which the configured sinks (Log Analytics
in production) receive them with the agent's own at-least-once delivery.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from bridge import host, telemetry
from bridge import recordtypes as rt
from bridge.config import (
    Config,
    ConfigError,
    given,
    warn_if_secrets_readable,
    warn_of_consumer_settings_under_agent,
)
from bridge.consumer import validation, weekaheadpass, wiring
from bridge.consumer.armcarrier import ArmCarrier
from bridge.consumer.command import CONSUME_FLAGS, LOGGING
from bridge.consumer.guard import Failures, Guard
from bridge.consumer.metrics import ConsumerMetrics, CountingSender
from bridge.consumer.people.server import PageError, PageServer
from bridge.consumer.people.server import build_app as build_page
from bridge.consumer.reading import Position
from bridge.consumer.secondsource import build_reconciler, intake_for
from bridge.consumer.sources.eventhubs import eventgrid_hub, run_eventhubs
from bridge.consumer.sources.hub import run_local
from bridge.consumer.sources.resourcegraph import Reconciler
from bridge.logfile import setup_logging
from bridge.outbox.delivery import Delivery, interruptible_wait
from bridge.outbox.spool import Spool, SpoolError
from bridge.records import RecordView
from bridge.redact import describe
from bridge.retry import Backoff, DeliveryError
from bridge.sinks import Sink, build

log = logging.getLogger(__name__)


class PoisonFile:
    """Messages that are not records (malformed, invalid against the schema, oversized, or
    from another VM), kept whole with the reason in a JSONL file beside the state: the
    consumer's dead-letter store. A sample line:

        {"partition": "3", "offset": "118", "reason": "not valid against record.schema.json:
         RecordType must be one of [...], got 'Evil'", "body": "{...}"}
    """

    def __init__(self, path: Path, on_refused: Callable[[str], None] | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._on_refused = on_refused  # the metrics' count of refusals by reason

    def __call__(self, partition: str, offset: str, body: str, reason: str) -> None:
        if self._on_refused is not None:
            self._on_refused(reason)
        entry = {"partition": partition, "offset": offset, "reason": reason, "body": body}
        with self._lock, self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
        log.warning(
            "set aside the message at offset %s of partition %s in %s: it is not a record (%s)",
            offset,
            partition,
            self.path,
            reason,
        )


class ConsumerService:
    """The worker: decisions spool and delivery, the consumer core, and its re-evaluation timer."""

    def __init__(self, config: Config, *, extra_sinks: Sequence[Sink] = ()) -> None:
        self.config = config
        state_dir = config.consumer_state_dir()
        host.private_directory(state_dir)
        self.sinks = [build(spec, config) for spec in wiring.decision_sinks(config)] + list(
            extra_sinks
        )
        self.spool = Spool(state_dir / "decisions-spool.db", [s.name for s in self.sinks])
        self.delivery = Delivery(self.spool, self.sinks)
        self.metrics = ConsumerMetrics(telemetry.new_registry())
        self.consumer = wiring.build_consumer(config, self._emit, registry=self.metrics.registry)
        self.metrics.watch_budgets(self.consumer.budget_use)
        ledger = self.consumer.ledger
        self.metrics.watch_ledger(lambda: (ledger.reads, ledger.conflicts, ledger.fetched))
        self.metrics.watch_missed(lambda: dict(ledger.missed))
        self.metrics.watch_pending(lambda: self.consumer.pending)
        self.metrics.watch_people(self.consumer.desk.counts)
        carrier = self.consumer.sender
        if isinstance(carrier, ArmCarrier):  # eventgrid.acknowledge
            self.metrics.watch_arm(lambda: dict(carrier.outcomes))
        runs = self.consumer.patch_runs
        if runs is not None:  # patchruns.enabled
            self.metrics.watch_patch_runs(lambda: dict(runs.outcomes))
        counted = CountingSender(self.consumer.sender, self.metrics)
        self.consumer.sender = self.consumer.dispatch.sender = counted
        self.poison = PoisonFile(state_dir / "poison.jsonl", self.metrics.refusal)
        # The periodic passes' failures: each pass is guarded, none ends its thread.
        self.failures = Failures()
        self.metrics.watch_failures(self.failures.counts)
        self._tick_guard = Guard("reevaluate", log, self.failures)
        self._azure_guard = Guard("eventgrid_read", log, self.failures)
        self._azure_backoff = Backoff(initial=1.0, maximum=60.0)  # a failed reader's restarts
        # Azure's own view, beside the agents' (issue 36): off unless eventgrid.enabled.
        self.intake = intake_for(config, self.consumer, self._emit, self.failures)
        if self.intake is not None:
            self.metrics.watch_eventgrid(self.intake.counts)
        self.reconciler: Reconciler | None = None
        if self.intake is not None and config.eventgrid.reconcile_interval:
            self.reconciler = build_reconciler(config, self.intake, self.failures)
        # The week ahead (issue 40): off unless weekahead.enabled.
        self.week_ahead = weekaheadpass.build(config, self.consumer, self._emit, self.failures)
        self._telemetry: telemetry.Endpoint | None = None
        self._page: PageServer | None = None
        self._notifier = telemetry.SystemdNotifier()
        self._last_tick = time.monotonic()
        self._tick_error: str | None = None
        self._read_error: str | None = None

    def serve_telemetry(self) -> None:
        """Listen on consumer.metrics_address, when set (OSError when it cannot)."""
        address = self.config.consumer.metrics_address
        if address:
            self._telemetry = telemetry.Endpoint(
                address, self.metrics.registry, live=self.live, ready=self.ready
            ).start()

    def serve_page(self) -> PageServer | None:
        """The approval page on consumer.people.page_address, when set (PageError when its
        settings cannot work, OSError when it cannot listen)."""
        settings = self.config.people
        if settings.page_address:
            app = build_page(settings, self.consumer.desk, self.config.consumer_state_dir())
            self._page = PageServer(app, settings.page_address).start()
        return self._page

    def live(self) -> tuple[bool, str]:
        """/healthz: the re-evaluation timer turns."""
        idle = time.monotonic() - self._last_tick
        limit = max(60.0, 10 * self.config.consumer.reevaluate_interval)
        if idle > limit:
            return False, f"the re-evaluation timer has not turned for {idle:.0f} s"
        return True, f"the re-evaluation timer turned {idle:.1f} s ago"

    def ready(self) -> tuple[bool, str]:
        """/readyz: batches are handled, the state answers, Decision sinks deliver."""
        if self._read_error is not None:
            return False, f"handling a batch failed: {self._read_error}"
        if self._tick_error is not None:
            return False, f"re-evaluating failed: {self._tick_error}"
        failing = [n for n, s in self.delivery.status().items() if s.get("failing_permanently")]
        if failing:
            return False, f"Decision sink {', '.join(failing)} fails for good: see the log"
        return True, "batches are handled, the state answers and every Decision sink delivers"

    def _emit(self, records: Sequence[RecordView]) -> None:
        self.spool.commit(records)
        self.metrics.decided(records)

    def _process(self, records: list[dict[str, object]], position: Position) -> None:
        """Records valid against the schema go to the consumer; the rest to the dead letters.

        A retried batch sets the same invalid record aside again: a duplicate line in
        poison.jsonl, never a lost one.
        """
        valid: list[rt.Record] = []
        for record in records:
            problem = validation.problem(record)
            if problem is None:
                valid.append(cast(rt.Record, record))  # the schema says it is one
                continue
            reason = f"not valid against record.schema.json: {problem}"
            self.poison("?", f"RecordId {record.get('RecordId')}", json.dumps(record), reason)
        if valid or position.caught_up is not None:
            self._handled(lambda: self.consumer.process(valid, position))

    def _handled(self, handle: Callable[[], None]) -> None:
        """Hand a batch over, keeping /readyz's word on whether the last one failed."""
        try:
            handle()
        except Exception as err:
            self._read_error = describe(err)
            raise
        self._read_error = None

    def run(self, stop: threading.Event) -> int:
        self.delivery.start()
        self._notifier.ready()
        timer = threading.Thread(target=self._ticks, args=(stop,), name="se-bridge reevaluate")
        timer.start()
        log.info(
            "%sconsuming from %s; policy: %s; decisions to %s",
            self._mode(),
            self._source(),
            self.consumer.policy.source,
            ", ".join(s.name for s in self.sinks),
        )
        try:
            self._read(stop)
        finally:
            self._notifier.stopping()
            stop.set()
            timer.join()
            self.close()
        return 0

    def _read(self, stop: threading.Event) -> None:
        azure: list[threading.Thread] = []
        if self.intake is not None:
            azure.append(
                threading.Thread(target=self._read_azure, args=(stop,), name="se-bridge eventgrid")
            )
        # Resource Graph's periodic passes, each guarded: one that fails ends no thread.
        periodic: list[tuple[Callable[[threading.Event, float], None], float, str]] = []
        if self.reconciler is not None:
            every = self.config.eventgrid.reconcile_interval
            periodic.append((self.reconciler.run, every, "se-bridge resource graph"))
        if self.week_ahead is not None:
            every = self.config.weekahead.interval
            periodic.append((self.week_ahead.run, every, "se-bridge week ahead"))
        azure += [
            threading.Thread(target=run, args=(stop, every), name=name)
            for run, every, name in periodic
        ]
        for thread in azure:
            thread.start()
        try:
            self._read_records(stop)
        finally:
            stop.set()
            for thread in azure:
                thread.join()

    def _read_azure(self, stop: threading.Event) -> None:
        """Event Grid's hub, until `stop`. A reader that fails is started again after a
        backoff, from its checkpoints: the consumer goes on meanwhile with the agents' records
        and what it holds of Azure's view (it stopped here once, exiting 0, which systemd's
        Restart=on-failure does not restart)."""
        backoff = self._azure_backoff
        hub = self.config.eventgrid.hub
        while not stop.is_set():
            try:
                self._read_azure_hub(stop)
            except Exception as err:  # after start-up the consumer keeps running
                delay = backoff.delay_for(err)
                self._azure_guard.failed(
                    err,
                    f"reading Event Grid's hub {hub}",
                    "its deliveries wait in the hub and are read from the last checkpoint "
                    f"when the reader starts again, in {delay:.0f} s; the agents' records go "
                    "on meanwhile; check eventgrid.hub and eventgrid.connection_string (or "
                    "the identity's Event Hubs Data Receiver role), and report this line "
                    "with its traceback if they are right",
                )
            else:
                delay = backoff.next_delay()  # returned before `stop`: not a tight loop
            interruptible_wait(stop, delay)

    def _read_azure_hub(self, stop: threading.Event) -> None:
        settings = self.config.consumer
        if settings.hub is not None:  # the local hub: Event Grid's is a directory too
            run_local(
                self.config.eventgrid.hub,
                self._process,
                stop,
                bodies=self._azure,
                group=settings.consumer_group,
            )
            return
        run_eventhubs(
            eventgrid_hub(self.config),
            self._process,
            stop,
            load_balancing_interval=settings.load_balancing_interval,
            checkpoint_interval=settings.checkpoint_interval,
            bodies=self._azure,
        )

    def _azure(self, bodies: list[str], position: Position) -> None:
        intake = self.intake
        assert intake is not None
        self._handled(lambda: intake.handle(bodies, position))
        self._azure_guard.succeeded(f"reading Event Grid's hub {self.config.eventgrid.hub}")
        self._azure_backoff.reset()

    def _read_records(self, stop: threading.Event) -> None:
        if self.config.consumer.hub is not None:
            run_local(
                self.config.consumer.hub,
                self._process,
                stop,
                poison=self.poison,
                group=self.config.consumer.consumer_group,
                on_done=self.metrics.batch,
            )
            return
        settings = self.config.consumer
        run_eventhubs(
            self.config,
            self._process,
            stop,
            poison=self.poison,
            load_balancing_interval=settings.load_balancing_interval,
            checkpoint_interval=settings.checkpoint_interval,
            on_done=self.metrics.batch,
        )

    def _ticks(self, stop: threading.Event) -> None:
        while not stop.is_set():
            interruptible_wait(stop, self.config.consumer.reevaluate_interval)
            self._last_tick = time.monotonic()
            self._notifier.watchdog()
            try:
                self.consumer.tick()
            except Exception as err:  # the timer never stops: the next pass runs on schedule
                self._tick_error = describe(err)
                self._tick_guard.failed(
                    err,
                    "re-evaluating the open events",
                    "deferred events are not approved, unsent commands not sent and slots "
                    "not released until a pass goes through; the next is in "
                    f"{self.config.consumer.reevaluate_interval:g} s (check that the fleet "
                    "state, consumer.state, answers; if it does, report this line with its "
                    "traceback)",
                )
                continue
            self._tick_error = None
            self._tick_guard.succeeded("re-evaluating the open events")

    def _mode(self) -> str:
        if self.config.consumer.mode != "shadow":
            return ""
        return "shadow mode, sending no command: "

    def _source(self) -> str:
        if self.config.consumer.hub is not None:
            return f"the local hub {self.config.consumer.hub}"
        return f"event hub {self.config.eventhubs.name or '(from the connection string)'}"

    def close(self) -> None:
        if self._page is not None:
            self._page.close()
        if self._telemetry is not None:
            self._telemetry.close()
        if not self.delivery.flush(timeout=10.0):
            log.warning(
                "%d Decision records not yet delivered stay in the spool %s",
                self.spool.depth(),
                self.spool.path,
            )
        self.delivery.stop(timeout=5.0)
        self.spool.close()
        self.consumer.close()


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    host.install_stop_handler(stop.set)
    host.restrict_new_files()
    flags = given(args, *CONSUME_FLAGS, *LOGGING)
    try:
        config = wiring.load_config(args.config, flags=flags)
        wiring.check_shadow(config.consumer)
        setup_logging(
            config.consumer_log_level(), fmt=config.consumer_log_format(), program="consumer"
        )
        if config.consumer.mode == "shadow":
            log.info(
                "shadow mode (consumer.mode = shadow): deciding and writing Decision "
                "records in consumer group %s, sending no command",
                config.consumer.consumer_group,
            )
        warn_of_consumer_settings_under_agent(config)
        warn_if_secrets_readable(args.config)
        service = ConsumerService(config)
    except ConfigError as err:
        print(f"se-bridge: configuration error: {err}", file=sys.stderr)
        return 2
    except (SpoolError, DeliveryError, OSError) as err:
        print(f"se-bridge: cannot start the consumer: {describe(err)}", file=sys.stderr)
        return 1
    try:
        service.serve_telemetry()
    except OSError as err:
        service.close()
        address = config.consumer.metrics_address
        print(
            f"se-bridge: cannot listen on consumer.metrics_address {address}: "
            f"{err.strerror or err}",
            file=sys.stderr,
        )
        return 1
    try:
        service.serve_page()
    except PageError as err:
        service.close()
        print(f"se-bridge: configuration error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        service.close()
        print(
            f"se-bridge: cannot serve the approval page on consumer.people.page_address "
            f"{config.people.page_address}: {err.strerror or err}",
            file=sys.stderr,
        )
        return 1
    return service.run(stop)

"""The Azure Functions app (Python v2 programming model): a thin wrapper over the consumer core.

`functions/function_app.py`, the file the Functions host loads, is one line over this module,
so the logic is type-checked and tested with the package. Its functions:

- `records`: an Event Hubs trigger taking batches (cardinality many) of the records the agents
  send. Every body is checked with `bridge.consumer.sources.batches.check_record` (size,
  JSON, the record schema, VmId against the event's partition key); one that fails is logged
  whole at ERROR with the reason (`log_poison`), which makes the log (Application Insights)
  its only copy, and the rest of the batch goes on to `Consumer.process`, with its partition
  (from the trigger's PartitionContext) read up to the newest enqueued time of the batch
  (bridge/consumer/reading.py: the trigger says nothing of a partition without events, so a
  partition whose VMs all fell silent releases nothing by silence until it carries a record
  again). Any exception fails the
  invocation. The Event Hubs trigger checkpoints a batch after the invocation ends, even a
  failed one, so the retry policy on the function is what keeps a failed batch: the host runs
  it again with exponential backoff, indefinitely, and the partition waits behind it, as the
  standalone consumer's partition does. Only a host restart during the retries hands the batch
  over afresh, from the last checkpoint. Processing is idempotent, so a re-run is harmless.
- `eventgrid`, only with eventgrid.enabled (SE_BRIDGE_EVENTGRID_ENABLED, read when the app is
  indexed): an Event Hubs trigger like `records` (the same connection, consumer group and
  retry policy) on eventgrid.hub, the hub the scheduled-events and resource-health system
  topics deliver to (infra/modules/eventgrid.bicep puts it in the records' namespace). Each
  batch's bodies go to the EventGridIntake `se-bridge consume` builds
  (bridge.consumer.secondsource.intake_for): a refused delivery is counted, logged at WARNING
  with what to check, and changes nothing, so it never frees a slot.
- `page`: an HTTP trigger (every path, GET and POST, anonymous to the host: App Service
  Authentication with Entra ID stands in front of it) serving the approval page and its API
  (bridge/consumer/people/app.py, the WSGI app the standalone consumer serves too, mounted by
  `mount`). host.json's empty `routePrefix` puts the page at `/` and the
  API at `/api/v1/...`. It validates the person's Entra ID token itself: the
  `Authorization: Bearer` token of an API call (the CLI's), or, for the page, the ID token App
  Service Authentication adds as `X-MS-TOKEN-AAD-ID-TOKEN` (its token store must be on). Without
  `SE_BRIDGE_CONSUMER_PEOPLE_TENANT_ID` and `..._AUDIENCE` it answers 503.
- `reevaluate`: a timer calling `Consumer.tick` (deferrals, fallbacks, unsent commands).
  Its schedule is SE_BRIDGE_FUNCTIONS_TIMER, read when the app is indexed, or every 10 s.
  A failed tick is not retried: the next one does the same work.
- `reconcile`, only with eventgrid.enabled and eventgrid.reconcile_interval (read when the app
  is indexed): a timer making one pass of the Resource Graph reconciler
  (bridge.consumer.sources.resourcegraph.Reconciler.once, as `se-bridge consume`'s thread
  does), on the NCRONTAB schedule of that interval (`reconcile_schedule`; an interval no
  schedule keeps evenly is refused). Its rows go through the eventgrid function's intake, so
  they are refused, counted and logged alike; a failed pass is logged (once for a run of
  them), not raised, and the next tick tries again.
- `weekahead`, only with weekahead.enabled (read when the app is indexed): a timer making one
  pass of the week ahead (bridge.consumer.weekaheadpass.WeekAheadPass.once, as `se-bridge
  consume`'s thread does) on the NCRONTAB schedule of weekahead.interval; its Upcoming records
  go where the Decision records go, and a failed pass is logged and counted, not raised.

Decision records go straight to Log Analytics when loganalytics.endpoint/rule_id are set, else
to the log as JSON at INFO. There is no local spool: a Function instance's disk is not durable.
A failed upload fails the invocation, and the retry policy runs the batch again.

The consumer is built at the first invocation in each worker process and kept; the settings
are the usual SE_BRIDGE_<SECTION>_<KEY> environment variables (app settings).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# typing.List, not list[...]: the Python worker checks the trigger parameter's annotation
# with azure.functions' converters, which refuse the builtin generic (the function would
# fail to load). The names stay at module level: the worker resolves these string
# annotations (PEP 563) with typing.get_type_hints against this module's globals.
from typing import TYPE_CHECKING, Any, List  # noqa: UP035
from urllib.parse import urlsplit

import azure.functions as func

from bridge import recordtypes as rt
from bridge.commands.signing import Signer
from bridge.config import (
    Config,
    ConfigError,
    EventGridSettings,
    WeekAheadSettings,
    load,
    warn_of_consumer_settings_under_agent,
)
from bridge.consumer import weekaheadpass, wiring
from bridge.consumer.core import Consumer
from bridge.consumer.people.app import Csrf, EntraSignIn, PeopleApp
from bridge.consumer.people.auth import verifier_for
from bridge.consumer.reading import Position, eventhubs_partition
from bridge.consumer.secondsource import EventGridIntake, build_reconciler, intake_for
from bridge.consumer.sources import resourcegraph
from bridge.consumer.sources.batches import NotARecord, check_record, log_poison
from bridge.consumer.sources.resourcegraph import Reconciler
from bridge.consumer.state.kinds import KINDS as STORES
from bridge.consumer.wiring import build_consumer, state_spec
from bridge.httpfront import call, environ
from bridge.records import RecordView
from bridge.redact import describe
from bridge.retry import PoisonRecords
from bridge.sinks import Sink, SpooledRecord, loganalytics

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

log = logging.getLogger(__name__)

# The app setting (or, with an identity, the prefix of the settings) of the Event Hubs
# connection: SE_BRIDGE_EVENTHUBS holds a connection string; identity-based connections use
# SE_BRIDGE_EVENTHUBS__fullyQualifiedNamespace (and __credential / __clientId for a
# user-assigned identity). Not an SE_BRIDGE_<SECTION>_<KEY> setting: config ignores it.
CONNECTION = "SE_BRIDGE_EVENTHUBS"
EVENT_HUB_NAME = "%SE_BRIDGE_EVENTHUBS_NAME%"
CONSUMER_GROUP = "%SE_BRIDGE_CONSUMER_CONSUMER_GROUP%"
# eventgrid.hub: the second source's hub, read through the same connection (infra/ puts it in
# the records' namespace and lets the app's identity read it).
EVENTGRID_HUB_NAME = "%SE_BRIDGE_EVENTGRID_HUB%"
EVENTGRID_PREFIX = "SE_BRIDGE_EVENTGRID_"
TIMER_SETTING = "SE_BRIDGE_FUNCTIONS_TIMER"
DEFAULT_TIMER = "*/10 * * * * *"  # NCRONTAB with seconds: every 10 s
RECONCILE_SETTING = "SE_BRIDGE_EVENTGRID_RECONCILE_INTERVAL"
WEEKAHEAD_SETTING = "SE_BRIDGE_WEEKAHEAD_INTERVAL"
WEEKAHEAD_PREFIXES = ("SE_BRIDGE_WEEKAHEAD_", EVENTGRID_PREFIX)
# The reconciler's intervals an NCRONTAB step keeps evenly: minutes that divide an hour, hours
# that divide a day (*/7 minutes runs at :56 and again at :00, 4 minutes on).
_STEP_MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)
_STEP_HOURS = (1, 2, 3, 4, 6, 8, 12, 24)
RECONCILE_INTERVALS = tuple(60 * m for m in _STEP_MINUTES) + tuple(3600 * h for h in _STEP_HOURS)
# Retried without end: a batch is never skipped, like the standalone consumer's. The worker
# reads the intervals with strptime("%H:%M:%S"), so they must stay under a day.
RETRY_STRATEGY = "exponential_backoff"
RETRY_FOREVER = "-1"
RETRY_MIN = "00:00:01"
RETRY_MAX = "00:01:00"
# Set on every App Service / Functions instance in Azure, absent under Core Tools and tests.
IN_AZURE = "WEBSITE_INSTANCE_ID"


class DecisionOutlet:
    """Where the consumer's Decision records go: Log Analytics, or the log as JSON.

    A failure raises, failing the batch. The consumer emits a Hold or Defer before it records
    the decision in the fleet state, so the retried batch emits it again. An approval's ledger
    entry is written first, so its retry only resends the command, and the Decision record is
    lost (bridge.consumer.dispatch.Dispatch.apply; an xfail test in
    tests/component/consumer/test_functionapp.py).
    """

    def __init__(self, sink: Sink | None) -> None:
        self.sink = sink

    @classmethod
    def from_config(cls, config: Config) -> DecisionOutlet:
        settings = config.loganalytics
        if not (settings.endpoint or settings.rule_id):
            return cls(None)
        try:
            loganalytics.check_settings(settings, "sending Decision records to Log Analytics")
        except ValueError as err:
            raise ConfigError(str(err)) from err
        return cls(loganalytics.LogAnalyticsSink(settings, config.identity))

    def __call__(self, records: Sequence[RecordView]) -> None:
        if self.sink is None:
            for record in records:
                # Event Grid's Event records come here too (the second source).
                kind = record.get(rt.RECORD_TYPE) or "Decision"
                log.info("%s record: %s", kind, json.dumps(record, ensure_ascii=False))
            return
        batch = [
            SpooledRecord(seq, str(r.get("RecordId")), str(r.get(rt.RECORD_TYPE)), json.dumps(r))
            for seq, r in enumerate(records)
        ]
        while batch:
            try:
                self.sink.send(batch)
            except PoisonRecords as err:
                # Refused for good (they do not fit the DCR): the log keeps them, as the
                # standalone consumer's dead-letter table would. Anything else raises on.
                if not err.seqs:
                    raise
                for refused in (r for r in batch if r.seq in err.seqs):
                    log.error(
                        "the Logs Ingestion API refused a Decision record (%s); it is "
                        "kept only in this log line: %s",
                        err,
                        refused.body,
                    )
                batch = [r for r in batch if r.seq not in err.seqs]
            else:
                return

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


def load_config(environ: Mapping[str, str], app_dir: Path | None = None) -> Config:
    """The consumer's settings from app settings; ConfigError names a bad or missing one."""
    # Names with "__" are the Functions host's (identity-based connections such as
    # SE_BRIDGE_EVENTHUBS__fullyQualifiedNamespace); config would warn about them as unknown.
    config = wiring.load_config(environ={k: v for k, v in environ.items() if "__" not in k})
    wiring.check_shadow(config.consumer)
    policy = config.consumer.policy
    if policy is not None and not policy.is_absolute() and app_dir is not None:
        # A policy file deployed with the app: relative to the app, not the worker's cwd.
        consumer = dataclasses.replace(config.consumer, policy=app_dir / policy)
        config = dataclasses.replace(config, consumer=consumer)
    if environ.get(IN_AZURE):
        _check_durable(config)
    return config


def _check_durable(config: Config) -> None:
    """In Azure, state and commands must live outside the instance, whose disk is not durable
    and which scale-out multiplies (each instance with its own SQLite would keep its own
    budgets)."""
    try:
        kind = STORES.parse(state_spec(config))[0].name
    except ValueError as err:
        raise ConfigError(f"consumer.state: {err}") from err
    if kind != "tables":
        raise ConfigError(
            "a consumer in Azure Functions keeps the fleet state in Table Storage: set "
            "SE_BRIDGE_CONSUMER_STATE=tables and SE_BRIDGE_STORAGE_ACCOUNT"
        )
    if not config.commands.channel.strip().lower().startswith("storagequeue"):
        raise ConfigError(
            "a consumer in Azure Functions sends approvals through Storage Queues: set "
            "SE_BRIDGE_COMMANDS_CHANNEL=storagequeue"
        )


class ConsumerApp:
    """The consumer behind the functions, built at the first invocation of this worker process.

    The worker may run invocations on several threads at once; building is guarded, and the
    consumer serialises its own work. A failed build is not kept: the next invocation tries
    again (changing an app setting restarts the app anyway).
    """

    def __init__(
        self, environ: Mapping[str, str] | None = None, app_dir: Path | None = None
    ) -> None:
        self._environ = environ
        self._app_dir = app_dir
        self._lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._outlet: DecisionOutlet | None = None
        self._people: PeopleApp | None = None
        self._intake: EventGridIntake | None = None
        self._reconciler: Reconciler | None = None
        self._interval = 0.0
        self._week_ahead: weekaheadpass.WeekAheadPass | None = None
        self._week_interval = 0.0

    def consumer(self) -> Consumer:
        with self._lock:
            if self._consumer is None:
                self._consumer = self._build()
            return self._consumer

    def _build(self) -> Consumer:
        environ = os.environ if self._environ is None else self._environ
        try:
            config = load_config(environ, self._app_dir)
            _log_levels(config)
            warn_of_consumer_settings_under_agent(config)
            outlet = DecisionOutlet.from_config(config)
            try:
                consumer = build_consumer(config, outlet)
            except BaseException:
                outlet.close()
                raise
        except ConfigError as err:
            log.error("se-bridge: configuration error: %s", err)
            raise
        if config.consumer.sinks:
            log.warning(
                "consumer.sinks is ignored in Azure Functions: Decision records go to "
                "Log Analytics (loganalytics.*) or the log"
            )
        if config.eventgrid.connection_string:
            log.warning(
                "eventgrid.connection_string is ignored in Azure Functions: the eventgrid "
                "function reads eventgrid.hub through the SE_BRIDGE_EVENTHUBS connection"
            )
        self._outlet = outlet
        # Event records made of deliveries go where the decisions go, as the standalone
        # consumer ships them to its sinks: one table holds both sources' records.
        self._intake = intake_for(config, consumer, outlet)
        if self._intake is not None and config.eventgrid.reconcile_interval:
            self._reconciler = build_reconciler(config, self._intake)
            self._interval = config.eventgrid.reconcile_interval
        # Upcoming records go where the decisions go, as the standalone consumer's do.
        self._week_ahead = weekaheadpass.build(config, consumer, outlet)
        self._week_interval = config.weekahead.interval
        log.info(
            "se-bridge consumer ready; policy: %s; decisions to %s",
            consumer.policy.source,
            "Log Analytics" if outlet.sink else "the log",
        )
        return consumer

    def handle_events(self, events: Sequence[func.EventHubEvent]) -> None:
        """Parse a batch, log what is not a record, and hand the records to the consumer."""
        records: list[rt.Record] = []
        for event in events:
            body = event.get_body()
            try:
                records.append(check_record(body.decode("utf-8"), event.partition_key))
            except (UnicodeDecodeError, NotARecord) as err:
                # Logged again if the batch is retried: a duplicate line, never a lost body.
                text = body.decode("utf-8", errors="backslashreplace")
                log_poison(_partition(event), _offset(event), text, str(err))
        position = _position(events)
        if not records and position.caught_up is None:
            return
        where = f"{len(records)} records from partition {_partition(events[0])}"
        _retried(where, lambda: self.consumer().process(records, position))

    def intake(self) -> EventGridIntake | None:
        """The second source's intake (its counts), None with eventgrid.enabled off."""
        self.consumer()
        return self._intake

    def handle_eventgrid(self, events: Sequence[func.EventHubEvent]) -> None:
        """Fold a batch of Event Grid deliveries in; the intake refuses what it does not trust."""
        intake = self.intake()
        if intake is None:
            # Indexed with eventgrid.enabled, built without it: app settings changed under
            # a running worker. Failing keeps the batch for the restart that follows.
            raise ConfigError("the eventgrid function runs, but eventgrid.enabled is off")
        # A body that is not UTF-8 is no delivery: decoded with replacement, the intake
        # refuses it (and counts it) as it refuses any other body that is not one.
        bodies = [e.get_body().decode("utf-8", errors="replace") for e in events]
        where = f"{len(bodies)} Event Grid deliveries from partition {_partition(events[0])}"
        _retried(where, lambda: intake.handle(bodies, _position(events)))

    def page(self, request: func.HttpRequest) -> func.HttpResponse:
        """The approval page or its API (bridge/consumer/people/app.py) for one request."""
        people = self._people_app()
        if people is None:
            return func.HttpResponse(
                "the approval page needs Entra ID sign-in: set SE_BRIDGE_CONSUMER_PEOPLE_TENANT_ID "
                "and SE_BRIDGE_CONSUMER_PEOPLE_AUDIENCE\n",
                status_code=503,
            )
        return mount(people, request)

    def _people_app(self) -> PeopleApp | None:
        consumer = self.consumer()
        with self._lock:
            if self._people is None:
                environ = os.environ if self._environ is None else self._environ
                verifier = verifier_for(load_config(environ, self._app_dir).people)
                if verifier is None:
                    return None
                csrf = Csrf(csrf_secret(consumer.operators.signer))
                self._people = PeopleApp(consumer.desk, EntraSignIn(verifier), csrf=csrf)
            return self._people

    def reevaluate(self, timer: func.TimerRequest) -> None:
        if timer.past_due:
            log.info("re-evaluation timer is past due; running it now")
        self.consumer().tick()

    def reconcile(self, timer: func.TimerRequest) -> None:
        """One pass of the Resource Graph reconciler; a failed one is logged, not raised."""
        self.consumer()
        reconciler = self._reconciler
        if reconciler is None:
            # Indexed with the interval, built without it: app settings changed under a
            # running worker, which the host restarts.
            raise ConfigError(
                "the reconcile function runs, but eventgrid.reconcile_interval is 0 "
                "or eventgrid.enabled is off"
            )
        if timer.past_due:
            log.info("the Resource Graph reconciler's timer is past due; passing now")
        reconciler.once(self._interval)

    def week_ahead(self, timer: func.TimerRequest) -> None:
        """One pass of the week ahead; a failed one is logged and counted, not raised."""
        self.consumer()
        week = self._week_ahead
        if week is None:
            # Indexed with the week ahead on, built with it off: app settings changed under a
            # running worker, which the host restarts.
            raise ConfigError("the weekahead function runs, but weekahead.enabled is off")
        if timer.past_due:
            log.info("the week ahead's timer is past due; passing now")
        week.once(self._week_interval)

    def close(self) -> None:
        """For tests and orderly shutdown; the host normally just ends the process."""
        with self._lock:
            self._intake = None
            if self._week_ahead is not None:
                self._week_ahead.graph.stop.set()  # a pass waiting out a quota ends
                self._week_ahead = None
            if self._reconciler is not None:
                self._reconciler.graph.stop.set()  # a pass waiting out a quota ends
                self._reconciler = None
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            if self._outlet is not None:
                self._outlet.close()
                self._outlet = None


def _retried(where: str, work: Callable[[], None]) -> None:
    """`work`, a batch's handling; a failure is said and raised, failing the invocation."""
    try:
        work()
    except Exception as err:
        log.warning(
            "handling %s failed: %s; the retry policy runs the batch again, nothing "
            "is checkpointed before it succeeds",
            where,
            describe(err, with_type=True),
        )
        raise


def mount(app: WSGIApplication, request: func.HttpRequest) -> func.HttpResponse:
    """`app`'s answer to an HTTP trigger's request, through the WSGI bridge the standalone
    page's server uses (bridge.httpfront). Not azure.functions.WsgiMiddleware: as of
    azure-functions 1.26 it raises instead of answering whenever the app answers 5xx, so a
    person would get the host's blank 500 in place of the page that says why, and the CLI
    no JSON to read."""
    url = urlsplit(request.url)
    target = f"{url.path or '/'}?{url.query}" if url.query else url.path or "/"
    port = url.port or (443 if url.scheme == "https" else 80)
    server, scheme = (url.hostname or "", port), url.scheme or "https"
    headers, body = request.headers.items(), request.get_body()
    answer = call(app, environ(request.method, target, headers, body, server=server, scheme=scheme))
    kind = next((v for k, v in answer.headers if k.lower() == "content-type"), "text/plain")
    return func.HttpResponse(
        answer.body,
        status_code=int(answer.status.split(" ", 1)[0]),
        headers={k: v for k, v in answer.headers if k.lower() != "content-type"},
        mimetype=kind.split(";")[0],
    )


def csrf_secret(signer: Signer | None) -> bytes | None:
    """The page's CSRF key, the same on every instance of the app: derived from the consumer's
    signing key, which each instance loads (from Key Vault) anyway. Not App Service
    Authentication's WEBSITE_AUTH_ENCRYPTION_KEY: App Service documents it as a key you may set
    to override the generated one (learn.microsoft.com/azure/app-service/reference-app-settings),
    not as one it puts in a Python worker's environment, least of all on Flex Consumption's
    Linux instances. None without a key (nobody can decide then: operate refuses): each process
    makes its own."""
    return None if signer is None else signer.derived_secret("approval page CSRF")


def _log_levels(config: Config) -> None:
    # The worker forwards Python logging to the host at the root logger's level; these
    # narrow what se-bridge and the Azure SDKs (which narrate every request at INFO) send.
    level = logging.getLevelName(config.consumer_log_level())
    logging.getLogger("bridge").setLevel(level)
    logging.getLogger("azure").setLevel(max(logging.WARNING, level))


def _position(events: Sequence[func.EventHubEvent]) -> Position:
    """Where the batch was read: its partition, read up to its newest event's enqueued time;
    read to no known point when the metadata does not name the partition."""
    context = _context(events[0]) if events else {}
    if context.get("PartitionId") is None:
        return Position(eventhubs_partition("", "", "?"))
    where = eventhubs_partition(
        str(context.get("FullyQualifiedNamespace") or ""),
        str(context.get("EventHubName") or ""),
        str(context["PartitionId"]),
    )
    enqueued = [e.enqueued_time for e in events if e.enqueued_time is not None]
    return Position(where, max(enqueued, default=None))


def _partition(event: func.EventHubEvent) -> str:
    """The partition id from the trigger metadata, "?" when there is none (as in tests)."""
    found = _context(event).get("PartitionId")
    return "?" if found is None else str(found)


def _context(event: func.EventHubEvent) -> dict[str, Any]:
    """The trigger metadata's PartitionContext; empty when there is none."""
    try:
        context = (event.metadata or {}).get("PartitionContext")
    except Exception:  # metadata conversion is the worker's; a quirk must not fail the batch
        return {}
    if isinstance(context, str):
        try:
            context = json.loads(context)
        except ValueError:
            return {}
    return context if isinstance(context, dict) else {}


def _offset(event: func.EventHubEvent) -> str:
    if event.offset is not None:
        return str(event.offset)
    if event.sequence_number is not None:
        return f"sequence number {event.sequence_number}"
    return "?"


def timer_schedule(environ: Mapping[str, str]) -> str:
    """SE_BRIDGE_FUNCTIONS_TIMER or every 10 s; ConfigError when it is not six NCRONTAB fields."""
    schedule = environ.get(TIMER_SETTING, "").strip() or DEFAULT_TIMER
    if len(schedule.split()) != 6:
        raise ConfigError(
            f"{TIMER_SETTING} must be an NCRONTAB expression with six fields (seconds first), "
            f"such as {DEFAULT_TIMER!r}; got {schedule!r}"
        )
    return schedule


def _eventgrid_settings(environ: Mapping[str, str]) -> EventGridSettings:
    """[eventgrid] as config reads it from the app settings; ConfigError when they cannot work."""
    settings = {k: v for k, v in environ.items() if k.startswith(EVENTGRID_PREFIX)}
    return load(environ=settings).eventgrid


def eventgrid_enabled(environ: Mapping[str, str]) -> bool:
    """eventgrid.enabled as config reads it from the [eventgrid] app settings; ConfigError
    when they cannot work."""
    return _eventgrid_settings(environ).enabled


def reconcile_schedule(interval: float, setting: str = RECONCILE_SETTING) -> str:
    """The NCRONTAB schedule (seconds first) of a pass every `interval` seconds; ConfigError
    naming `setting` when no schedule keeps that pace evenly (RECONCILE_INTERVALS are the
    ones that do)."""
    if interval in RECONCILE_INTERVALS:
        seconds = int(interval)
        if seconds < 3600:
            return f"0 */{seconds // 60} * * * *"
        return "0 0 0 * * *" if seconds == 86400 else f"0 0 */{seconds // 3600} * * *"
    below = max((i for i in RECONCILE_INTERVALS if i < interval), default=RECONCILE_INTERVALS[0])
    above = min((i for i in RECONCILE_INTERVALS if i > interval), default=RECONCILE_INTERVALS[-1])
    raise ConfigError(
        f"{setting} {interval:g}: the Functions app passes on an NCRONTAB schedule, "
        "which keeps an even pace only every 1, 2, 3, 4, 5, 6, 10, 12, 15, 20 or 30 minutes or "
        f"every 1, 2, 3, 4, 6, 8, 12 or 24 hours; set {below} or {above} (seconds)"
    )


def reconcile_timer(environ: Mapping[str, str]) -> str | None:
    """The reconcile function's schedule from eventgrid.reconcile_interval, None when there is
    no reconciler (the interval 0, or eventgrid off); ConfigError, as `se-bridge consume`
    refuses them, when the settings cannot work."""
    settings = _eventgrid_settings(environ)
    try:
        resourcegraph.check_settings(settings)
    except ConfigError as err:
        raise ConfigError(f"{RECONCILE_SETTING}: {err}") from err
    if not (settings.enabled and settings.reconcile_interval):
        return None
    return reconcile_schedule(settings.reconcile_interval)


def week_ahead_timer(environ: Mapping[str, str]) -> str | None:
    """The weekahead function's schedule from weekahead.interval, None with the week ahead
    off; ConfigError, as `se-bridge consume` refuses them, when the settings cannot work."""
    settings = {k: v for k, v in environ.items() if k.startswith(WEEKAHEAD_PREFIXES)}
    config = load(environ=settings)
    week: WeekAheadSettings = config.weekahead
    try:
        weekaheadpass.check_settings(week, config.eventgrid)
    except ConfigError as err:
        raise ConfigError(f"{WEEKAHEAD_SETTING}: {err}") from err
    if not week.enabled:
        return None
    return reconcile_schedule(week.interval, WEEKAHEAD_SETTING)


def build_app(
    backend: ConsumerApp | None = None, environ: Mapping[str, str] | None = None
) -> func.FunctionApp:
    """The FunctionApp whose functions hand their work to `backend`."""
    backend = backend or ConsumerApp()
    environ = os.environ if environ is None else environ
    schedule = timer_schedule(environ)
    reconciling = reconcile_timer(environ)
    weekly = week_ahead_timer(environ)
    app = func.FunctionApp()

    def batches(name: str, hub: str) -> Callable[[Any], Any]:
        """A function of batches of the hub `hub`, retried without end."""
        retry = app.retry(
            strategy=RETRY_STRATEGY,
            max_retry_count=RETRY_FOREVER,
            minimum_interval=RETRY_MIN,
            maximum_interval=RETRY_MAX,
        )
        trigger = app.event_hub_message_trigger(
            arg_name="events",
            connection=CONNECTION,
            event_hub_name=hub,
            consumer_group=CONSUMER_GROUP,
            cardinality=func.Cardinality.MANY,
            # The bodies as they were sent (bytes, decoded here as UTF-8). Without a data
            # type a batch may arrive as JSON, whose bodies azure.functions re-serialises.
            data_type=func.DataType.BINARY,
        )
        return lambda user: app.function_name(name)(retry(trigger(user)))

    @batches("records", EVENT_HUB_NAME)
    def records(events: List[func.EventHubEvent]) -> None:  # noqa: UP006 - see the import
        backend.handle_events(events)

    if eventgrid_enabled(environ):

        @batches("eventgrid", EVENTGRID_HUB_NAME)
        def eventgrid(events: List[func.EventHubEvent]) -> None:  # noqa: UP006
            backend.handle_eventgrid(events)

    @app.function_name("page")
    @app.route(
        route="{*path}",
        methods=[func.HttpMethod.GET, func.HttpMethod.POST],
        auth_level=func.AuthLevel.ANONYMOUS,
    )
    def page(req: func.HttpRequest) -> func.HttpResponse:
        return backend.page(req)

    @app.function_name("reevaluate")
    # use_monitor keeps schedule state in storage so that a missed run is made up: pointless
    # for a re-evaluation every few seconds. Its default is on for schedules of a minute or
    # more, which SE_BRIDGE_FUNCTIONS_TIMER may give.
    @app.timer_trigger(arg_name="timer", schedule=schedule, use_monitor=False)
    def reevaluate(timer: func.TimerRequest) -> None:
        backend.reevaluate(timer)

    if reconciling is not None:

        @app.function_name("reconcile")
        # use_monitor: the host keeps the schedule's last run in its storage, so a pass missed
        # while the app was down (a deployment, scale to zero) runs when it is back, not a whole
        # interval later; a few storage transactions an interval of minutes or more.
        @app.timer_trigger(arg_name="timer", schedule=reconciling, use_monitor=True)
        def reconcile(timer: func.TimerRequest) -> None:
            backend.reconcile(timer)

    if weekly is not None:

        @app.function_name("weekahead")
        # use_monitor: a pass missed while the app was down runs when it is back.
        @app.timer_trigger(arg_name="timer", schedule=weekly, use_monitor=True)
        def weekahead(timer: func.TimerRequest) -> None:
            backend.week_ahead(timer)

    return app

"""Azure Resource Graph as the second source's reconciler (issue 36, item 4): a periodic query
of the scheduled events and the VMs' health Azure holds, which catches what a lost Event Grid
delivery missed. Event Grid delivers at least once only in the happy case; a delivery that is
dropped (a dead-lettered subscription, an hour of hub outage past its retention) would leave an
agent-less VM's event counted by nothing, or a VM held down after Azure said it was back.

The system topics are Azure Resource Notifications: the rows they announce are the rows of
Resource Graph's tables of the same names, so a row is read as the `resourceInfo` of a
delivery and goes through the very same parser, refusals and fold (bridge.consumer.sources.
eventgrid, bridge.consumer.secondsource). What Microsoft documents:

- Scheduled events: table `maintenanceresources`, type `microsoft.maintenance/scheduledevents`
  (the `resourceInfo.type` of the MaintenanceResources topic; learn.microsoft.com/azure/
  virtual-machines/linux/scheduled-events-event-grid, "Event Grid and Resource Graph").
- Health: table `healthresources`, type `microsoft.resourcehealth/availabilitystatuses`, the
  VM's id in `properties.targetResourceId` and its state in `properties.availabilityState`
  (learn.microsoft.com/azure/virtual-machines/resource-graph-availability and
  learn.microsoft.com/azure/service-health/resource-graph-health-samples).
- The API: POST https://management.azure.com/providers/Microsoft.ResourceGraph/resources
  ?api-version=2022-10-01 (the newest GA version; learn.microsoft.com/rest/api/azureresourcegraph/
  resourcegraph/resources/resources), body {"subscriptions", "query", "options": {"$top",
  "$skipToken", "resultFormat": "objectArray"}}, at most 1,000 rows a page, the next page's
  `$skipToken` in the answer.
- Throttling (learn.microsoft.com/azure/governance/resource-graph/concepts/
  guidance-for-throttled-requests): a quota per user, "at most 15 queries within every
  5-second window", said in every answer by `x-ms-user-quota-remaining` and
  `x-ms-user-quota-resets-after` (hh:mm:ss); past it, 429 with Retry-After. This client waits
  out a spent quota before its next page and retries a 429 after Retry-After, through
  bridge.retry's backoff.

An answer, as the REST reference shapes it, with rows of the fields the pages above give (a
scheduled-events page; a row's properties are the IMDS fields of the Event Grid sample in
bridge.consumer.sources.eventgrid; the skip token is opaque):

    {"totalRecords": 2, "count": 1, "resultTruncated": "false",
     "$skipToken": "<opaque, base64>",
     "facets": [],
     "data": [{"id": "/subscriptions/{subscription-id}/resourceGroups/{rg-name}/providers/
                      Microsoft.Compute/virtualMachineScaleSets/{vmss-name}/providers/
                      microsoft.maintenance/scheduledevents/{event-id}",
               "name": "{event-id}", "type": "microsoft.maintenance/scheduledevents",
               "location": "eastus", "subscriptionId": "{subscription-id}",
               "resourceGroup": "{rg-name}",
               "properties": {"EventId": "{event-id}", "EventStatus": "Scheduled",
                 "EventType": "Reboot", "ResourceType": "VirtualMachine",
                 "Resources": ["myvmss_1"], "EventSource": "Platform",
                 "NotBefore": "Mon, 19 Sep 2025 18:29:47 GMT", "DurationInSeconds": -1,
                 "Description": "Virtual machine is going to be restarted as requested by
                                 authorized user.", "ScheduledEventApiVersion": "2020-07-01"}}]}

and a health row (healthresources):

    {"id": "/subscriptions/{subscription-id}/resourceGroups/{rg-name}/providers/
            Microsoft.Compute/virtualMachines/{vm-name}/providers/Microsoft.ResourceHealth/
            availabilityStatuses/current",
     "name": "current", "type": "microsoft.resourcehealth/availabilitystatuses",
     "subscriptionId": "{subscription-id}", "resourceGroup": "{rg-name}",
     "properties": {"targetResourceId": "/subscriptions/{subscription-id}/resourceGroups/
                      {rg-name}/providers/Microsoft.Compute/virtualMachines/{vm-name}",
                    "targetResourceType": "Microsoft.Compute/virtualMachines",
                    "availabilityState": "Unavailable",
                    "occurredTime": "2023-07-24T19:20:37.9245071Z"}}

What a pass feeds (`plan`), so that a row never undoes what Event Grid said since: Resource
Graph lags Event Grid by minutes, so an event's row is dated `LAG` back and folded only when
it tells more than the fleet state holds (no such event; a later status; a Completed or
Canceled of an event still open; other names or another NotBefore at the same status; a Spot
rebalance recommendation as an Advisory record, as the Event Grid path takes it), and a
health row only when it is newer (`occurredTime`, as deliveries are folded). A row's absence
says nothing: it never ends an event or frees a VM.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import requests

from bridge.config import ConfigError, EventGridSettings
from bridge.consumer.guard import Failures, Guard
from bridge.consumer.sources.eventgrid import (
    HEALTH_CHANGED,
    HealthChange,
    Parsed,
    Trust,
)
from bridge.records import iso
from bridge.retry import (
    Backoff,
    DeliveryError,
    PermanentError,
    RetryableError,
    ThrottledError,
    parse_retry_after,
)

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

    from bridge import recordtypes as rt

log = logging.getLogger(__name__)

API_VERSION = "2022-10-01"
PATH = "/providers/Microsoft.ResourceGraph/resources"
SCHEDULED_EVENTS = "microsoft.maintenance/scheduledevents"
AVAILABILITY = "microsoft.resourcehealth/availabilitystatuses"
PAGE_ROWS = 1000  # the most a page may hold
MAX_PAGES = 50  # 50,000 rows a query a pass: a bound on one pass's cost, logged when reached
MAX_ANSWER_BYTES = 16 * 1024 * 1024
ATTEMPTS = 5  # tries of one page before the pass gives up (the next pass starts again)
TIMEOUT = (10.0, 60.0)  # connect, read
LOWEST_INTERVAL = 60.0
# Resource Graph's own delay: "you should see the updated results within 5 minutes in
# general" (resource-graph-health-samples). A row's event is dated this far back, so that a
# delivery Azure made since (read later, from a hub's backlog after a restart) is newer and
# wins in the fold, as Event Grid's word moves only forward in time.
LAG = timedelta(minutes=5)
_GROUP = re.compile(r"^[-\w._()]{1,90}$")
_ID = re.compile(r"^/subscriptions/[-\w._()/]{1,400}$")
MAX_HELD = 500  # VMs held down named in the health query; past it, every row is read
_RANK = {"Scheduled": 0, "Started": 1, "Completed": 2, "Canceled": 2}
_UNHEALTHY = ("Unavailable", "Degraded")


def check_settings(settings: EventGridSettings) -> None:
    """ConfigError when eventgrid.reconcile_interval cannot work (checked at start, exit 2)."""
    interval = settings.reconcile_interval
    if interval == 0:
        return
    if not settings.enabled:
        raise ConfigError(
            "eventgrid.reconcile_interval needs eventgrid.enabled: the reconciler "
            "feeds the second source's intake"
        )
    if not LOWEST_INTERVAL <= interval <= 86400:
        raise ConfigError(
            f"eventgrid.reconcile_interval {interval:g} is neither 0 (off) nor from "
            f"{LOWEST_INTERVAL:g} to 86400 seconds (Resource Graph's quota is "
            "shared by every query of the identity)"
        )
    if not settings.resource_graph_url.startswith("https://"):
        raise ConfigError(
            f"eventgrid.resource_graph_url {settings.resource_graph_url!r} is not "
            "an https:// address"
        )


def queries(trust: Trust, held_down: Sequence[str] = ()) -> dict[str, str]:
    """The two queries, by the table they read, narrowed to eventgrid.resource_groups. Health
    reads the VMs that are not Available and those of `held_down` (the resource ids the
    fleet state holds Unavailable or Degraded, lower case), whose Available is news: every
    VM's row each pass would be a kilobyte a VM (benchmark 12)."""
    names = sorted({g.rpartition("/")[2] for g in trust.resource_groups})
    narrow = ""
    if names and all(_GROUP.match(n) for n in names):
        narrow = " | where resourceGroup in~ (" + ", ".join(f"'{n}'" for n in names) + ")"
    columns = " | project id, name, type, location, subscriptionId, resourceGroup, properties"
    found = {
        "maintenanceresources": f"maintenanceresources | where type =~ '{SCHEDULED_EVENTS}'"
        f"{narrow}{columns}"
    }
    if trust.health:
        state = "tostring(properties.availabilityState) != 'Available'"
        ids = sorted({i.lower() for i in held_down})
        if len(ids) > MAX_HELD or not all(_ID.match(i) for i in ids):
            state = ""  # every row: a query of its own size, still bounded by the pages
        elif ids:
            listed = ", ".join(f"'{i}'" for i in ids)
            state += f" or tolower(tostring(properties.targetResourceId)) in ({listed})"
        found["healthresources"] = (
            f"healthresources | where type =~ '{AVAILABILITY}'{narrow}"
            + (f" | where {state}" if state else "")
            + columns
        )
    return found


class Transport(Protocol):
    """One POST: (status, headers lower-cased, body), the body read up to `limit` bytes
    (PermanentError past it); RetryableError when the server cannot be reached."""

    def post(
        self, url: str, headers: Mapping[str, str], body: bytes, limit: int
    ) -> tuple[int, dict[str, str], bytes]: ...


class RequestsTransport:
    """requests, with its proxies and CA bundle from the environment, a deadline per read."""

    def __init__(self) -> None:
        self._requests = requests
        self._session = requests.Session()

    def post(
        self, url: str, headers: Mapping[str, str], body: bytes, limit: int
    ) -> tuple[int, dict[str, str], bytes]:
        try:
            with self._session.post(
                url,
                data=body,
                headers=dict(headers),
                timeout=TIMEOUT,
                stream=True,
                allow_redirects=False,
            ) as answer:
                data = bytearray()
                for chunk in answer.iter_content(64 * 1024):
                    data += chunk
                    if len(data) > limit:
                        raise PermanentError(f"Resource Graph's answer is over {limit} bytes")
                found = {k.lower(): v for k, v in answer.headers.items()}
                return answer.status_code, found, bytes(data)
        except self._requests.RequestException as err:
            raise RetryableError(f"cannot reach Resource Graph: {err}") from err

    def close(self) -> None:
        self._session.close()


@dataclass
class Cost:
    """What the reconciler has cost so far: requests, bytes, rows, throttled answers."""

    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    rows: int = 0
    throttled: int = 0
    passes: int = 0
    failed_passes: int = 0
    fed_events: int = 0
    fed_health: int = 0


class ResourceGraph:
    """Pages of one query's rows, with the identity's token, waiting out the quota."""

    def __init__(
        self,
        url: str,
        credential: TokenCredential,
        transport: Transport,
        *,
        sleep: Callable[[float], bool] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        """`sleep(seconds)` waits, False when the reconciler is stopping (no more requests);
        by default it waits on `stop`, which Reconciler.run sets to its own."""
        self.url = url.rstrip("/")
        self.scope = f"{self.url}/.default"
        self._credential, self._transport = credential, transport
        self.stop = threading.Event()
        self._sleep = sleep or (lambda seconds: not self.stop.wait(seconds))
        self._backoff = backoff or Backoff(initial=2.0, maximum=60.0)
        self.cost = Cost()

    def rows(self, query: str, subscriptions: Sequence[str]) -> Iterator[dict[str, Any]]:
        """Every row of `query` over `subscriptions`, page by page (at most MAX_PAGES)."""
        token: str | None = None
        for _ in range(MAX_PAGES):
            options: dict[str, Any] = {"$top": PAGE_ROWS, "resultFormat": "objectArray"}
            if token:
                options["$skipToken"] = token
            page = self._page(
                {"subscriptions": list(subscriptions), "query": query, "options": options}
            )
            data = page.get("data")
            if not isinstance(data, list):
                raise PermanentError("Resource Graph's answer has no data array")
            for row in data:
                if isinstance(row, dict):
                    self.cost.rows += 1
                    yield row
            next_token = page.get("$skipToken")
            if not isinstance(next_token, str) or not next_token:
                return
            token = next_token
        log.warning(
            "Resource Graph's query %s has more than %d pages of %d rows: the rest is "
            "left for Event Grid's deliveries (narrow eventgrid.resource_groups)",
            query.split(" ", 1)[0],
            MAX_PAGES,
            PAGE_ROWS,
        )

    def _page(self, body: dict[str, Any]) -> dict[str, Any]:
        sent = json.dumps(body).encode()
        self._backoff.reset()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return self._post(sent)
            except (RetryableError, PermanentError) as err:
                if isinstance(err, PermanentError) or attempt == ATTEMPTS:
                    raise
                delay = self._backoff.delay_for(err)
                log.debug("Resource Graph: %s; trying again in %.1f s", err, delay)
                if not self._sleep(delay):
                    raise RetryableError("stopping") from err
        raise AssertionError("unreachable")  # pragma: no cover

    def _post(self, sent: bytes) -> dict[str, Any]:
        token = self._credential.get_token(self.scope).token
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.cost.requests += 1
        self.cost.bytes_sent += len(sent)
        status, headers_in, data = self._transport.post(
            f"{self.url}{PATH}?api-version={API_VERSION}", headers, sent, MAX_ANSWER_BYTES
        )
        self.cost.bytes_received += len(data)
        if status == 429:
            self.cost.throttled += 1
            raise ThrottledError(
                "Resource Graph throttled the query (429)",
                parse_retry_after(headers_in.get("retry-after")),
            )
        if status >= 500 or status == 408:
            raise RetryableError(f"Resource Graph answered {status}")
        if status != 200:
            raise PermanentError(
                f"Resource Graph answered {status}: {_error(data)}; the "
                "consumer's identity needs Reader on "
                "eventgrid.subscriptions"
            )
        self._mind_quota(headers_in)
        try:
            page = json.loads(data)
        except ValueError as err:
            raise PermanentError(f"Resource Graph's answer is not JSON: {err}") from err
        if not isinstance(page, dict):
            raise PermanentError("Resource Graph's answer is not a JSON object")
        return page

    def _mind_quota(self, headers: Mapping[str, str]) -> None:
        """A spent quota is waited out before the next request, not learnt from a 429."""
        if headers.get("x-ms-user-quota-remaining", "").strip() != "0":
            return
        wait = _hms(headers.get("x-ms-user-quota-resets-after", ""))
        if wait:
            self._sleep(min(wait, 60.0))


def _hms(text: str) -> float:
    parts = text.strip().split(":")
    try:
        hours, minutes, seconds = (float(p) for p in parts) if len(parts) == 3 else (0, 0, 0)
    except ValueError:
        return 0.0
    return max(0.0, hours * 3600 + minutes * 60 + seconds)


def _error(data: bytes) -> str:
    try:
        found = json.loads(data).get("error", {})
        return f"{found.get('code', '?')}: {str(found.get('message', ''))[:300]}"
    except (ValueError, AttributeError):
        return data[:200].decode("utf-8", "replace")


def as_delivery(row: Mapping[str, Any], table: str, now: datetime) -> str:
    """A row as the delivery of its system topic that would have told it, for `parse`."""
    subscription = row.get("subscriptionId")
    event_type = (
        HEALTH_CHANGED
        if table == "healthresources"
        else ("microsoft.maintenance/scheduledevents/write")
    )
    return json.dumps(
        {
            "id": f"resource-graph:{row.get('id')}",
            "topic": f"/subscriptions/{subscription}" if isinstance(subscription, str) else None,
            "subject": row.get("id"),
            "eventType": event_type,
            "eventTime": iso(now),
            "data": {"resourceInfo": dict(row)},
        }
    )


@dataclass
class Plan:
    """What one pass folds: the rows that tell more than the fleet state holds. A Spot
    rebalance recommendation's row is an Advisory record among `events`, as the Event Grid
    path folds it (never approved)."""

    events: list[rt.Event | rt.Advisory] = field(default_factory=list)
    health: list[HealthChange] = field(default_factory=list)


def plan(
    parsed: Parsed,
    events_known: Mapping[str, Mapping[str, Any]],
    health_known: Mapping[str, Mapping[str, Any]],
    failed: Callable[[Exception, str], None] | None = None,
) -> Plan:
    """The rows of `parsed` to fold: `events_known` the stored event documents by EventId
    (lower case), `health_known` the stored health documents by resource id (lower case).
    `failed(error, which row)`: a row that cannot be compared (a stored document of a shape
    nobody wrote) is told there and left out, the rest go on; without it, the error raises."""
    chosen = Plan()
    records: list[rt.Event | rt.Advisory] = [*parsed.events, *parsed.advisories]
    for record in records:
        try:
            if _tells_more(record, events_known.get(record["EventId"].lower())):
                chosen.events.append(record)
        except Exception as err:
            if failed is None:
                raise
            failed(err, f"event {record['EventId']}")
    for change in parsed.health:
        try:
            if _health_tells_more(change, health_known.get(change.resource.id.lower())):
                chosen.health.append(change)
        except Exception as err:
            if failed is None:
                raise
            failed(err, f"the health of {change.resource.vm_name or change.resource.id}")
    return chosen


def _health_tells_more(change: HealthChange, doc: Mapping[str, Any] | None) -> bool:
    if doc is None:
        return change.state in _UNHEALTHY  # Available of a VM never held down: nothing new
    return iso(change.at) > str(doc.get("at", ""))


def _tells_more(record: rt.Event | rt.Advisory, held: Mapping[str, Any] | None) -> bool:
    rank = _RANK[_status_of(record)]
    if held is None:
        return rank < 2  # an end of an event nobody holds ends nothing
    azure = held.get("azure")
    if not isinstance(azure, Mapping):
        return True
    was = _RANK.get(str(azure.get("status")), -1)
    if rank != was:
        return rank > was
    if rank == 2:
        return False
    names = sorted(n.lower() for n in record["Resources"])
    return names != sorted(str(n).lower() for n in azure.get("resources") or []) or (
        record["NotBefore"] != azure.get("not_before")
    )


def _status_of(record: rt.Event | rt.Advisory) -> str:
    """The status Azure told: an Advisory's as the fold takes it (documents.
    _merge_advisory_record: Scheduled while Raised, Completed once Cleared)."""
    if record["RecordType"] == "Advisory":
        return "Scheduled" if record["AdvisoryState"] == "Raised" else "Completed"
    return record["Transition"]


class Intake(Protocol):
    """What the reconciler feeds (bridge.consumer.secondsource.EventGridIntake)."""

    trust: Trust

    def take(self, bodies: Sequence[str], what: str = ...) -> Parsed: ...

    def fold(
        self, events: Sequence[rt.Event | rt.Advisory], health: Sequence[HealthChange]
    ) -> None: ...


class Known(Protocol):
    """The fleet state's view the plan compares rows with."""

    def events(self, event_ids: Sequence[str]) -> Mapping[str, Mapping[str, Any]]: ...

    def health(self) -> Mapping[str, Mapping[str, Any]]: ...


class Reconciler:
    """One pass: both queries, their rows through the intake's parser, `plan`, the fold.

    A pass never ends the loop that makes it (`once`, `run`): whatever fails is counted
    (`guard`, `rows`: bridge.consumer.guard) and said once per kind, and the next pass runs
    on schedule. One row that cannot be compared or folded keeps no other row of its pass
    out: it is left for the next pass, which tries it again."""

    def __init__(
        self,
        graph: ResourceGraph,
        intake: Intake,
        known: Known,
        now: Callable[[], datetime],
        failures: Failures | None = None,
    ) -> None:
        """`failures`: where the metric finds the reconciler's counts (`se-bridge consume`'s)."""
        self.graph, self.intake, self.known, self._now = graph, intake, known, now
        self.guard = Guard("reconcile", log, failures)  # whole passes that failed
        self.rows = Guard("reconcile_row", log, failures)  # rows left out of a pass
        self._left_out = 0

    @property
    def cost(self) -> Cost:
        return self.graph.cost

    def reconcile(self) -> Plan:
        """One pass; DeliveryError when a query failed, or what else failed before the rows
        were planned (the fleet state): nothing of that pass is folded then. A row that
        cannot be planned or folded is counted in `rows` and left out; the rest are folded."""
        try:
            chosen = self._chosen()
        except Exception:
            self.cost.failed_passes += 1
            raise
        finally:
            self.cost.passes += 1
        if chosen.events or chosen.health:
            log.info(
                "Resource Graph told of %d event changes and %d health changes Event Grid "
                "had not delivered: folded in",
                len(chosen.events),
                len(chosen.health),
            )
        folded = self._fold(chosen)
        if not self._left_out:
            self.rows.succeeded("folding Resource Graph's rows")
        self.cost.fed_events += len(folded.events)
        self.cost.fed_health += len(folded.health)
        return folded

    def _chosen(self) -> Plan:
        self._left_out = 0  # rows of this pass that could not be planned or folded
        trust = self.intake.trust
        subscriptions = sorted(trust.subscriptions)
        bodies: list[str] = []
        now = self._now() - LAG
        health = self.known.health() if trust.health else {}
        held = [i for i, doc in health.items() if doc.get("state") in _UNHEALTHY]
        for table, query in queries(trust, held).items():
            bodies += [
                as_delivery(row, table, now) for row in self.graph.rows(query, subscriptions)
            ]
        parsed = self.intake.take(bodies, "a Resource Graph row")
        known = self.known.events([e["EventId"] for e in (*parsed.events, *parsed.advisories)])
        return plan(parsed, known, health, self._row_failed)

    def _fold(self, chosen: Plan) -> Plan:
        """Fold what `chosen` holds, all at once; if that fails, each row alone, so that one
        that cannot be folded keeps no other out. What was folded."""
        folded = Plan()
        for events, health in ((chosen.events, []), ([], chosen.health)):
            if not (events or health):
                continue
            try:
                self.intake.fold(events, health)
            except Exception:  # one row, or the state: each alone tells which
                for record in events:
                    if self._fold_one([record], [], f"event {record['EventId']}"):
                        folded.events.append(record)
                for change in health:
                    which = f"the health of {change.resource.vm_name or change.resource.id}"
                    if self._fold_one([], [change], which):
                        folded.health.append(change)
                continue
            folded.events += events
            folded.health += health
        return folded

    def _fold_one(
        self, events: Sequence[rt.Event | rt.Advisory], health: Sequence[HealthChange], which: str
    ) -> bool:
        try:
            self.intake.fold(events, health)
        except Exception as err:
            self._row_failed(err, which)
            return False
        return True

    def _row_failed(self, err: Exception, which: str) -> None:
        self._left_out += 1
        self.rows.failed(
            err,
            f"folding Resource Graph's row of {which}",
            "the pass's other rows go on, and the next pass tries this one again; if it "
            "fails pass after pass, report this line with its traceback (until then Event "
            "Grid's deliveries of it still count)",
        )

    def once(self, interval: float) -> None:
        """One pass, as `run` and the Functions app's timer make it: whatever fails is logged
        and counted, not raised (Event Grid's deliveries still count, and the next pass,
        `interval` seconds on, tries again), and each kind of failure in a run of them is
        said once, so a person acts on it once. Resource Graph's own failures (unreachable,
        throttled past the retries, the identity refused) are a WARNING; anything else (the
        fleet state failing, a bug) an ERROR with its traceback."""
        try:
            self.reconcile()
        except DeliveryError as err:
            self.guard.failed(
                err,
                "the Resource Graph reconciler's pass",
                f"Event Grid's deliveries still count, the next pass is in {interval:g} s",
                level=logging.WARNING,
            )
            return
        except Exception as err:  # the loop never ends: the next pass runs on schedule
            self.guard.failed(
                err,
                "the Resource Graph reconciler's pass",
                f"nothing of it was folded; Event Grid's deliveries still count, the next "
                f"pass is in {interval:g} s; check that the fleet state (consumer.state) "
                "answers, and report this line with its traceback if it does",
            )
            return
        self.guard.succeeded("the Resource Graph reconciler")

    def run(self, stop: threading.Event, interval: float) -> None:
        """A pass every `interval` seconds until `stop`."""
        self.graph.stop = stop
        while not stop.is_set():
            self.once(interval)
            stop.wait(interval)

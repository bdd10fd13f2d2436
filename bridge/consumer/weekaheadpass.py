"""The week ahead's periodic pass (issue 40, item 2; docs/planned-disruptions.md#the-week-ahead):
every weekahead.interval, `se-bridge consume`'s thread (or the Functions app's `weekahead`
timer) reads the planned maintenance of the days ahead through Resource Graph as the consumer's
identity (bridge.consumer.weekahead.week_ahead), checks it against the policy's budgets and the
fleet the consumer knows now, and writes the Upcoming records to the consumer's sinks, where its
Decision records go (Log Analytics in production).

Each pass also keeps a summary in the fleet state (collection `weekahead`, one document,
bounded: at most MAX_LISTED runs that would break a budget are listed, the rest counted), so
that `se-bridge status --consumer` lists what would break without asking Azure. A stored
summary, for example:

    {"at": "2026-12-07T09:00:00.000Z", "runs": 2, "vms": 8, "others": 0,
     "breaking_total": 2, "problems": 0, "problem_lines": [],
     "breaking": [{"source": "MaintenanceConfiguration", "name": "web-tue-0200",
                   "start": "2026-12-08T01:00:00.000Z", "end": "2026-12-08T04:55:00.000Z",
                   "vms": 4, "breaks": ["web-tue-0200 at 2026-12-08 01:00Z: budget one: ..."]}]}

The summary also says when the days ahead were last read: a pass within the interval of it
(a restarted consumer's first, or another consumer's of the same fleet state) reads nothing, so
that several consumers read once an interval between them.

A pass that fails is counted (`se_bridge_consumer_failures_total{activity="weekahead"}`), said
once per kind of failure (bridge.consumer.guard), and the next pass, an interval on, tries again;
nothing else of the consumer waits on it or stops because of it.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from bridge import host
from bridge import recordtypes as rt
from bridge.cloud import identity
from bridge.config import Config, ConfigError, EventGridSettings, WeekAheadSettings
from bridge.consumer.guard import Failures, Guard
from bridge.consumer.planned import read_more
from bridge.consumer.sources.resourcegraph import RequestsTransport, ResourceGraph
from bridge.consumer.state import Doc, Store, update
from bridge.consumer.state.layout import WEEKAHEAD
from bridge.consumer.weekahead import read_runs, week_ahead
from bridge.policy.model import FleetView
from bridge.policy.upcoming import Planned
from bridge.records import RecordView, iso, parse_time, utc_now
from bridge.retry import DeliveryError

if TYPE_CHECKING:
    from bridge.consumer.core import Consumer

log = logging.getLogger(__name__)

SUMMARY = "summary"  # the one document of the collection
MAX_LISTED = 50  # runs that would break a budget listed in the summary; the rest are counted
MAX_PROBLEMS = 10  # sentences of what could not be read kept in the summary
MAX_SAID = 300  # characters of each kept sentence
# A break's line names up to 3 overlapping windows of other sources (bridge.policy.upcoming
# .NAMED), about 500 characters: kept whole.
MAX_BREAK_SAID = 600
# A pass within this part of the interval of the newest one reads nothing: timers drift by
# seconds, and a pass a little early must not be skipped for a whole interval.
SOON = 0.9
_SUBSCRIPTION = re.compile(r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")


def subscriptions_of(config: Config) -> list[str]:
    """The subscriptions the week ahead reads: weekahead.subscriptions, else eventgrid's."""
    named = [s.strip() for s in config.weekahead.subscriptions if s.strip()]
    return named or [s.strip() for s in config.eventgrid.subscriptions if s.strip()]


def check_settings(settings: WeekAheadSettings, eventgrid: EventGridSettings) -> None:
    """ConfigError when [weekahead] cannot work (checked at start, exit 2)."""
    if not settings.enabled:
        return
    check_subscriptions(settings, eventgrid)
    if not eventgrid.resource_graph_url.startswith("https://"):
        raise ConfigError(
            f"eventgrid.resource_graph_url {eventgrid.resource_graph_url!r} is not an https:// "
            "address (the week ahead asks Resource Graph there)"
        )


def check_subscriptions(settings: WeekAheadSettings, eventgrid: EventGridSettings) -> list[str]:
    """The subscriptions to read; ConfigError when there are none or one is no id."""
    named = [s.strip() for s in settings.subscriptions if s.strip()]
    found = named or [s.strip() for s in eventgrid.subscriptions if s.strip()]
    if not found:
        raise ConfigError(
            "the week ahead needs weekahead.subscriptions (or eventgrid.subscriptions): the "
            "subscriptions whose maintenance configurations it reads"
        )
    bad = [s for s in found if not _SUBSCRIPTION.match(s)]
    if bad:
        setting = "weekahead.subscriptions" if named else "eventgrid.subscriptions"
        raise ConfigError(f"{setting}: {', '.join(bad)} is not a subscription id")
    return [s.lower() for s in found]


# --- the summary status reads ----------------------------------------------------------------


def summarize(
    records: Sequence[RecordView], problems: Sequence[str], now: datetime
) -> dict[str, Any]:
    """What a pass found, bounded: the runs that would break a budget (the first MAX_LISTED,
    soonest first) and how many others; pure."""
    runs: dict[tuple[str, str, str], dict[str, Any]] = {}
    for record in records:
        # What names the disruption: a configuration's run, or another source's notice.
        name = str(
            record.get("MaintenanceConfiguration")
            or record.get("NoticeTitle")
            or record.get("NoticeId")
            or "?"
        )
        start = str(record.get("WindowStart", ""))
        source = str(record.get("UpcomingSource", ""))
        found = runs.setdefault((start, source, name), {
            "source": source, "name": name, "start": start,
            "end": str(record.get("WindowEnd", "")), "vms": 0, "breaks": [],
        })  # fmt: skip
        found["vms"] += 1
        said = record.get("BudgetBreaks")
        for line in said if isinstance(said, list) else ():
            if str(line)[:MAX_BREAK_SAID] not in found["breaks"]:
                found["breaks"].append(str(line)[:MAX_BREAK_SAID])
    breaking = [run for _, run in sorted(runs.items()) if run["breaks"]]
    return {
        "at": iso(now),
        "runs": len(runs),
        "vms": len(records),
        "breaking_total": len(breaking),
        "breaking": breaking[:MAX_LISTED],
        "others": len(runs) - len(breaking),
        "problems": len(problems),
        "problem_lines": [p[:MAX_SAID] for p in problems[:MAX_PROBLEMS]],
    }


def store_summary(store: Store, summary: Mapping[str, Any]) -> None:
    """Keep `summary` unless a newer pass (another consumer's) kept one since."""

    def newer(value: dict[str, Any]) -> bool:
        if str(value.get("at", "")) > str(summary["at"]):
            return False
        value.clear()
        value.update(summary)
        return True

    update(store, WEEKAHEAD, SUMMARY, newer)


def read_summary(store: Store) -> dict[str, Any] | None:
    """The newest pass's summary, None before the first."""
    doc: Doc | None = store.read(WEEKAHEAD, SUMMARY)
    return None if doc is None else dict(doc.value)


# --- the pass --------------------------------------------------------------------------------


class WeekAheadPass:
    """One read of the days ahead, as `se-bridge consume` and the Functions app make it."""

    def __init__(
        self,
        graph: ResourceGraph,
        subscriptions: Sequence[str],
        consumer: Consumer,
        emit: Callable[[Sequence[RecordView]], None],
        *,
        host_name: str,
        failures: Failures | None = None,
    ) -> None:
        self.graph, self.subscriptions = graph, list(subscriptions)
        self.consumer, self._emit, self.host_name = consumer, emit, host_name
        self.guard = Guard("weekahead", log, failures)

    def read(self) -> tuple[list[rt.Upcoming], list[str]]:
        """The Upcoming records of the days ahead and what could not be read; raises."""
        consumer = self.consumer
        return week_ahead(
            self.graph.rows,
            self.subscriptions,
            consumer.fleet_view(),
            consumer.policy.budgets,
            consumer.current_time(),
            host_name=self.host_name,
        )

    def once(self, interval: float) -> None:
        """One pass; whatever fails is counted and said (once for a run of failures), never
        raised: the next pass, `interval` seconds on, tries again. Resource Graph's own
        failures (unreachable, throttled past the retries, the identity refused) are a
        WARNING; anything else (the fleet state, the sinks' spool, a bug) an ERROR with its
        traceback."""
        what = "reading the week ahead"
        try:
            if self._read_lately(interval):
                return
            records, problems = self.read()
            for problem in problems:
                log.warning("the week ahead: %s", problem)
            if records:
                self._emit(records)
            summary = summarize(records, problems, self.consumer.current_time())
            store_summary(self.consumer.store, summary)
        except DeliveryError as err:
            self.guard.failed(
                err,
                what,
                "nothing was written; the next pass is in "
                f"{interval:g} s; check the consumer's Reader role on weekahead.subscriptions "
                "(or eventgrid.subscriptions) and eventgrid.resource_graph_url",
                level=logging.WARNING,
            )
            return
        except Exception as err:  # the consumer goes on: the next pass runs on schedule
            self.guard.failed(
                err,
                what,
                f"its records may be missing; the next pass is in {interval:g} s; check that "
                "the fleet state (consumer.state) answers, and report this line with its "
                "traceback if it does",
            )
            return
        self.guard.succeeded("the week ahead")
        log.info(
            "the week ahead: %d Upcoming records written of %d runs, %d of which would "
            "break a budget",
            len(records),
            summary["runs"],
            summary["breaking_total"],
        )

    def _read_lately(self, interval: float) -> bool:
        """Whether a pass (another consumer's of this fleet state, or this one's before a
        restart) read the days ahead within `interval`: every consumer passes as it starts and
        on its own timer, and one read an interval is what the setting asks for."""
        last = read_summary(self.consumer.store)
        at = parse_time(last.get("at")) if last else None
        now = self.consumer.current_time()
        if at is None or not timedelta(0) <= now - at < interval * SOON * timedelta(seconds=1):
            return False
        log.debug("the week ahead was read at %s: the next read is an interval after", iso(at))
        return True

    def run(self, stop: threading.Event, interval: float) -> None:
        """A pass now, then every `interval` seconds until `stop`."""
        self.graph.stop = stop
        while not stop.is_set():
            self.once(interval)
            stop.wait(interval)


def build(
    config: Config,
    consumer: Consumer,
    emit: Callable[[Sequence[RecordView]], None],
    failures: Failures | None = None,
) -> WeekAheadPass | None:
    """The pass of `consumer` when weekahead.enabled, as its identity; None when off."""
    if not config.weekahead.enabled:
        return None
    graph = ResourceGraph(
        config.eventgrid.resource_graph_url,
        identity.credential(config.identity),
        RequestsTransport(),
    )
    subscriptions = check_subscriptions(config.weekahead, config.eventgrid)
    return WeekAheadPass(
        graph, subscriptions, consumer, emit, host_name=host.host_name(), failures=failures
    )


# --- policy check --azure --------------------------------------------------------------------


def check_azure(
    config: Config, fleet: FleetView, now: datetime, real_now: datetime | None = None
) -> tuple[list[Planned], list[Planned], FleetView, list[str]]:
    """The runs of the 14 days from `now` of the configurations Azure holds and the other
    sources' windows (Service Health, AKS; read once as the consumer's identity), the fleet
    as the budgets count it then (the VMs live now taken as live then), and what could not
    be read."""
    subscriptions = check_subscriptions(config.weekahead, config.eventgrid)
    graph = ResourceGraph(
        config.eventgrid.resource_graph_url,
        identity.credential(config.identity),
        RequestsTransport(),
    )
    runs, problems = read_runs(graph.rows, subscriptions, now)
    more = read_more(graph.rows, subscriptions, now)
    looked = real_now or utc_now()
    vms = {
        key: replace(vm, last_seen=now) if fleet.alive(key, looked) else vm
        for key, vm in fleet.vms.items()
    }
    then = FleetView(vms, impacted={}, alive_within=fleet.alive_within)
    return runs, more.planned(then), then, [*problems, *more.problems]

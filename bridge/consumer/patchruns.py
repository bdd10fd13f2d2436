"""Update Manager's patch runs in the consumer (issue 40, item 1; docs/planned-disruptions.md):
a pre-maintenance event's run is resolved to its VMs (Resource Graph), decided on by the
patch-run gate (bridge.policy.gates.patchrun), and counted in every budget from its start to
its post-event or its bound (bridge.policy.patchruns). Each decision is a Decision record
(DecisionAction Run, Ask or Cancel; EventId `(patch:CONFIGURATION/RUN)`), a WARNING for a run
over a budget, a notice for an ask, a run over a budget and a cancel, and a count of
`outcomes` (the metric se_bridge_consumer_patch_runs).

One document per run in the fleet state (collection `patchrun`), so that every consumer of
the store counts the same runs and a restart forgets none; a delivery that repeats (Event Grid
delivers at least once) finds its run's document and changes nothing. A cancel is sent only
by the gate's Cancel, which it gives only by an explicit rule, only with patchruns.cancel on,
and only until a margin before the cut-off; ARM's PUT is idempotent, and a run once
cancelled is never sent again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from bridge import host
from bridge import recordtypes as rt
from bridge.cloud import identity
from bridge.cloud.applyupdates import ArmCancel, Cancelled
from bridge.config import Config, ConfigError, PatchRunSettings
from bridge.consumer.decisionrecord import Voice
from bridge.consumer.notices import NoticeQueue
from bridge.consumer.people.desk import PatchAsk
from bridge.consumer.sources.patchruns import Resolved, RunNotice, resolve
from bridge.consumer.sources.resourcegraph import RequestsTransport, ResourceGraph
from bridge.consumer.state import Conflict, Store, update
from bridge.consumer.state.layout import PATCHRUN
from bridge.notify.notice import Notice, NoticeKind, listed
from bridge.policy.gates.patchrun import PatchRule, PatchVerdict, breaches, decide
from bridge.policy.model import Budget, FleetView, Person, Scope, VmView
from bridge.policy.patchruns import (
    RunView,
    counted,
    counted_until,
    index_of,
    members,
    name_of,
    places,
)
from bridge.records import Origin, RecordView, VmIdentity, iso, parse_time, record_id
from bridge.retry import DeliveryError

if TYPE_CHECKING:
    from bridge.consumer.core import Consumer

log = logging.getLogger(__name__)

RULE = "(patch run)"  # the DecisionRule of a patch run's Decision records
KEEP = timedelta(days=1)  # a run's document is kept this long after it stops counting


def check_settings(settings: PatchRunSettings, eventgrid_enabled: bool) -> None:
    """ConfigError when [patchruns] cannot work (checked at start)."""
    if not settings.enabled:
        return
    if not eventgrid_enabled:
        raise ConfigError(
            "patchruns.enabled needs eventgrid.enabled: the pre- and post-maintenance events "
            "come from the second source's event hub"
        )
    wants_cancel = settings.on_breach == "cancel" or (
        settings.on_breach == "ask" and settings.on_deadline == "cancel"
    )
    if wants_cancel and not settings.cancel:
        raise ConfigError(
            "patchruns.on_breach (or on_deadline) cancel needs patchruns.cancel = true: a "
            "cancel of a patch run is taken only where it is allowed in so many words"
        )
    if settings.on_breach == "ask" and not settings.ask_target:
        raise ConfigError("patchruns.on_breach ask needs patchruns.ask_target")


def rule_of(settings: PatchRunSettings) -> PatchRule:
    on_breach: Literal["run", "ask", "cancel"] = (
        "ask"
        if settings.on_breach == "ask"
        else "cancel"
        if settings.on_breach == "cancel"
        else "run"
    )
    return PatchRule(
        on_breach,
        cancel=settings.cancel,
        ask_target=settings.ask_target,
        on_deadline="cancel" if settings.on_deadline == "cancel" else "run",
        margin=timedelta(seconds=settings.cancel_margin),
    )


def install(
    consumer: Consumer, config: Config, emit: Callable[[Sequence[RecordView]], None]
) -> PatchRuns:
    """PatchRuns for `consumer` as [patchruns] and [eventgrid] say, with the consumer's
    identity for Resource Graph and ARM: its runs counted in every budget the consumer checks,
    decided on each tick (`Consumer.patch_runs`)."""
    credential = identity.credential(config.identity)
    graph = ResourceGraph(config.eventgrid.resource_graph_url, credential, RequestsTransport())
    cancel = None
    if config.patchruns.cancel:
        arm = ArmCancel(
            credential, config.eventgrid.arm_endpoint, api_version=config.patchruns.api_version
        )
        cancel = arm.cancel
    parts = Parts(
        resolve=lambda notice: resolve(notice, graph.rows),
        fleet=consumer.fleet_view,
        budgets=lambda: consumer.policy.budgets,
        emit=emit,
        cancel=cancel,
        notices=consumer.dispatch.notifier,
        voice=Voice(consumer.policy.source, host.host_name(), consumer.settings.mode == "shadow"),
    )
    runs = PatchRuns(
        consumer.store, config.patchruns, parts, consumer.current_time, lock=consumer.lock
    )
    attach(consumer, runs)
    return runs


def attach(consumer: Consumer, runs: PatchRuns) -> None:
    """Make `consumer` count and decide `runs`: its budgets count the runs' VMs from their
    start, its tick decides them again, its Event Grid intake hands it their events."""
    consumer.patch_runs = runs
    consumer.fleet.vms.patch_impact = lambda vms: runs.counted(vms, consumer.current_time())


def run_key(run_id: str) -> str:
    """A run's document key: a name Table Storage takes (a run id has slashes)."""
    return record_id("patchrun", run_id.lower())


def subject(run: RunView) -> str:
    """A run as a Decision record's EventId names it: `(patch:CONFIGURATION/RUN)`."""
    return f"(patch:{run.configuration.rstrip('/').rpartition('/')[2]}/{run.run_id[-14:]})"


@dataclass(frozen=True)
class Parts:
    """What PatchRuns needs of the consumer."""

    resolve: Callable[[RunNotice], Resolved]  # Resource Graph (sources.patchruns.resolve)
    fleet: Callable[[], FleetView]  # the fleet as the budgets see it now
    budgets: Callable[[], tuple[Budget, ...]]
    emit: Callable[[Sequence[RecordView]], None]  # Decision records, to the sinks
    cancel: Callable[[str, str], Cancelled] | None = None  # ArmCancel.cancel
    notices: NoticeQueue | None = None
    voice: Voice | None = None  # the consumer's (its policy's source, its host name)


class PatchRuns:
    """Every patch run the consumer knows, its decisions and its count in the budgets."""

    def __init__(
        self,
        store: Store,
        settings: PatchRunSettings,
        parts: Parts,
        now: Callable[[], datetime],
        *,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        """`lock`: the consumer's, which its tick holds when it calls `tick` and which the
        fleet's view takes: one lock, so the hub's reader and the timer never wait on each
        other's."""
        self.store, self.parts, self._now = store, parts, now
        self.rule = rule_of(settings)
        self.grace = timedelta(seconds=settings.grace)
        self.outcomes: Counter[str] = Counter()
        self._lock = lock or threading.RLock()
        self._held: tuple[datetime, list[RunView]] | None = None  # (read at, runs)

    # --- what the budgets count ------------------------------------------------------------

    def runs(self) -> list[RunView]:
        """Every run stored: read at most every feed_interval where a read costs a query
        (Table Storage), as the health documents are; at once after this process wrote."""
        now = self._now()
        every = timedelta(seconds=self.store.feed_interval)
        held = self._held
        if held is None or not self.store.feed_interval or abs(now - held[0]) >= every:
            docs = self.store.scan(PATCHRUN)
            held = (now, [_view(doc.value) for doc in docs if doc.value.get("run_id")])
            self._held = held
        return held[1]

    def impact(self, vms: Mapping[str, VmView], now: datetime) -> dict[str, frozenset[str]]:
        """The runs counting at `now`, as FleetView.impacted's pseudo events."""
        return self.counted(vms, now)[0]

    def counted(
        self, vms: Mapping[str, VmView], now: datetime
    ) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[Scope]]]:
        """The runs counting at `now`, as pseudo events, and where the names of their VMs no
        agent reports may be (FleetView.reach; bridge.policy.patchruns.counted)."""
        return counted(self.runs(), vms, now, self.grace)

    # --- what comes in -----------------------------------------------------------------------

    def take(self, notices: Sequence[RunNotice]) -> None:
        """Fold the run notices of a batch of deliveries in, deciding each new run."""
        for notice in notices:
            if notice.kind == "pre":
                self._pre(notice)
            else:
                self._post(notice)

    def answer(self, run: str, said: str, by: Person, reason: str) -> tuple[str, str]:
        """A person's answer to the ask about `run` (its run id, or `(patch:CONFIG/RUN)` as
        notices and Decision records name it): (code, detail) for the people desk."""
        found = next(
            (v for v in self.runs() if run.lower() in (v.run_id, subject(v).lower())), None
        )
        if found is None:
            return "NotOpen", f"no patch run {run[:200]!r} is known"

        took: list[bool] = []

        def note(value: dict[str, Any]) -> bool:
            took.clear()
            if value.get("decided") != "Ask" or value.get("answer"):
                return False
            value.update(answer=said, answered_by=by.name, answered_by_id=by.object_id,
                         answer_reason=reason)  # fmt: skip
            took.append(True)
            return True

        stored = update(self.store, PATCHRUN, run_key(found.run_id), note)
        self._held = None
        if stored is None or not took:
            return "NotAsked", "nobody is asked about this run now (decided, or answered)"
        self._decide(found.run_id)
        said_now = (self.store.read(PATCHRUN, run_key(found.run_id)) or stored).value.get("said")
        return "Accepted", f"decided: {' '.join(map(str, said_now or []))}"

    def asks(self) -> list[PatchAsk]:
        """The runs a person is asked about and has not answered, the soonest first."""
        return asks_in(self.store, self.rule)

    def tick(self) -> None:
        """Decide again the runs still open to a decision (an ask's deadline, a cancel that
        failed and may be tried again before its margin), and forget those long over."""
        now = self._now()
        for doc in self.store.scan(PATCHRUN):
            run = _view(doc.value) if doc.value.get("run_id") else None
            if run is None:
                continue
            if now > counted_until(run, self.grace) + KEEP:
                with contextlib.suppress(Conflict):  # changed since: looked at next tick
                    self.store.delete(PATCHRUN, doc)
            elif doc.value.get("decided") in ("Ask", "Retry") and not run.cancelled:
                self._decide(run.run_id)

    # --- the parts ---------------------------------------------------------------------------

    def _pre(self, notice: RunNotice) -> None:
        now = self._now()
        key = run_key(notice.run_id)
        known = self.store.read(PATCHRUN, key)
        if known is not None and known.value.get("run_id"):
            return  # a delivery repeated: its run is decided already
        if notice.start + self.grace < now:
            log.info(
                "a pre-maintenance event of run %s came after its start: counted only",
                notice.run_id,
            )
        try:
            resolved = self.parts.resolve(notice)
        except DeliveryError as err:
            # Without its VMs the run cannot be counted or decided; it runs (Azure starts it
            # anyway) and is said, so that a person can check its configuration.
            resolved = Resolved(frozenset(), notes=(f"Resource Graph failed: {err}",))
            self.outcomes["unresolved"] += 1
            log.error(
                "patch run %s of %s: its VMs could not be read through Resource Graph (%s); it "
                "is not counted in the budgets (check Reader on eventgrid.subscriptions)",
                notice.name,
                notice.configuration_id,
                err,
            )

        def create(value: dict[str, Any]) -> bool:
            if value.get("run_id"):
                return False
            value.update(
                run_id=notice.run_id,
                configuration=notice.configuration_id,
                name=notice.name,
                start=iso(notice.start),
                end=iso(notice.end),
                cutoff=iso(notice.cutoff) if notice.cutoff else None,
                **stored_resources(resolved.resources, resolved.placed),
                whole=sorted(resolved.whole),
                unread=sorted(resolved.unread),
                notes=list(resolved.notes),
                seen=iso(now),
            )
            return True

        if resolved.unread:
            self.outcomes["instances_unread"] += 1
            log.warning(
                "patch run %s of %s: the instances of %d scale sets could not be read through "
                "Resource Graph (%s); the run counts as breaking every budget (worst case), and "
                "patchruns.on_breach decides it (check Reader on eventgrid.subscriptions)",
                notice.name,
                notice.configuration_id,
                len(resolved.unread),
                "; ".join(resolved.notes) or "no reason given",
            )
        update(self.store, PATCHRUN, key, create)
        self._held = None
        self._decide(notice.run_id)

    def _post(self, notice: RunNotice) -> None:
        def end(value: dict[str, Any]) -> bool:
            if not value.get("run_id") or value.get("post_at"):
                return False
            value["post_at"], value["status"] = iso(notice.at), notice.status
            return True

        self._held = None
        if update(self.store, PATCHRUN, run_key(notice.run_id), end) is None:
            log.info(
                "a post-maintenance event of run %s, whose pre-event se-bridge did not read: "
                "nothing of it was counted",
                notice.run_id,
            )

    def _decide(self, run_id: str) -> None:
        with self._lock:
            doc = self.store.read(PATCHRUN, run_key(run_id))
            if doc is None or not doc.value.get("run_id"):
                return
            value, now = doc.value, self._now()
            run = _view(value)
            fleet = self.parts.fleet()
            index = index_of(fleet.vms.values())
            run_vms = _counted(run, index)
            others = [
                other
                for other in self.runs()
                if other.run_id != run.run_id
                and not other.cancelled
                and other.start < run.end + self.grace
                and run.start < counted_until(other, self.grace)
            ]
            overlapping = {other.key: _counted(other, index) for other in others}
            where = _places(run, others, index)
            notes: list[str] = []
            budgets = self.parts.budgets()
            broken = breaches(
                budgets,
                fleet,
                run,
                run_vms,
                now,
                overlapping=overlapping,
                notes=notes,
                places=where,
            )
            broken += _unread(run, budgets)
            notes += [str(n) for n in value.get("notes") or ()]  # what Resource Graph left out
            answer = value.get("answer") if value.get("answer") in ("run", "cancel") else None
            verdict = decide(self.rule, run, broken, now, answer)
            retry = False
            shadow = self.parts.voice is not None and self.parts.voice.shadow
            if verdict.kind == "Cancel" and not run.cancelled and not shadow:
                # A shadow consumer says what it would do (DecisionMode shadow), and never
                # cancels: the live consumer decides.
                verdict, retry = self._cancel(run, verdict)
            decided = "Retry" if retry else verdict.kind
            if value.get("said") == [verdict.kind, verdict.reason]:
                self._mark(run.run_id, decided=decided)
                return  # decided so before: one record, one notice
            self._note(run, verdict, value)
            self._record(run, verdict, (*broken, *notes), value)
            self._mark(
                run.run_id,
                said=[verdict.kind, verdict.reason],
                decided=decided,
                # What the page shows of an ask (`asks`): the count and the budgets broken.
                vms=len(run_vms),
                breaches=list(verdict.breaches),
                deadline=iso(verdict.deadline) if verdict.deadline else None,
            )

    def _cancel(self, run: RunView, verdict: PatchVerdict) -> tuple[PatchVerdict, bool]:
        """Send the cancel: the verdict as it turned out, and whether to try again."""
        if self.parts.cancel is None:
            return replace(
                verdict,
                kind="Run",
                warn=True,
                reason=f"{verdict.reason}, but no ARM client cancels here",
            ), False
        try:
            answer = self.parts.cancel(run.configuration, run.run_id[-14:])
        except DeliveryError as err:
            self.outcomes["cancel_failed"] += 1
            log.error(
                "the cancel of patch run %s failed: %s; it is tried again at the next tick "
                "until %s margin before its cut-off, or the run proceeds",
                run.run_id,
                err,
                self.rule.margin,
            )
            return replace(
                verdict,
                kind="Run",
                warn=True,
                reason=f"{verdict.reason}, but the cancel failed: {err}",
            ), True
        if not answer.done:
            self.outcomes["cancel_failed"] += 1
            log.error(
                "ARM refused the cancel of patch run %s: %s; the run proceeds",
                run.run_id,
                answer.said,
            )
            return replace(
                verdict,
                kind="Run",
                warn=True,
                reason=f"{verdict.reason}, but ARM refused it: {answer.said}",
            ), False
        self._mark(run.run_id, cancelled=True)
        return verdict, False

    def _mark(self, run_id: str, **fields: object) -> None:
        def mark(value: dict[str, Any]) -> bool:
            value.update(fields)
            return True

        self._held = None
        update(self.store, PATCHRUN, run_key(run_id), mark)

    def _note(self, run: RunView, verdict: PatchVerdict, value: Mapping[str, Any]) -> None:
        """Count, log and notify one new decision."""
        where = f"patch run {run.run_id[-14:]} of {run.configuration}"
        if verdict.kind == "Run" and not verdict.breaches:
            self.outcomes["fits"] += 1
            log.info("%s fits every budget: it runs, counted from %s", where, iso(run.start))
            return
        kind: NoticeKind
        if verdict.kind == "Ask":
            self.outcomes["asked"] += 1
            kind, target = "asked", self.rule.ask_target
            log.info("%s would break a budget: %s", where, verdict.reason)
        elif verdict.kind == "Cancel":
            self.outcomes["cancelled"] += 1
            kind, target = "patch_cancelled", "*"
            log.warning(
                "%s was cancelled: %s; %s", where, verdict.reason, "; ".join(verdict.breaches)
            )
        else:
            self.outcomes["too_late" if verdict.too_late else "over_budget"] += 1
            kind, target = "patch_over_budget", "*"
            log.warning(
                "%s runs over a budget: %s; %s", where, verdict.reason, "; ".join(verdict.breaches)
            )
        if self.parts.notices is not None:
            names, more = listed(sorted({name_of(r) for r in run.resources}))
            self.parts.notices.notify(
                Notice(
                    kind,
                    target,
                    subject(run),
                    "PatchRun",
                    names,
                    run.start,
                    (verdict.reason, *verdict.breaches),
                    value.get("answered_by"),
                    value.get("answer_reason"),
                    None,
                    self._now(),
                    more,
                )
            )

    def _record(
        self,
        run: RunView,
        verdict: PatchVerdict,
        explanation: Sequence[str],
        value: Mapping[str, Any],
    ) -> None:
        now = self._now()
        action: rt.DecisionAction = verdict.kind
        rid = record_id("Decision", run_key(run.run_id), action, verdict.reason)
        listed = _listed(run.resources)
        said = list(explanation)
        if len(listed) < len(run.resources):
            said.append(
                f"the run patches {len(run.resources)} resources; the record lists the first "
                f"{len(listed)}"
            )
        voice = self.parts.voice or Voice("(patch runs)", "")
        by = value.get("answered_by")
        record: rt.Decision = {
            **Origin(VmIdentity(), voice.host_name).common("Decision", rid, now),
            rt.RECORD_TYPE: "Decision",
            "EventId": subject(run),
            "EventType": "PatchRun",
            "EventSource": "UpdateManager",
            "DurationInSeconds": int((run.end - run.start).total_seconds()),
            "Resources": listed,
            "NotBefore": iso(run.start),
            "EventStatus": None,
            "DecisionAction": action,
            "DecisionRule": RULE,
            "DecisionReason": verdict.reason,
            "TargetVmId": None,
            "TargetVmName": None,
            "CommandId": None,
            "Attempt": 0,
            "PolicySource": voice.policy_source,
            "DecisionMode": "shadow" if voice.shadow else "normal",
            "DecisionExplanation": "\n".join(said) or None,
            "DecidedBy": value.get("answered_by_id"),
            "DecidedByName": str(by) if by else None,
            "OperatorReason": value.get("answer_reason"),
            "BudgetOverride": verdict.kind == "Run" and bool(verdict.breaches),
            "AskedTarget": self.rule.ask_target if verdict.kind == "Ask" else None,
            "AskDeadline": iso(verdict.deadline) if verdict.deadline else None,
            "NotifyFailing": None,
            "PauseScope": None,
            "PauseUntil": None,
        }
        self.parts.emit([record])


def asks_in(store: Store, rule: PatchRule) -> list[PatchAsk]:
    """The runs of `store` a person is asked about and has not answered, the soonest first:
    what the approval page and `se-bridge status --consumer` list (read only)."""
    asked = []
    for doc in store.scan(PATCHRUN):
        value = doc.value
        if not value.get("run_id") or value.get("decided") != "Ask" or value.get("answer"):
            continue
        run = _view(value)
        asked.append(
            PatchAsk(
                subject=subject(run),
                configuration=run.configuration,
                name=str(value.get("name") or run.run_id[-14:]),
                vms=int(value.get("vms") or 0),
                start=run.start,
                end=run.end,
                cutoff=run.cutoff,
                target=rule.ask_target or "",
                deadline=parse_time(value.get("deadline")),
                on_deadline=rule.on_deadline,
                breaches=tuple(str(b) for b in value.get("breaches") or ()),
            )
        )
    return sorted(asked, key=lambda a: (a.start, a.subject))


def _counted(run: RunView, index: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """What `run` counts: its known VMs' VmIds and the names of the others."""
    known, unknown = members(run.resources, index, run.whole)
    return known | frozenset(unknown)


# What a Decision record lists of a run's resources: a Log Analytics column keeps 64 KB and a
# Logs Ingestion call takes 1 MB, and a run of 10,000 instances is about 1.5 MB of ids.
RECORDED_CHARS = 30_000


def _listed(resources: Iterable[str]) -> list[str]:
    """The first of `resources` (sorted) that fit RECORDED_CHARS of JSON."""
    listed: list[str] = []
    size = 2
    for resource in sorted(resources):
        size += len(resource) + 4
        if size > RECORDED_CHARS:
            break
        listed.append(resource)
    return listed


def _places(
    run: RunView, others: Sequence[RunView], index: Mapping[str, frozenset[str]]
) -> dict[str, Scope | None]:
    """Where the names of VMs no agent reports of `run` and of the runs overlapping it are;
    a name two runs place apart may be either: where it is, unknown (counted everywhere)."""
    found = places(run, index)
    for other in others:
        for name, scope in places(other, index).items():
            found[name] = scope if found.get(name, scope) == scope else None
    return found


def _unread(run: RunView, budgets: Sequence[Budget]) -> list[str]:
    """A line per budget for the scale sets whose instances could not be read: how many VMs
    they hold is not known, so the run is taken to break every budget (the worst case)."""
    if not run.unread:
        return []
    names = ", ".join(sorted(r.rpartition("/")[2] for r in run.unread))
    return [
        f"budget {budget.name}: the instances of scale set {names} could not be read through "
        "Resource Graph: counted as more than its limit (worst case)"
        for budget in budgets
    ]


def _view(value: Mapping[str, Any]) -> RunView:
    start, end = parse_time(value.get("start")), parse_time(value.get("end"))
    assert start is not None  # written by `_pre` alone
    assert end is not None
    resources, placed = read_resources(value)
    return RunView(
        str(value["run_id"]),
        str(value.get("configuration", "")),
        start,
        end,
        parse_time(value.get("cutoff")),
        resources,
        parse_time(value.get("post_at")),
        bool(value.get("cancelled")),
        frozenset(str(r) for r in value.get("whole") or ()),
        frozenset(str(r) for r in value.get("unread") or ()),
        placed,
    )


# A run's resources as its document keeps them: grouped by subscription and resource group, each
# a short tail (`v:NAME` a VM, `v:NAME@SET` one Resource Graph placed in scale set SET, `v:NAME@`
# in none, `s:SET` a scale set, `i:SET/N` a Uniform set's instance), so that a run of
# MAX_INSTANCES instances stays far inside a fleet state document (MAX_VALUE_CHARS: Table
# Storage's 1 MiB entity); as full ids, 10,000 instances and their places took about 3 MB.
_PROVIDER = "/providers/microsoft.compute/"


def stored_resources(resources: Iterable[str], placed: Mapping[str, str]) -> dict[str, Any]:
    """`resources` and `placed` as a run's document keeps them (`read_resources`)."""
    compute: dict[str, list[str]] = {}
    other: list[str] = []
    for resource in sorted(resources):
        head, found, tail = resource.partition(_PROVIDER)
        parts = head.split("/")
        kind = tail.split("/")
        if not found or len(parts) != 5 or "@" in tail or ":" in tail:
            other.append(resource)
            continue
        where = f"{parts[2]}/{parts[4]}"
        if len(kind) == 2 and kind[0] == "virtualmachines":
            short = f"v:{kind[1]}" + (f"@{placed[resource]}" if resource in placed else "")
        elif len(kind) == 2 and kind[0] == "virtualmachinescalesets":
            short = f"s:{kind[1]}"
        elif (
            len(kind) == 4 and kind[0] == "virtualmachinescalesets" and kind[2] == "virtualmachines"
        ):
            short = f"i:{kind[1]}/{kind[3]}"
        else:
            other.append(resource)
            continue
        compute.setdefault(where, []).append(short)
    return {"compute": compute, "resources": other, "placed": {
        r: placed[r] for r in other if r in placed}}  # fmt: skip


def read_resources(value: Mapping[str, Any]) -> tuple[frozenset[str], dict[str, str]]:
    """A run's resources and where Resource Graph placed its VMs, as `stored_resources` kept
    them (a document of an earlier release keeps `resources` and `placed` as they are)."""
    resources = {str(r) for r in value.get("resources") or ()}
    placed = {str(k): str(v) for k, v in (value.get("placed") or {}).items()}
    for where, shorts in (value.get("compute") or {}).items():
        sub, _, group = str(where).partition("/")
        base = f"/subscriptions/{sub}/resourcegroups/{group}{_PROVIDER}"
        for short in shorts:
            kind, _, rest = str(short).partition(":")
            if kind == "v":
                name, at, scale_set = rest.partition("@")
                resource = f"{base}virtualmachines/{name}"
                if at:
                    placed[resource] = scale_set
            elif kind == "s":
                resource = f"{base}virtualmachinescalesets/{rest}"
            else:
                scale_set, _, number = rest.partition("/")
                resource = f"{base}virtualmachinescalesets/{scale_set}/virtualmachines/{number}"
                placed[resource] = scale_set
            resources.add(resource)
    return frozenset(resources), placed

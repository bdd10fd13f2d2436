"""What must hold after a chaos run, and the report that says so.

Each check returns problems (sentences naming what broke) and adds its numbers to the report.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bridge.consumer import documents as fs
from bridge.consumer.ledger import read_ledger
from bridge.consumer.state.sqlite import SqliteStore
from bridge.localhub import PARTITIONS, LocalHub
from bridge.records import iso
from bridge.simulator.fleet import EventSpec
from tests.chaos.rig import BUDGET, SCALE_SETS, allowed, scale_set_of
from tests.chaos.twins import Twins

Record = dict[str, Any]
TERMINAL = ("Completed", "Canceled")


@dataclass
class Report:
    numbers: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # Scale sets whose budget an event that ended with VmId null holds (said with the problem).
    stuck_sets: set[str] = field(default_factory=set)

    def add(self, problems: Iterable[str]) -> None:
        assert not isinstance(problems, str), "add() takes problems, not one: use problems.append"
        self.problems.extend(problems)

    def text(self) -> str:
        lines = ["se-bridge chaos report", *(f"  {k}: {v}" for k, v in self.numbers.items())]
        lines.append(f"  violations: {len(self.problems)}")
        lines += [f"    - {p}" for p in self.problems[:200]]
        return "\n".join(lines)


def read_jsonl(path: Path) -> tuple[list[bytes], list[Record]]:
    data = path.read_bytes() if path.exists() else b""
    lines = [line for line in data.split(b"\n")[:-1] if line.strip()]
    return lines, [json.loads(line) for line in lines]


def hub_records(hub_dir: Path) -> list[Record]:
    with LocalHub(hub_dir) as hub:
        return [json.loads(body) for p in range(PARTITIONS) for _, body in hub.read(p, -1, 10**7)]


# --- every record in every sink -------------------------------------------------------------


def check_delivery(
    report: Report, jsonl: Mapping[str, Path], sinks: Mapping[str, list[Record]]
) -> None:
    """Every record an agent wrote reaches every sink; a duplicate is the same record again."""
    written: dict[str, Record] = {}
    for vm, path in jsonl.items():
        lines, records = read_jsonl(path)
        report.add(_same_bytes(vm, lines, records))
        written.update((r["RecordId"], r) for r in records)
        report.numbers[f"records {vm} (jsonl lines, unique)"] = (
            f"{len(lines)}, {len({r['RecordId'] for r in records})}"
        )
    for name, records in sinks.items():
        by_id: dict[str, list[Record]] = defaultdict(list)
        for record in records:
            by_id[record["RecordId"]].append(record)
        missing = set(written) - set(by_id)
        extra = set(by_id) - set(written)
        differ = [
            rid
            for rid, rs in by_id.items()
            if rid in written and any(_core(r) != _core(written[rid]) for r in rs)
        ]
        report.numbers[f"sink {name} (records, duplicates)"] = (
            f"{len(records)}, {len(records) - len(by_id)}"
        )
        report.add(f"{name}: missing {rid} {_brief(written[rid])}" for rid in sorted(missing)[:20])
        report.add(f"{name}: {rid} is in no agent's jsonl" for rid in sorted(extra)[:20])
        report.add(f"{name}: {rid} differs from the jsonl record" for rid in differ[:20])


def _core(record: Record) -> Record:
    # A sink may add its own columns (Log Analytics' ingestion time); the record's are compared.
    return {k: v for k, v in record.items() if not k.startswith("_")}


def _same_bytes(vm: str, lines: list[bytes], records: list[Record]) -> list[str]:
    variants: dict[str, set[bytes]] = defaultdict(set)
    for line, record in zip(lines, records, strict=True):
        variants[record["RecordId"]].add(line)
    return [f"{vm}: RecordId {rid} was written as {len(v)} different lines"
            for rid, v in variants.items() if len(v) > 1]  # fmt: skip


def _brief(record: Record) -> str:
    keys = ("RecordType", "VmName", "EventId", "Transition", "HeartbeatReason", "TimeGenerated")
    return json.dumps({k: record.get(k) for k in keys if record.get(k) is not None})


# --- transitions ----------------------------------------------------------------------------

NEXT: dict[str | None, set[str]] = {
    None: {"Scheduled", "Started"},
    "Scheduled": {"Updated", "Started", "Completed", "Canceled"},
    "Updated": {"Updated", "Started", "Completed", "Canceled"},
    "Started": {"Updated", "Completed"},
}


def check_transitions(
    report: Report, jsonl: Mapping[str, Path], events: Mapping[str, Record]
) -> None:
    """Per VM and event: a lawful sequence, ended, and ended the way the event really ended."""
    count = 0
    for vm, path in jsonl.items():
        seen: dict[str, list[Record]] = defaultdict(list)
        ids: set[str] = set()
        for record in read_jsonl(path)[1]:
            if record["RecordType"] == "Event" and record["RecordId"] not in ids:
                ids.add(record["RecordId"])
                seen[record["EventId"]].append(record)
        for event_id, records in seen.items():
            count += len(records)
            report.add(_sequence(vm, events.get(event_id), event_id, records))
    report.numbers["event transitions (unique, all VMs)"] = count


def _sequence(vm: str, event: Record | None, event_id: str, records: list[Record]) -> list[str]:
    name = f"{vm}: event {event_id}"
    if event is None:
        return [f"{name}: the simulator never made this event"]
    transitions = [r["Transition"] for r in records]
    previous: str | None = None
    for transition in transitions:
        if transition not in NEXT.get(previous, set()):
            return [f"{name}: {transition} after {previous} in {transitions}"]
        previous = transition
    if transitions[-1] not in TERMINAL:
        return [f"{name}: never ended ({transitions}); the simulator says {event['status']}"]
    last = records[-1]
    if event["status"] == "Canceled" and last["Transition"] == "Completed":
        return [f"{name}: Completed, but it was canceled without ever starting"]
    if event["status"] == "Completed" and last["Transition"] == "Canceled" and not last["Inferred"]:
        return [f"{name}: Canceled (not inferred), but it ran and completed"]
    return []


# --- approvals and budgets -------------------------------------------------------------------


def check_approvals(report: Report, specs: Mapping[str, EventSpec], approvals: list[Record],
                    decisions: list[Record], agent_records: list[Record]) -> None:  # fmt: skip
    """Only what the policy allows, each event once; every approval traces back to a decision."""
    accepted = [a for a in approvals if a["status"] == 200]
    per_event = Counter(str(a["eventId"]).lower() for a in accepted)
    report.numbers["approvals received by IMDS (POSTs, events)"] = (
        f"{len(approvals)}, {len(per_event)}"
    )
    report.numbers["events made (allowed by policy, held)"] = (
        f"{len(specs)} ({sum(allowed(s) for s in specs.values())}, "
        f"{sum(not allowed(s) for s in specs.values())})"
    )
    by_key = {k.lower(): s for k, s in specs.items()}
    report.add(
        f"IMDS received StartRequests for {e} {n} times" for e, n in per_event.items() if n > 1
    )
    report.add(f"approved {e}, which the policy does not allow ({by_key[e].event_source} "
               f"{by_key[e].event_type} of {list(by_key[e].resources)})"
               for e in per_event if e in by_key and not allowed(by_key[e]))  # fmt: skip
    report.add(
        f"approved {e}, an event the script never made" for e in per_event if e not in by_key
    )
    faulted = sum(a["status"] != 200 for a in approvals)
    report.numbers["approval POSTs answered with an injected fault (retried)"] = faulted
    approves = [d for d in decisions if d.get("DecisionAction") == "Approve"]
    decided = {str(d["EventId"]).lower() for d in approves}
    report.numbers["Approve decisions (records, events)"] = f"{len(approves)}, {len(decided)}"
    report.add(
        f"IMDS received an approval of {e} that no Approve decision explains"
        for e in per_event
        if e not in decided
    )
    for decision in approves:
        spec = by_key.get(str(decision["EventId"]).lower())
        if spec is not None and not allowed(spec):
            rule = decision.get("DecisionRule")
            report.problems.append(f"Approve decision for {decision['EventId']} by {rule}: held")
    approved_records = {
        str(r["EventId"]).lower()
        for r in agent_records
        if r["RecordType"] == "Approval" and r.get("ApprovalOutcome") == "Approved"
    }
    report.add(
        f"an agent recorded approving {e}, but IMDS never received it"
        for e in approved_records - set(per_event)
    )


def check_budgets(
    report: Report, specs: Mapping[str, EventSpec], events: Mapping[str, Record]
) -> None:
    """At every approval, the VMs impacted in its scale set, itself included, fit the budget."""
    spans: dict[str, list[tuple[float, float, str, frozenset[str]]]] = defaultdict(list)
    for event_id, event in events.items():
        begin = (
            min(t for t in (event["approvedAt"], event["startedAt"]) if t is not None)
            if (event["approvedAt"] or event["startedAt"])
            else None
        )
        if begin is None:
            continue
        end = event["endedAt"] if event["endedAt"] is not None else float("inf")
        for scale_set in {scale_set_of(vm) for vm in event["resources"]}:
            vms = frozenset(vm for vm in event["resources"] if scale_set_of(vm) == scale_set)
            spans[scale_set].append((begin, end, event_id, vms))
    worst = 0
    for scale_set, items in spans.items():
        for begin, _, event_id, vms in items:
            at_once = set(vms).union(
                *(v for b, e, other, v in items if other != event_id and b <= begin < e)
            )
            worst = max(worst, len(at_once))
            if events[event_id]["approvedAt"] is not None and len(at_once) > BUDGET:
                report.problems.append(
                    f"budget exceeded in scale set {scale_set}: approving {event_id} made "
                    f"{sorted(at_once)} impacted at once (budget {BUDGET})"
                )
    report.numbers["budget: most VMs impacted at once in one scale set"] = (
        f"{worst} (budget {BUDGET}, {len(SCALE_SETS)} scale sets)"
    )


# --- the consumer's state --------------------------------------------------------------------


def check_consumer_state(
    report: Report,
    fleet_db: Path,
    events: Mapping[str, Record],
    jsonl: Mapping[str, Path],
    twins: Twins | None = None,
) -> None:
    """After the fleet went quiet: nothing held in the ledger, every event Gone (or, a deleted
    twin's Preempt, released), none unknown."""
    store = SqliteStore(fleet_db)
    try:
        held = dict(read_ledger(store).events)
        docs = store.scan(fs.EVENT)
    finally:
        store.close()
    known = {k.lower() for k in events} | (twins.event_ids() if twins else set())
    released = {e.lower() for e in twins.released()} if twins else set()
    unattributed = _ended_without_vm_id(jsonl)
    report.numbers["consumer state (event documents, ledger entries)"] = f"{len(docs)}, {len(held)}"
    for key, entry in held.items():
        text = f"the ledger still holds {key} ({json.dumps(entry)[:300]}) after every event ended"
        if key in unattributed:
            report.problems.append(f"{text}: a VM reported its end with VmId null")
            resources = events[_sim_key(events, key)]["resources"]
            report.stuck_sets.update(scale_set_of(vm) for vm in resources)
        else:
            report.problems.append(text)
    for doc in docs:
        state = fs.status(fs.event_document(doc))
        if state == fs.GONE or (doc.key in released and doc.value.get("released")):
            continue
        text = f"the consumer's event {doc.key} is {state}, but the event ended"
        if doc.key in unattributed:
            report.problems.append(f"{text}: a VM reported its end with VmId null")
        else:
            report.problems.append(text)
    report.add(
        f"the consumer knows an event {doc.key} the simulator never made"
        for doc in docs
        if doc.key not in known
    )


def check_twins(
    report: Report, twins: Twins, decisions: list[Record], consumer_dir: Path, fleet_db: Path
) -> None:
    """The messy-fleet faults (tests/chaos/twins): poison set aside, no name taken for the
    VM of another scope, deleted VMs' slots released, a clock a year ahead clamped."""
    poison_file = consumer_dir / "poison.jsonl"
    dead = poison_file.read_text(encoding="utf-8") if poison_file.exists() else ""
    dead = dead.replace('\\"', '"')  # each body is kept as JSON text inside a JSON line
    report.add(f"the poison record {rid} was not set aside in {poison_file}"
               for rid in twins.poison_ids if f'"{rid}"' not in dead)  # fmt: skip
    twin_ids = {o.identity.vm_id for o in twins.records.origins.values()}
    twin_events = twins.event_ids()
    for decision in decisions:
        target, event = decision.get("TargetVmId"), str(decision["EventId"]).lower()
        if target is not None and (target in twin_ids) != (event in twin_events):
            report.problems.append(f"the approval of {decision['EventId']} went to {target}, "
                                   "a VM of the other scale set of the same name")  # fmt: skip
    report.add(f"the approval of {d['EventId']} went to the mole, a VM of another subscription "
               "that claimed the event"
               for d in decisions if d.get("TargetVmId") == twins.mole)  # fmt: skip
    said = {str(d["EventId"]).lower() for d in decisions if d.get("DecisionAction") == "Release"}
    report.add(f"the deleted twin's Preempt {e} was never released"
               for e in twins.released() if e.lower() not in said)  # fmt: skip
    if twins.future_vm is not None:
        store = SqliteStore(fleet_db)
        try:
            doc = store.read(fs.VM, twins.future_vm)
        finally:
            store.close()
        limit = iso(datetime.now(timezone.utc) + timedelta(minutes=5))
        if doc is not None and str(doc.value.get("last_seen")) > limit:
            report.problems.append(f"a record dated a year ahead was kept as {doc.value}")
    report.numbers["messy fleet (twin events, poison, releases)"] = (
        f"{dict(sorted(twins.made.items()))}, {len(twins.poison_ids)}, "
        f"{len(said & {e.lower() for e in twins.released()})}"
    )


def _sim_key(events: Mapping[str, Record], key: str) -> str:
    return next(k for k in events if k.lower() == key)


def add_unapproved(report: Report, stuck: Mapping[str, str]) -> None:
    """An allowed event never approved: a violation, and said why when an event that ended
    with VmId null holds its scale set's budget."""
    for problem, scale_set in stuck.items():
        why = " (budget held by an event ended with VmId null)"
        report.problems.append(problem + (why if scale_set in report.stuck_sets else ""))


def _ended_without_vm_id(jsonl: Mapping[str, Path]) -> set[str]:
    """Events whose end some agent recorded before it knew its VmId (test_known_bugs.py)."""
    return {
        fs.event_key(r["EventId"])
        for path in jsonl.values()
        for r in read_jsonl(path)[1]
        if r["RecordType"] == "Event" and r["Transition"] in TERMINAL and r["VmId"] is None
    }


def check_planted(planted: list[Path], victim: Path) -> list[str]:
    """A hostile entry in a command channel is skipped, never removed, and what a link in it
    points at is never read away, renamed or deleted (bridge.channels.local)."""
    problems = [f"{path} was removed or renamed by an agent" for path in planted
                if not os.path.lexists(path)]  # fmt: skip
    if planted and [p.name for p in victim.iterdir()] != ["precious.json"]:
        problems.append(f"the victim directory {victim} was changed: {sorted(victim.iterdir())}")
    if planted and (victim / "precious.json").read_text(encoding="utf-8") != '{"keep": true}':
        problems.append("the victim file a planted link points at was changed")
    return problems

"""A people desk for the approval page's tests, behaving as PeopleDesk.operate does at its
edges: an event must be open and its Resources digest the one shown; a pause, a resume and an
override need a reason; every accepted action is kept with who took it."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from bridge.commands.message import resources_digest
from bridge.consumer.people.desk import Answer, OpenEvent, PatchAsk
from bridge.consumer.people.operatorlog import OperatorAction
from bridge.policy.model import Pause, Person

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=timezone.utc)


def open_event(event_id: str, *vms: str, ask: str | None = None) -> OpenEvent:
    shown: dict[str, Any] = {
        "event_id": event_id,
        "event_type": "Reboot",
        "vms": vms,
        "not_before": NOW + timedelta(minutes=15),
        "explanation": (
            f"rule <ask db owners>: ask {ask or 'nobody'}",
            "budget zones: 1 of 2 used",
        ),
        "ask": ask,
        "resources_digest": resources_digest(vms),
    }
    # What the consumer's OpenEvent says besides (the policy's action and rule, the ask as
    # values, a person's last decision, the pause that stops it): the page shows none of it.
    besides: dict[str, Any] = {"event_source": None, "resources": vms, "action": "Ask",
                               "rule": "ask db owners", "reason": "asked", "asked": None,
                               "person": None, "pause": None}  # fmt: skip
    names = {f.name for f in fields(OpenEvent)}
    return OpenEvent(**shown, **{k: v for k, v in besides.items() if k in names})


def patch_ask(subject: str) -> PatchAsk:
    """A patch run of 4 VMs over a budget of one, asked about until 5 minutes before its
    cut-off."""
    config = subject[len("(patch:") :].split("/", maxsplit=1)[0]
    return PatchAsk(
        subject=subject,
        configuration=f"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Maintenance/"
        f"maintenanceConfigurations/{config}",
        name=subject.rstrip(")").rpartition("/")[2],
        vms=4,
        start=NOW + timedelta(minutes=30),
        end=NOW + timedelta(hours=3),
        cutoff=NOW + timedelta(minutes=20),
        target="ops",
        deadline=NOW + timedelta(minutes=16),
        on_deadline="run",
        breaches=("budget one-at-a-time: 4 of 1 VMs of scale_set web",),
    )


@dataclass
class RecordingDesk:
    events: dict[str, OpenEvent] = field(default_factory=dict)
    taken: list[OperatorAction] = field(default_factory=list)
    paused: list[Pause] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Patch runs asked about, by `(patch:CONFIG/RUN)`, and the answers taken (issue 40).
    patch_asks: set[str] = field(default_factory=set)
    patch_answers: list[tuple[str, str, str, str]] = field(default_factory=list)
    patch_shown: list[PatchAsk] = field(default_factory=list)  # what the page lists of them

    def ask_patch(self, subject: str) -> None:
        """Ask about the patch run `subject` (`(patch:CONFIG/RUN)`), as `patch_ask` shows it."""
        self.patch_asks.add(subject)
        self.patch_shown.append(patch_ask(subject))

    def patch_runs_asked(self, now: datetime) -> list[PatchAsk]:
        with self.lock:
            return [a for a in self.patch_shown if a.subject in self.patch_asks]

    def answer_patch_run(self, run: str, said: str, by: Person, reason: str) -> Answer:
        with self.lock:
            if not reason:
                return Answer(False, "NoReason", "say why")
            if run not in self.patch_asks:
                return Answer(False, "NotAsked", f"nobody is asked about {run}")
            self.patch_asks.discard(run)
            self.patch_answers.append((run, said, by.object_id, reason))
            return Answer(True, "Accepted", f"decided: {said}")

    def operate(self, action: OperatorAction) -> Answer:
        with self.lock:
            answer = self._check(action)
            if answer.accepted:
                self.taken.append(action)
                self._apply(action)
            return answer

    def _check(self, action: OperatorAction) -> Answer:
        needs_reason = action.kind in ("pause", "resume") or action.override_budget
        if needs_reason and not action.reason:
            return Answer(False, "NoReason", f"a {action.kind} needs a reason")
        if action.kind in ("pause", "resume"):
            return Answer(True, "Accepted", f"{action.kind} of {action.scope or 'the fleet'}")
        event = self.events.get(action.event_id or "")
        if event is None:
            return Answer(False, "NotOpen", f"event {action.event_id} is not open")
        if action.resources_digest != event.resources_digest:
            return Answer(False, "ResourcesChanged", "its VMs changed since the page showed them")
        verb = "approved" if action.kind == "approve" else "held"
        return Answer(True, "Accepted", f"{verb} {event.event_id} by {action.by.name}")

    def _apply(self, action: OperatorAction) -> None:
        if action.kind == "pause":
            self.paused.append(
                Pause(action.scope, action.until, action.by, action.reason, action.at)
            )
        elif action.kind == "resume":
            self.paused = [p for p in self.paused if p.scope != action.scope]
        elif action.event_id in self.events:
            said = "approved" if action.kind == "approve" else "held"
            event = self.events[action.event_id]
            self.events[action.event_id] = replace(event, ask=f"{said} by {action.by.name}")

    def open_events(self, now: datetime) -> list[OpenEvent]:
        with self.lock:
            return list(self.events.values())

    def pauses(self, now: datetime) -> list[Pause]:
        with self.lock:
            return list(self.paused)

    def budget_use(self) -> dict[str, float]:
        return {"zones": 0.5}

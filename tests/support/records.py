"""Shared test helpers: the record schema validator and the seed documents."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker

from bridge import recordtypes as rt
from bridge import schema
from bridge.commands.message import Command
from bridge.records import Origin, RecordView, VmIdentity
from bridge.retry import RetryableError

DATA = Path(__file__).resolve().parents[1] / "data"


def seed(name: str) -> Any:
    """A real IMDS document from the seeds, decoded exactly as the agent decodes it."""
    return json.loads((DATA / "seeds" / name).read_text(encoding="utf-8"))


_VALIDATOR = Draft202012Validator(schema.load(), format_checker=FormatChecker())


def assert_valid(record: RecordView) -> None:
    """Fail with every schema violation of `record`, not just the first."""
    errors = sorted(_VALIDATOR.iter_errors(record), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
ORIGIN = Origin(
    VmIdentity(vm_id="0000000a-0000-4000-8000-000000000001", vm_name="WestNO_0"), host_name="host-a"
)
T0 = datetime(2022, 4, 11, 22, 10, 0, tzinfo=timezone.utc)


def common_fields(
    origin: Origin, record_type: rt.RecordType, record_id: str, now: datetime
) -> dict[str, Any]:
    """`Origin.common` as a plain dict, for a record built field by field (a test's record,
    which may be malformed on purpose); the product's builders return their TypedDict."""
    return dict(origin.common(record_type, record_id, now))


def event_record(
    transition: str = "Scheduled",
    *,
    previous: str | None = None,
    affects: bool | None = True,
    changed: tuple[str, ...] = (),
    rid: str = "rec-1",
    event_id: str = EVENT_ID,
    **extra: Any,
) -> dict[str, Any]:
    """An Event record shaped as the normaliser writes it, for tests of what consumes records."""
    status = {"Scheduled": "Scheduled", "Started": "Started"}.get(transition, previous)
    if transition in ("Completed", "Canceled"):
        status = None
    record = common_fields(ORIGIN, "Event", rid, T0)
    record.update(
        DocumentIncarnation=3,
        PreviousIncarnation=None if previous is None else 2,
        EventId=event_id,
        EventType="Reboot",
        ResourceType="VirtualMachine",
        Resources=["WestNO_0", "WestNO_1"],
        EventSource="Platform",
        Description="Virtual machine is going to be restarted as requested by authorized user.",
        DurationInSeconds=-1,
        EventStatus=status,
        PreviousStatus=previous,
        Transition=transition,
        NotBefore="2022-04-11T22:26:58.000Z",
        NotBeforeRaw="Mon, 11 Apr 2022 22:26:58 GMT",
        AffectsThisVm=affects,
        Inferred=False,
        ChangedFields=list(changed),
    )
    record.update(extra)
    return record


class Sender:
    """A command channel's sending end that records the commands; can be told to fail the
    next sends (`failures`)."""

    def __init__(self) -> None:
        self.sent: list[Command] = []
        self.ttls: list[float] = []  # each sent command's time to live, in seconds
        self.failures = 0

    def send(self, command: Command, time_to_live: float) -> None:
        assert time_to_live >= 1
        if self.failures:
            self.failures -= 1
            raise RetryableError("queue unreachable")
        self.sent.append(command)
        self.ttls.append(time_to_live)

    def close(self) -> None:
        pass

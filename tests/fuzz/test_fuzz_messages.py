"""Fuzzing what arrives over the wire between the parts: command messages at the agent and
record messages at the consumer.

Properties: `commands.parse` returns a Command or raises CommandError, nothing else; a message
body becomes a record or NotARecord (which sets it aside as poison); and the consumer core takes
any JSON object that passed that check without raising, since an exception there fails the
whole batch, which is retried and never skipped: one bad record would stall its partition.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bridge.commands.message import Command, CommandError, approve, parse
from bridge.config import ConsumerSettings
from bridge.consumer.core import Consumer
from bridge.consumer.sources.batches import NotARecord, parse_record
from bridge.consumer.state.sqlite import SqliteStore
from bridge.policy.model import Action, Budget, Match, Policy, Rule
from tests.fuzz.strategies import DEEP_JSON, FUZZ, NASTY_TEXT, as_json_bytes, json_values, mutations
from tests.support.fleetrecords import FleetRecords

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=timezone.utc)
EVENT_ID = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
VM_ID = "1b1f7c1e-0000-4000-8000-000000000001"

# A command as the consumer sends it:
#   {"SchemaVersion":1,"CommandId":"3d0c...","Type":"Approve","VmId":"1b1f7c1e-...",
#    "EventId":"C7061BAC-...","DocumentIncarnation":3,"IssuedAt":"2026-11-21T10:00:00.000Z",
#    "ExpiresAt":"2026-11-21T10:15:00.000Z","Rule":"user-initiated","Reason":"..."}
SAMPLE_COMMAND = approve(
    event_id=EVENT_ID,
    vm_id=VM_ID,
    document_incarnation=3,
    issued_at=T0,
    expires_at=T0 + timedelta(minutes=15),
    rule="user-initiated",
    reason="rule user-initiated (approve); approval sent through web_0",
)
SAMPLE_BODY = json.loads(SAMPLE_COMMAND.to_json())

near_commands = st.builds(
    lambda changes, drop: {
        **{k: v for k, v in SAMPLE_BODY.items() if k not in drop},
        **changes,
    },
    st.dictionaries(
        st.sampled_from([*SAMPLE_BODY, "Signature", "KeyId"]), json_values | NASTY_TEXT, max_size=4
    ),
    st.sets(st.sampled_from(list(SAMPLE_BODY)), max_size=3),
)
command_texts = (
    near_commands.map(json.dumps)
    | st.text(max_size=200)
    | json_values.map(json.dumps)
    | mutations([SAMPLE_COMMAND.to_json().encode()]).map(lambda b: b.decode("utf-8", "replace"))
)
command_bytes = st.binary(max_size=200) | mutations([SAMPLE_COMMAND.to_json().encode()])


def assert_message(err: Exception) -> None:
    assert str(err), f"{type(err).__name__} without a message"


def parses_or_refuses(text: str | bytes) -> Command | None:
    try:
        command = parse(text)
    except CommandError as err:
        problem = str(err)
    else:
        assert command.vm_id.strip()
        assert command.event_id.strip()
        assert command.command_id.strip()
        assert command.issued_at.utcoffset() == timedelta(0)
        assert command.expires_at.utcoffset() == timedelta(0)
        return command
    assert problem
    return None


def test_the_sample_command_parses() -> None:
    # Without this, a parser that refused everything would pass the fuzz tests below.
    command = parses_or_refuses(SAMPLE_COMMAND.to_json())
    assert command is not None
    assert command.event_id == EVENT_ID


@FUZZ
@given(text=command_texts)
@example(text=SAMPLE_COMMAND.to_json().replace("10:15:00.000Z", "9999-12-31T23:59:59-05:00"))
@example(text=DEEP_JSON[0])
@example(text=DEEP_JSON[1])
def test_any_command_text_is_a_command_or_a_command_error(text: str) -> None:
    parses_or_refuses(text)


def test_a_lone_surrogate_is_a_command_error() -> None:
    text = SAMPLE_COMMAND.to_json().replace('"Rule":"user-initiated"', '"Rule":"\\ud800"')
    assert "\\ud800" in text
    with pytest.raises(CommandError):
        parse(text)


@FUZZ
@given(data=command_bytes)
@example(data=b"\xff\xfe" + SAMPLE_COMMAND.to_json().encode("utf-16-le"))
def test_any_command_bytes_are_a_command_or_a_command_error(data: bytes) -> None:
    parses_or_refuses(data)


# --- records at the consumer ---------------------------------------------------------------

RECORDS = FleetRecords(T0)
RECORDS.vm("web_0", scale_set="web", zone="1", tags={"tier": "web"})
SAMPLE_RECORDS = [
    RECORDS.event("web_0", EVENT_ID),
    RECORDS.event("web_0", EVENT_ID, transition="Started"),
    RECORDS.heartbeat("web_0"),
    RECORDS.heartbeat("web_0", "Stop"),
]


@FUZZ
@given(
    body=st.text(max_size=200)
    | json_values.map(json.dumps)
    | mutations([json.dumps(r).encode() for r in SAMPLE_RECORDS]).map(
        lambda b: b.decode("utf-8", "replace")
    )
)
@example(body=DEEP_JSON[0])
@example(body=DEEP_JSON[2])
def test_any_message_body_is_a_record_or_not_a_record(body: str) -> None:
    try:
        record = parse_record(body)
    except NotARecord as err:
        assert_message(err)
        return
    assert isinstance(record, dict)


POLICY = Policy(
    rules=(
        Rule("user-initiated", Match(event_sources=frozenset({"user"})), Action("approve")),
        Rule("everything-else", Match(), Action("hold")),
    ),
    budgets=(Budget("one-per-scale-set", "scale_set", max_vms=1),),
)


class Sent:
    def __init__(self) -> None:
        self.commands: list[Command] = []

    def send(self, command: Command, time_to_live: float) -> None:
        self.commands.append(command)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def consumer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consumer]:
    # One store for every example: what earlier (bad) records left must not break later ones.
    path = Path(tmp_path_factory.mktemp("fuzz-consumer")) / "fleet.db"
    core = Consumer(SqliteStore(path), Sent(), POLICY, lambda _: None, ConsumerSettings(),
                    now=lambda: RECORDS.now)  # fmt: skip
    yield core
    core.close()


_RECORD_KEYS = sorted({k for r in SAMPLE_RECORDS for k in r})
near_records = st.builds(
    lambda base, changes, drop: {
        **{k: v for k, v in base.items() if k not in drop},
        **changes,
    },
    st.sampled_from(SAMPLE_RECORDS),
    st.dictionaries(st.sampled_from(_RECORD_KEYS), json_values | NASTY_TEXT, max_size=3),
    st.sets(st.sampled_from(_RECORD_KEYS), max_size=3),
)


@FUZZ
@given(batch=st.lists(near_records | st.dictionaries(st.text(max_size=10), json_values),
                      min_size=1, max_size=4))  # fmt: skip
def test_the_consumer_takes_any_json_object_without_raising(
    consumer: Consumer, batch: list[dict[str, Any]]
) -> None:
    for record in batch:
        parse_record(json.dumps(record))  # what reaches the consumer passed this check
    consumer.process(batch)
    consumer.tick()


def test_json_of_a_record_round_trips() -> None:
    for record in SAMPLE_RECORDS:
        assert parse_record(as_json_bytes(record).decode()) == record

"""`policy explain --records FILE` reads what a user exports (issue 39, item 4): an agent's
jsonl, or the rows a Log Analytics query exported with az; and says what a record lacks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bridge.config import ConfigError
from bridge.consumer.explain import _json_line, read_records
from tests.support.laexport import az_rows, every_column
from tests.support.records import ORIGIN, T0, common_fields, event_record


def heartbeat() -> dict[str, object]:
    record = common_fields(ORIGIN, "Heartbeat", "beat-1", T0)
    record.update(DocumentIncarnation=None, HeartbeatReason="Start", PendingEvents=0,
                  SpoolDepth=0, SpoolDroppedRecords=0, ImdsHealthy=False,
                  LastImdsSuccess=None, HasPrepareHook=False, Tags=None)  # fmt: skip
    return record


def _write(tmp_path: Path, values: object) -> Path:
    path = tmp_path / "records.json"
    path.write_text(json.dumps(values, indent=2), encoding="utf-8")
    return path


def test_an_export_of_every_column_reads_as_the_records_themselves(tmp_path: Path) -> None:
    records = [heartbeat(), event_record(PreviousStatus=None, Description="")]
    read = read_records(_write(tmp_path, az_rows(records, every_column())))
    # A field a record may leave out is a column of the table all the same: it reads as null.
    nodes = dict.fromkeys(("PrepareSteps", "NodeName", "NodePool", "NodeDraining",
                           "NodeCordoned"))  # fmt: skip
    assert read == [
        heartbeat() | nodes,
        # Kusto has no null string: an empty Description reads as none.
        event_record(PreviousStatus=None, Description=None),
    ]


def test_a_few_columns_are_refused_naming_what_is_missing(tmp_path: Path) -> None:
    """The query getting-started shows to look at the records keeps five columns."""
    five = ["TimeGenerated", "RecordType", "EventType", "Transition", "HeartbeatReason"]
    path = _write(tmp_path, az_rows([event_record()], five))
    with pytest.raises(ConfigError) as refused:
        read_records(path)
    said = str(refused.value)
    assert "record 1 lacks" in said, said
    for field in ("EventId", "VmId", "Resources", "EventStatus", "NotBefore", "RecordId"):
        assert field in said, (field, said)
    assert "TimeGenerated" not in said.split("lacks", 1)[1]
    assert "every column" in said
    assert "is not a record" not in said


@pytest.mark.parametrize(
    "line",
    ['{"a": 1}', '{"a": 1}  ', '  {"a": 1}', "\ufeff{}", '{"a": 1} {"b": 2}', '{"a": 1},',
     '{"a": ', "[1, 2]", '"text"', "12", "nul", '{"a": "\\ud800"}', '{"a": NaN}'],
)  # fmt: skip
def test_a_line_reads_as_json_loads_reads_it(line: str) -> None:
    try:
        expected: object = json.loads(line)
    except ValueError as err:
        with pytest.raises(type(err), match=re.escape(str(err))):
            _json_line(line)
    else:
        assert repr(_json_line(line)) == repr(expected)

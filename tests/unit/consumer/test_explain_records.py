"""`policy explain --records FILE` reads what a user exports (issue 39, item 4): an agent's
jsonl, or the rows a Log Analytics query exported with az; and says what a record lacks."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.config import ConfigError
from bridge.consumer import validation
from bridge.consumer.explain import SetAside, _LineReader, read_records, records_in
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
            _LineReader().read(line)
    else:
        assert repr(_LineReader().read(line)[0]) == repr(expected)


# Values as records hold them, texts with the lone halves of surrogate pairs and numbers of
# every kind among them.
TEXT = st.lists(st.sampled_from(["a", "é", "日", "\U0001d11e", "\ud800", "\udfff", "\\u"]),
                max_size=4).map("".join)  # fmt: skip
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


def _finite_floats(value: object) -> bool:
    if isinstance(value, dict):
        return any(_finite_floats(v) for v in value.values())
    if isinstance(value, list):
        return any(_finite_floats(v) for v in value)
    return isinstance(value, float) and math.isfinite(value)


@given(st.dictionaries(TEXT, VALUES, max_size=6), st.booleans())
def test_a_plain_line_holds_no_surrogate_and_no_float(record: object, ascii_only: bool) -> None:
    """What the reader calls plain the record check need not look through for unpaired
    surrogates or integral floats: it holds neither (NaN and Infinity are no integer field's:
    the schema refuses them there)."""
    line = json.dumps(record, ensure_ascii=ascii_only)
    if not ascii_only and not validation.encodes(line):
        return  # not UTF-8 text: no file holds it
    value, plain = _LineReader().read(line)
    assert value == json.loads(line) or repr(value) == repr(json.loads(line))  # NaN != NaN
    if plain:
        assert validation._unicode(value)
        assert not _finite_floats(value)


@pytest.mark.parametrize(
    ("line", "plain"),
    [('{"a": 1, "b": "x"}', True), ('{"a": "é"}', True), ('{"a": 1.0}', False),
     ('{"a": 1e2}', False), ('{"a": "\\u00e9"}', False), ('{"a": "\\ud800"}', False),
     ('{"a": 1} ', False), ('{"a": NaN, "b": -Infinity}', True), ('{"a": 1E400}', False)],
)  # fmt: skip
def test_which_lines_are_plain(line: str, plain: bool) -> None:
    assert _LineReader().read(line)[1] is plain


def test_a_plain_line_is_not_looked_through_and_the_others_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --records line with no \\u escape and no fraction cannot hold an unpaired surrogate
    or an integral float (issue 40: the look was a fifth of reading a record); the others
    are still looked through, and what they hold is refused or made whole as before."""
    looked: list[object] = []
    look = validation._unicode

    def counted(value: object) -> bool:
        looked.append(value)
        return look(value)

    monkeypatch.setattr(validation, "_unicode", counted)
    plain = heartbeat()
    floats = {**heartbeat(), "RecordId": "beat-2", "PendingEvents": 2.0}
    lone = {**heartbeat(), "RecordId": "beat-3", "VmName": "web_\ud800"}
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (plain, floats, lone)), "utf-8")
    aside: list[SetAside] = []
    read: list[dict[str, object]] = [dict(r) for r in records_in(path, aside)]
    assert read == [plain, {**floats, "PendingEvents": 2}]
    assert type(read[1]["PendingEvents"]) is int
    assert [str(a).split(": ", 1)[1] for a in aside] == [
        "line 3 is refused: VmName holds an unpaired surrogate (not valid Unicode text)"
    ]
    assert [v["RecordId"] for v in looked if isinstance(v, dict) and "RecordId" in v] == [
        "beat-2",
        "beat-3",
    ]


def test_nan_or_infinity_in_an_integer_field_of_a_plain_line_is_refused(tmp_path: Path) -> None:
    """A plain line may hold NaN or Infinity (parse_constant, not parse_float): the schema
    refuses them in an integer field, so no integral-float fix-up is skipped for them."""
    path = tmp_path / "records.jsonl"
    lines = [{**heartbeat(), "RecordId": f"beat-{n}", "SpoolDepth": v}
             for n, v in enumerate((math.nan, math.inf), 1)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in lines), "utf-8")
    assert all(_LineReader().read(json.dumps(r))[1] for r in lines)
    aside: list[SetAside] = []
    assert records_in(path, aside) == []
    assert [a.number for a in aside] == [1, 2]
    assert all("SpoolDepth" in a.reason for a in aside), aside

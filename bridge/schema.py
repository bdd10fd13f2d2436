"""Views derived from the one record schema file (`record.schema.json`).

Everything that needs the record's shape (the docs' table, the Log Analytics
table and DCR stream declaration, the tests) derives it from here, so the
shape is written down once. The consumer checks records against it with
`bridge.consumer.validation` (compiled by fastjsonschema; the agent never loads that).
"""

from __future__ import annotations

import json
import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

from bridge.recordtypes import RECORD_TYPE

# Package data beside this module, found the same way in a wheel and in a source tree.
SCHEMA_FILE = Path(__file__).with_name("record.schema.json")


@cache
def load() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return schema


def properties() -> dict[str, dict[str, Any]]:
    props: dict[str, dict[str, Any]] = load()["properties"]
    return props


def common_fields() -> list[str]:
    required: list[str] = load()["required"]
    return required


def record_types() -> dict[str, list[str]]:
    """Each RecordType and the fields specific to it, in schema order: those it requires and
    those it may leave out (a field added later, which older agents do not send)."""
    common = set(common_fields())
    out: dict[str, list[str]] = {}
    for clause in load()["allOf"]:
        name = clause["if"]["properties"][RECORD_TYPE]["const"]
        allowed = clause["then"]["propertyNames"]["enum"]
        out[name] = [field for field in allowed if field not in common]
    return out


def required_fields(record_type: object) -> list[str]:
    """The fields a record of `record_type` must hold, in schema order (the common ones alone
    for a RecordType the schema does not know)."""
    required = list(common_fields())
    for clause in load()["allOf"]:
        if clause["if"]["properties"][RECORD_TYPE]["const"] == record_type:
            required += [f for f in clause["then"].get("required", []) if f not in required]
    return required


# Columns a Log Analytics query returns beside the record's: the table's standard ones, and
# the result table's name that az adds to each row.
TABLE_COLUMNS = frozenset(
    {
        "TableName",
        "TenantId",
        "Type",
        "SourceSystem",
        "_ResourceId",
        "_SubscriptionId",
        "_ItemId",
        "_IsBillable",
        "_BilledSize",
    }
)
_FRACTION = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def is_table_row(value: dict[str, Any]) -> bool:
    """Whether `value` is a row of the Log Analytics table as a query exported it, not a
    record as an agent wrote it."""
    # isdisjoint looks each column up in the record; `&` makes a set of the record's fields.
    return not value.keys().isdisjoint(TABLE_COLUMNS) or isinstance(value.get("SchemaVersion"), str)


# A row of SeBridgeRecords_CL as `az monitor log-analytics query -o json` prints it: every
# column of the table, each value as text (a null "None", dynamic as its JSON text, and, Kusto
# having no null string, "" for a string that is none), with TableName and the standard columns:
#   {"TableName": "PrimaryResult", "TenantId": "...", "SchemaVersion": "1", "RecordType": "Event",
#    "TimeGenerated": "2026-11-26T07:05:00.1230000Z", "Resources": "[\"web_0\"]",
#    "AffectsThisVm": "True", "PlatformFaultDomain": "None", "HookOutput": "", ...}
def record_from_row(row: dict[str, Any]) -> dict[str, Any]:
    """The record a table row holds: each value of its RecordType's fields in the schema's
    type, the columns of other RecordTypes and the table's own left out. A value that cannot
    be read in its type is kept as it is, for the record check to name."""
    allowed = set(common_fields()) | set(record_types().get(str(row.get(RECORD_TYPE)), ()))
    required = set(required_fields(row.get(RECORD_TYPE)))
    props = properties()
    record: dict[str, Any] = {}
    for name, value in row.items():
        if name in TABLE_COLUMNS or (name in props and name not in allowed):
            continue
        if name not in props:
            record[name] = value  # not a column of the table: the record check names it
            continue
        nullable = "null" in (props[name]["type"] if isinstance(props[name]["type"], list) else [])
        if value == "" and not nullable and name not in required:
            continue  # Kusto has no null string: a field the record may leave out, left out
        read = _typed(value, kusto_type(props[name]), nullable)
        if read is not None or nullable:
            record[name] = read
    return record


def _typed(value: Any, column: str, nullable: bool) -> Any:
    """`value` of a Log Analytics `column` type as the record holds it; None for none."""
    if not isinstance(value, str):
        return value
    if column == "string":  # Kusto has no null string: "" is none where none is allowed
        return None if value == "" and nullable else value
    if value in ("", "None"):
        return None
    try:
        read: Any = _READERS[column](value)
    except ValueError:
        return value  # left for the record check to name
    return read


def _datetime(text: str) -> str:
    """The query API gives seven digits of the second; records keep three, and a Z."""
    match = _FRACTION.match(text)
    if match is None:
        raise ValueError(text)
    whole, fraction, zone = match.groups()
    zone = "Z" if zone in ("Z", "+00:00") else zone
    return f"{whole}.{(fraction or '')[:3].ljust(3, '0')}{zone}"


def _boolean(text: str) -> bool:
    known = {"true": True, "false": False}
    if text.lower() not in known:
        raise ValueError(text)
    return known[text.lower()]


_READERS: dict[str, Any] = {
    "long": int,
    "real": float,
    "boolean": _boolean,
    "dynamic": json.loads,
    "datetime": _datetime,
}


def kusto_type(prop: dict[str, Any]) -> str:
    """The Log Analytics column type of a schema property."""
    kinds = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
    kind = next(k for k in kinds if k != "null")
    if kind == "string":
        return "datetime" if prop.get("format") == "date-time" else "string"
    return {"integer": "long", "boolean": "boolean", "number": "real"}.get(kind, "dynamic")


def columns() -> list[tuple[str, str]]:
    """(name, Log Analytics type) of every column, in schema order."""
    return [(name, kusto_type(prop)) for name, prop in properties().items()]


def dcr_stream_declaration() -> dict[str, Any]:
    """The data collection rule's `streamDeclarations` entry: every column, in schema order.

    The Log Analytics sink shapes records to it, the Logs Ingestion test double checks
    requests against it, and infra/ declares the DCR and the table from it.
    """
    return {"columns": [{"name": name, "type": kind} for name, kind in columns()]}


DCR_STREAM = "Custom-SeBridgeRecords"


def markdown_table() -> str:
    """The record table of docs/records.md."""
    types = record_types()
    lines = ["| Field | Type | Record types | Meaning |", "| --- | --- | --- | --- |"]
    common = set(common_fields())
    for name, prop in properties().items():
        used = "all" if name in common else ", ".join(t for t, f in types.items() if name in f)
        nullable = isinstance(prop["type"], list) and "null" in prop["type"]
        kind = kusto_type(prop) + (" or null" if nullable else "")
        lines.append(f"| `{name}` | {kind} | {used} | {prop['description']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """`python -m bridge.schema [--markdown | --columns | --dcr]`."""
    what = argv[0] if argv else "--markdown"
    if what == "--columns":  # as `az monitor log-analytics workspace table create --columns` takes
        sys.stdout.write(" ".join(f"{name}={kind}" for name, kind in columns()) + "\n")
    elif what == "--dcr":
        declaration = {DCR_STREAM: dcr_stream_declaration()}
        sys.stdout.write(json.dumps(declaration, indent=2) + "\n")
    elif what == "--markdown":
        sys.stdout.write(markdown_table())
    else:
        sys.stderr.write("usage: python -m bridge.schema [--markdown | --columns | --dcr]\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

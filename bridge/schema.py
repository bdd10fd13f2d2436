"""Views derived from the one record schema file (`record.schema.json`).

Everything that needs the record's shape (the docs' table, the Log Analytics
table and DCR stream declaration, the tests) derives it from here, so the
shape is written down once. The consumer checks records against it with
`bridge.consumer.validation` (compiled by fastjsonschema; the agent never loads that).
"""

from __future__ import annotations

import json
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

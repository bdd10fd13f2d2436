"""Views derived from the one record schema file (`record.schema.json`).

Everything that needs the record's shape (the docs' table, the Log Analytics
table and DCR stream declaration, the tests) derives it from here, so the
shape is written down once; `problem` checks a record against it (the consumer's gate).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

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
    """Each RecordType and the fields specific to it, in schema order."""
    out: dict[str, list[str]] = {}
    for clause in load()["allOf"]:
        name = clause["if"]["properties"]["RecordType"]["const"]
        out[name] = list(clause["then"]["required"])
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


# --- the record validator -------------------------------------------------------------------


def problem(record: dict[str, Any]) -> str | None:
    """What makes `record` invalid against record.schema.json; None when it is valid."""
    return _problem(record, load(), "")


def _problem(value: Any, rule: dict[str, Any], where: str) -> str | None:
    """The subset of JSON Schema record.schema.json uses (a test holds it to jsonschema)."""
    checks = (_type_problem, _value_problem, _object_problem, _branch_problem)
    for check in checks:
        problem = check(value, rule, where)
        if problem is not None:
            return problem
    return None


_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _type_problem(value: Any, rule: dict[str, Any], where: str) -> str | None:
    kinds = rule.get("type")
    if kinds is None:
        return None
    allowed = kinds if isinstance(kinds, list) else [kinds]
    if not any(_TYPES[k](value) for k in allowed):
        return f"{where or 'the record'} must be {' or '.join(allowed)}, got {_short(value)}"
    if rule.get("format") == "date-time" and isinstance(value, str) and not _is_time(value):
        return f"{where} must be an ISO 8601 date-time, got {_short(value)}"
    return None


def _value_problem(value: Any, rule: dict[str, Any], where: str) -> str | None:
    if "const" in rule and value != rule["const"]:
        return f"{where} must be {rule['const']!r}, got {_short(value)}"
    if "enum" in rule and value not in rule["enum"]:
        return f"{where} must be one of {rule['enum']}, got {_short(value)}"
    if isinstance(value, list) and "items" in rule:
        for index, item in enumerate(value):
            problem = _problem(item, rule["items"], f"{where}[{index}]")
            if problem is not None:
                return problem
    return None


def _object_problem(value: Any, rule: dict[str, Any], where: str) -> str | None:
    if not isinstance(value, dict):
        return None
    missing = [k for k in rule.get("required", ()) if k not in value]
    if missing:
        return f"{where or 'the record'} lacks {', '.join(missing)}"
    names = rule.get("propertyNames", {}).get("enum")
    props, extra = rule.get("properties", {}), rule.get("additionalProperties", True)
    for key, item in value.items():
        path = f"{where}.{key}" if where else str(key)
        if names is not None and key not in names:
            return f"{path} is not a field of this RecordType"
        sub = props.get(key, extra)
        if sub is False:
            return f"{path} is not a field of any record"
        if isinstance(sub, dict):
            problem = _problem(item, sub, path)
            if problem is not None:
                return problem
    return None


def _branch_problem(value: Any, rule: dict[str, Any], where: str) -> str | None:
    for clause in rule.get("allOf", ()):
        problem = _problem(value, clause, where)
        if problem is not None:
            return problem
    if "if" in rule and _problem(value, rule["if"], where) is None and "then" in rule:
        return _problem(value, rule["then"], where)
    return None


def _is_time(text: str) -> bool:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return False
    return "T" in text.upper() and moment.tzinfo is not None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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

"""The consumer's record check: record.schema.json, compiled by fastjsonschema, and what JSON
Schema cannot say.

Every record the consumer folds in passes here first (the sources' `check_record`, the
service's gate). The schema is compiled once from the one schema file, with date-time format
checking, so this check and JSON Schema never disagree (a hand-written validator did: it
refused `PendingEvents: 1.0` and ignored keywords it did not know). Only the consumer
loads fastjsonschema, on its first check: the agent makes its records itself, and
`se-bridge agent` imports this module with the command line's `consume` parser.

Beyond the schema, a record may not hold an unpaired surrogate in any text (JSON allows
"\\ud800"; it cannot be encoded as UTF-8, so it would break a RecordId, a command, a table
key). Integral numbers written as 1.0 where the schema says integer are valid JSON Schema
and are made ints here, so the consumer's folds see the type the schema gives.

A record as it arrives (one of the schema's samples):

    {"SchemaVersion": 1, "RecordId": "5f0c6d1e9a4b2c37", "RecordType": "Heartbeat",
     "TimeGenerated": "2022-04-11T22:10:00.000Z", "VmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
     "VmName": "WestNO_0", ..., "PendingEvents": 1, "SpoolDepth": 0, "ImdsHealthy": true}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from bridge import schema
from bridge.recordtypes import RECORD_TYPE

if TYPE_CHECKING:
    from fastjsonschema import JsonSchemaValueException


def problem(record: dict[str, object], *, plain: bool = False) -> str | None:
    """What makes `record` one the consumer must refuse; None when it may be folded in.

    A valid record's integral floats in integer fields become ints (in place).

    `plain`: the caller read `record` from JSON text, itself read as UTF-8, that escapes no
    character with \\u and writes no number with a fraction or an exponent (explain's
    `_LineReader` says which lines do). Such a record holds no unpaired surrogate (only an
    escape makes one) and no integral float (its only floats are NaN and Infinity, which no
    integer field takes), so neither is looked for: a fifth of checking a record of a large
    --records file (issue 40).
    """
    check, refusal = _compiled()
    kind = record.get(RECORD_TYPE)
    by_type = _compiled_by_type().get(kind) if isinstance(kind, str) else None
    try:
        if by_type is None:
            check(record)
        else:
            try:
                by_type(record)
            except refusal:
                check(record)  # the whole schema's words for what is wrong (it refuses too)
    except refusal as err:
        return _describe(err)
    if plain:
        return None
    where = None if _unicode(record) else _unpaired_surrogate(record, "")
    if where is not None:
        return f"{where or 'a field name'} holds an unpaired surrogate (not valid Unicode text)"
    _whole_numbers(record)
    return None


@cache
def _compiled() -> tuple[Callable[[Any], Any], type[JsonSchemaValueException]]:
    import fastjsonschema  # noqa: PLC0415 - the consumer's alone, loaded on its first check

    check = fastjsonschema.compile(
        schema.load(), formats={"date-time": _is_time}, use_default=False
    )
    return check, fastjsonschema.JsonSchemaValueException


@cache
def _compiled_by_type() -> dict[str, Callable[[Any], Any]]:
    """The schema compiled once per RecordType, as the same check made cheap (a quarter of the
    whole schema's cost, which is most of reading a record).

    The schema is its common part (`properties`, `required`, `additionalProperties: false`)
    and a clause per type, `if` RecordType is it `then` the fields it requires and the field
    names it allows (`propertyNames`). For a record of one type, the other types' clauses do
    not apply, and allowing only its names is the common part with `properties` cut to them:
    a record passes this exactly when it passes the whole schema. The whole schema tries every
    type's `if` (each that fails raises inside fastjsonschema) and every name against a list.
    """
    import fastjsonschema  # noqa: PLC0415 - the consumer's alone, loaded on its first check

    whole = schema.load()
    common = {key: value for key, value in whole.items() if key != "allOf"}
    assert common.get("additionalProperties") is False, "the cut below stands on it"
    compiled: dict[str, Callable[[Any], Any]] = {}
    for clause in whole["allOf"]:
        kind = clause["if"]["properties"][RECORD_TYPE]["const"]
        then = dict(clause["then"])
        allowed = set(then.pop("propertyNames")["enum"])
        assert allowed <= set(common["properties"]), f"{kind} allows a field no record has"
        own = {**common, "properties": {
            name: rule for name, rule in common["properties"].items() if name in allowed
        }, "allOf": [then]}  # fmt: skip
        compiled[kind] = fastjsonschema.compile(
            own, formats={"date-time": _is_time}, use_default=False
        )
    return compiled


def _is_time(text: str) -> bool:
    """An ISO 8601 date-time with a zone that Python reads: what the consumer parses later."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return "T" in text.upper() and moment.tzinfo is not None


def _describe(err: JsonSchemaValueException) -> str:
    where = (err.name or "data").removeprefix("data").lstrip(".") or "the record"
    if err.rule == "required" and isinstance(err.value, dict):
        required = err.rule_definition if isinstance(err.rule_definition, list) else []
        missing = [k for k in required if k not in err.value]
        return f"{where} lacks {', '.join(missing)}"
    if err.rule == "propertyNames" and isinstance(err.value, dict):
        allowed = (
            err.rule_definition.get("enum", []) if isinstance(err.rule_definition, dict) else []
        )
        extra = sorted(str(k) for k in err.value if k not in allowed)
        return f"{where} holds a field no record of its RecordType has: {', '.join(extra)}"
    if err.rule == "additionalProperties":
        message = (err.message or "").removeprefix(err.name or "").strip()
        return f"{where} holds a field no record of its RecordType has ({message})"
    if err.rule == "format":
        return f"{where} must be an ISO 8601 date-time with a zone, got {_short(err.value)}"
    message = (err.message or "").removeprefix(err.name or "").strip()
    return f"{where} {message}, got {_short(err.value)}"


def _unicode(value: Any) -> bool:
    """Whether every text in `value`, field names too, is Unicode text: `_unpaired_surrogate`
    finds nothing. The look every record gets, without the paths `_unpaired_surrogate` makes
    to say where (a fifth of reading a record for a replay, issue 40)."""
    items: Iterable[Any]
    if isinstance(value, dict):
        for key in value:
            if isinstance(key, str) and not key.isascii() and not encodes(key):
                return False
        items = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return not isinstance(value, str) or value.isascii() or encodes(value)
    for item in items:
        if isinstance(item, str):
            if not item.isascii() and not encodes(item):
                return False
        elif isinstance(item, (dict, list)) and not _unicode(item):
            return False
    return True


def _unpaired_surrogate(value: Any, where: str) -> str | None:
    if isinstance(value, str):
        return None if value.isascii() or encodes(value) else where
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(key, str) and not key.isascii() and not encodes(key):
                return where or "a field name"
            found = _unpaired_surrogate(item, path)
            if found is not None:
                return found
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _unpaired_surrogate(item, f"{where}[{index}]")
            if found is not None:
                return found
    return None


def encodes(text: str) -> bool:
    """Whether `text` is Unicode text (holds no unpaired surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@cache
def _integer_fields() -> frozenset[str]:
    def integer(prop: dict[str, Any]) -> bool:
        kinds = prop.get("type")
        return kinds == "integer" or (isinstance(kinds, list) and "integer" in kinds)

    return frozenset(name for name, prop in schema.properties().items() if integer(prop))


def _whole_numbers(record: dict[str, object]) -> None:
    for name in _integer_fields():
        value = record.get(name)
        if isinstance(value, float):  # valid, so integral: JSON Schema's integer allows 1.0
            record[name] = int(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

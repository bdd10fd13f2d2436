"""Write bridge/recordtypes.py from the record schema (`python -m tools.gen_recordtypes`).

mypy cannot read JSON Schema, so the record's shape is written out as Python types here: the
RecordType literal, a Literal for each field with an enum, a TypedDict for the fields every record
has and one per record type (its `if RecordType == ...` clause: the fields it may carry, those it
requires, and the narrower types it gives some of them), the union `Record`, and the field names
the code spells as strings. A test fails when the committed file differs from what this module
generates.

The file (abridged):

    RECORD_TYPE: Final = "RecordType"
    RecordType = Literal["Event", "Heartbeat", "Hook", "Approval", "Decision"]
    class Event(TypedDict):
        SchemaVersion: Literal[1]
        ...
        Transition: Transition
    Record = Event | Heartbeat | Hook | Approval | Decision
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from bridge import schema
from tools.generated import write_or_check

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "bridge" / "recordtypes.py"
REGENERATE = "python -m tools.gen_recordtypes"
LINE_LENGTH = 100  # pyproject's [tool.ruff] line-length: the file passes `ruff format --check`

# The fields the code names outside a TypedDict key (reading a record it has not typed yet), as
# constants, so each name is spelled once.
NAMED_FIELDS = ("RecordType",)

_SCALARS = {"string": "str", "integer": "int", "boolean": "bool", "number": "float"}


def _constant(name: str) -> str:
    """RecordType -> RECORD_TYPE."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def _literal(values: list[Any]) -> str:
    return "Literal[" + ", ".join(f'"{v}"' if isinstance(v, str) else repr(v) for v in values) + "]"


def _enums() -> dict[str, list[str]]:
    """Each field with an enum and its values (null left out: it is the field's `| None`)."""
    return {
        name: [v for v in prop["enum"] if v is not None]
        for name, prop in schema.properties().items()
        if "enum" in prop
    }


def python_type(name: str, prop: dict[str, Any], narrower: dict[str, Any] | None = None) -> str:
    """The annotation of field `name`: `prop` from the schema's properties, and `narrower`, what
    a record type's clause says of it (a type without null), when it says anything."""
    kinds = prop["type"] if isinstance(prop["type"], list) else [prop["type"]]
    if narrower is not None:
        kinds = [k for k in kinds if k == narrower["type"]]
    nullable = "null" in kinds
    kind = next(k for k in kinds if k != "null")
    if "const" in prop:
        text = _literal([prop["const"]])
    elif "enum" in prop:
        text = name
    elif kind == "array" and prop["items"]["type"] == "object":
        # A list of small objects of text (DrainBlockers): their keys are in the schema.
        text = "list[dict[str, str | None]]"
    elif kind == "array":
        text = f"list[{_SCALARS[prop['items']['type']]}]"
    elif kind == "object":
        text = f"dict[str, {_SCALARS[prop['additionalProperties']['type']]}]"
    else:
        text = _SCALARS[kind]
    return f"{text} | None" if nullable else text


def _clauses() -> dict[str, dict[str, Any]]:
    """Each record type's `then` clause, in schema order."""
    kind = NAMED_FIELDS[0]
    return {c["if"]["properties"][kind]["const"]: c["then"] for c in schema.load()["allOf"]}


def _fields(names: list[str], narrower: dict[str, Any]) -> list[str]:
    props = schema.properties()
    return [f"    {n}: {python_type(n, props[n], narrower.get(n))}" for n in names]


def _typed_dict(name: str, doc: str, fields: list[str], base: str = "TypedDict") -> list[str]:
    said = textwrap.wrap(f'"""{doc}', LINE_LENGTH - 4)
    if len(said) == 1:
        said[0] += '"""'
    else:
        said.append('"""')
    return ["", "", f"class {name}({base}):", *(f"    {line}" for line in said), "", *fields]


def _record_type(name: str, clause: dict[str, Any]) -> list[str]:
    """The TypedDict of one record type: the common fields but RecordType from `_Shared`, then
    its own; with fields it may leave out, two classes, as Python 3.10 (the product's floor)
    has no NotRequired."""
    own = [n for n in clause["propertyNames"]["enum"] if n not in schema.common_fields()]
    narrower = clause.get("properties", {})
    required = [n for n in own if n in clause["required"]]
    optional = [n for n in own if n not in clause["required"]]
    fields = [f'    {NAMED_FIELDS[0]}: Literal["{name}"]', *_fields(required, narrower)]
    doc = f'A record of RecordType "{name}".'
    if not optional:
        return _typed_dict(name, doc, fields, "_Shared")
    base = f"_{name}Required"
    return [
        *_typed_dict(base, f"The fields every {name} record has.", fields, "_Shared"),
        *_typed_dict(
            name,
            f"{doc} Older producers leave out {', '.join(optional)}.",
            _fields(optional, narrower),
            f"{base}, total=False",
        ),
    ]


def _alias(name: str, values: list[str]) -> str:
    line = f"{name} = {_literal(values)}"
    if len(line) <= LINE_LENGTH:
        return line
    inner = "".join(f'    "{v}",\n' for v in values)
    return f"{name} = Literal[\n{inner}]"


def render() -> str:
    clauses = _clauses()
    lines = [
        f'"""The record\'s types, generated by `{REGENERATE}`',
        "from bridge/record.schema.json; do not edit (a test fails when this file is out of date).",
        "",
        "One TypedDict per RecordType, `Record` for any of them, and a Literal per field with an",
        "enum. A record type whose fields older agents may leave out is two classes (`_XRequired`",
        "and `X(_XRequired, total=False)`), as Python 3.10 has no NotRequired.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Final, Literal, TypedDict",
        "",
        "# Field names the code spells as strings, to read a record it has not typed yet.",
        *(f'{_constant(n)}: Final = "{n}"' for n in NAMED_FIELDS),
        "",
        *(_alias(name, values) for name, values in _enums().items()),
    ]
    shared = [n for n in schema.common_fields() if n != NAMED_FIELDS[0]]
    lines += _typed_dict(
        "_Shared",
        "The fields every record has but RecordType, which each record type narrows.",
        _fields(shared, {}),
    )
    lines += _typed_dict(
        "Common",
        "The fields every record has, of any RecordType.",
        _fields([NAMED_FIELDS[0]], {}),
        "_Shared",
    )
    for name, clause in clauses.items():
        lines += _record_type(name, clause)
    lines += ["", "", f"Record = {' | '.join(clauses)}", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Write the file; with --check, exit 1 when it is out of date instead."""
    return write_or_check(OUTPUT, render(), REGENERATE, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

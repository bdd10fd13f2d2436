"""bridge/recordtypes.py is generated from the record schema and says what the schema says."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from bridge import recordtypes, schema
from tools import gen_recordtypes


def test_generated_file_is_up_to_date() -> None:
    assert gen_recordtypes.OUTPUT.read_text(encoding="utf-8") == gen_recordtypes.render(), (
        f"{gen_recordtypes.OUTPUT} is out of date with bridge/record.schema.json: "
        f"run `{gen_recordtypes.REGENERATE}`"
    )


def test_check_mode_reports_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "recordtypes.py"
    stale.write_text('"""An older schema."""\n', encoding="utf-8")
    monkeypatch.setattr(gen_recordtypes, "OUTPUT", stale)
    assert gen_recordtypes.main(["--check"]) == 1
    assert gen_recordtypes.main([]) == 0
    assert gen_recordtypes.main(["--check"]) == 0
    assert gen_recordtypes.main(["--nonsense"]) == 2


def test_one_typed_dict_per_record_type_with_the_fields_the_schema_allows_and_requires() -> None:
    common = set(schema.common_fields())
    kinds = schema.record_types()
    assert list(get_args(recordtypes.RecordType)) == list(kinds)
    assert [t.__name__ for t in get_args(recordtypes.Record)] == list(kinds)
    for clause in schema.load()["allOf"]:
        kind = clause["if"]["properties"][recordtypes.RECORD_TYPE]["const"]
        typed = getattr(recordtypes, kind)
        allowed = clause["then"]["propertyNames"]["enum"]
        assert typed.__required_keys__ | typed.__optional_keys__ == set(allowed)
        assert typed.__required_keys__ == common | set(clause["then"]["required"])
    assert set(recordtypes.Common.__required_keys__) == common


@pytest.mark.parametrize(
    ("field", "kind", "annotation"),
    [
        ("Transition", "Event", "Transition"),  # the Event clause takes the null away
        ("Transition", "Hook", "Transition | None"),  # null: a hook run for an Advisory
        ("DocumentIncarnation", "Event", "int | None"),
        ("DocumentIncarnation", "Heartbeat", "int | None"),
        ("EventId", "Approval", "str | None"),
        ("Tags", "Heartbeat", "dict[str, str] | None"),
        ("Resources", "Decision", "list[str]"),
        ("SchemaVersion", "Decision", "Literal[1]"),
        ("RecordType", "Decision", "Literal['Decision']"),
        ("HasPrepareHook", "Heartbeat", "bool"),
    ],
)
def test_field_types_follow_the_schema_and_its_per_type_clauses(
    field: str, kind: str, annotation: str
) -> None:
    assert _annotations(kind)[field] == annotation


def test_an_enum_is_a_literal_of_its_values() -> None:
    for name, prop in schema.properties().items():
        if "enum" in prop:
            values = [v for v in prop["enum"] if v is not None]
            assert list(get_args(getattr(recordtypes, name))) == values


def test_field_constants_are_the_schemas_names() -> None:
    assert recordtypes.RECORD_TYPE in schema.properties()


def _annotations(kind: str) -> dict[str, str]:
    typed = getattr(recordtypes, kind)
    merged: dict[str, str] = {}
    for cls in reversed(typed.__mro__):  # a TypedDict keeps its annotations as ForwardRefs
        notes = getattr(cls, "__annotations__", {})
        merged.update({n: getattr(note, "__forward_arg__", note) for n, note in notes.items()})
    return merged

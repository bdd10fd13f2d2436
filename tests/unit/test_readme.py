"""The README's generated sections match their single sources."""

from __future__ import annotations

import json

import pytest

from tools.sync_readme import README, SECTIONS, expected


def test_readme_generated_sections_are_current() -> None:
    text = README.read_text(encoding="utf-8")
    for name in SECTIONS:
        assert f"<!-- {name}:start -->" in text, f"README lost its {name} section markers"
    assert text == expected(text), "README is out of date: run ./dev docs"


def test_readme_opens_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    block = lines[lines.index("```sh") + 1 : lines.index("```")]
    assert [line.split()[0:2] for line in block] == [["./dev", "demo"], ["./dev", "test"]]


def test_schema_command_prints_what_the_readme_tells_users_to_paste(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bridge import schema

    assert schema.main(["--columns"]) == 0
    columns = capsys.readouterr().out.split()
    assert columns[:4] == ["SchemaVersion=long", "RecordId=string", "RecordType=string",
                           "TimeGenerated=datetime"]  # fmt: skip
    assert len(columns) == len(schema.properties())
    assert schema.main(["--dcr"]) == 0
    declared = json.loads(capsys.readouterr().out)
    assert declared == {schema.DCR_STREAM: schema.dcr_stream_declaration()}
    assert schema.main(["--nonsense"]) == 2

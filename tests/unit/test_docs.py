"""The docs pages' generated sections match their single sources; the README opens as promised."""

from __future__ import annotations

import json

import pytest

from tools.sync_docs import DOCS, PAGES, README, SECTIONS, expected, markers, pages


def test_every_generated_section_is_in_its_page() -> None:
    for page, sections in PAGES.items():
        found = markers((DOCS / page).read_text(encoding="utf-8"))
        for name in sections:
            assert found.count(name) == 2, f"docs/{page} lost its {name} section markers"


def test_docs_generated_sections_are_current() -> None:
    for page in pages():
        text = page.read_text(encoding="utf-8")
        unknown = set(markers(text)) - set(SECTIONS)
        assert not unknown, f"{page.name}: markers of no generated section: {sorted(unknown)}"
        assert text == expected(text), f"{page.name} is out of date: run ./dev generate"


def test_readme_opens_with_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    fences = [line for line in lines if line.startswith("```")]
    assert fences[:2] == ["```sh", "```"], "the README's first code block is not the commands"
    block = lines[lines.index("```sh") + 1 : lines.index("```")]
    assert [line.split()[0:2] for line in block] == [["./dev", "demo"], ["./dev", "test"]]


def test_schema_command_prints_what_the_docs_tell_users_to_paste(
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

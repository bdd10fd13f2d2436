"""The docs pages' generated sections match their single sources; the README opens as promised."""

from __future__ import annotations

import json
import re
from pathlib import Path

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


def test_readme_says_how_long_the_two_commands_take() -> None:
    """From a fresh clone (issue 39): the demo's first frame, and the whole test command."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert re.search(r"`\./dev demo` draws its first frame after about \d+ s", text)
    assert re.search(r"`\./dev test` takes about \d+ minutes", text)


def test_readme_says_what_se_bridge_is_before_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    lead = text.split("```sh", 1)[0].split("\n", 1)[1].strip()  # after the title
    assert "Scheduled Events" in lead, "the README should say what se-bridge is first"


def test_readme_is_short_and_sends_newcomers_to_getting_started() -> None:
    # The reference lives in the docs: no tables of quotas for a million VMs up front.
    lines = README.read_text(encoding="utf-8").splitlines()
    assert not [line for line in lines if line.startswith("|")], "the README has a table"
    assert len(lines) <= 60, f"the README has {len(lines)} lines"
    assert "(docs/getting-started.md)" in README.read_text(encoding="utf-8")
    nav = (DOCS.parent / "mkdocs.yml").read_text(encoding="utf-8")
    assert nav.index("getting-started.md") < nav.index("deploying.md")


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_diagrams_fit_an_80_column_page(page: Path) -> None:
    blocks = re.findall(r"```[^\n]*\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    wide = [
        line
        for block in blocks
        if re.search("[┌└│─▶◀]", block)
        for line in block.splitlines()
        if len(line) > 80
    ]
    assert not wide, f"{page.name}: diagram lines over 80 columns: {wide}"


def test_the_pages_on_prepare_steps_say_the_kubernetes_drain_is_one() -> None:
    """A reader of Hooks or of approve_when_ready learns that the agent's built-in drain
    (issue 30) is a prepare step they wait for, and where it is described."""
    hooks = (DOCS / "hooks.md").read_text(encoding="utf-8")
    assert "](kubernetes.md)" in hooks, "docs/hooks.md does not link the Kubernetes page"
    assert "built-in prepare step" in hooks
    policy = (DOCS / "policy.md").read_text(encoding="utf-8")
    [row] = [line for line in policy.splitlines() if line.startswith("| `approve_when_ready")]
    assert "](kubernetes.md)" in row, "approve_when_ready's row does not name the drain"

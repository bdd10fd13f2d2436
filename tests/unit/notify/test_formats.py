"""The three bodies a notice is posted as, checked against the shapes their receivers document
(no schema of Teams' workflow envelope or of Slack's Block Kit is published for offline use; the
Adaptive Card's rules checked here are those of https://adaptivecards.io/explorer/)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from bridge.notify import formats
from bridge.notify.formats import SAMPLE
from bridge.notify.notice import MAX_VMS, Notice, listed

PAUSE = Notice(
    kind="paused", target="ops", event_id=None, event_type=None, vms=(), not_before=None,
    explanation=(), by="Ada Lovelace", reason="launch week", link=None,
    at=datetime(2026, 11, 27, 8, 0, tzinfo=timezone.utc),
)  # fmt: skip
CROWDED = replace(
    SAMPLE,
    vms=tuple(f"web-{i:04d}" for i in range(1000)),
    explanation=tuple("x" * 2000 for _ in range(20)),
    reason="r" * 5000,
    by="Ada <ada@contoso.com> & co",
)
NOTICES = [SAMPLE, PAUSE, CROWDED, replace(SAMPLE, link=None)]


def test_the_generic_body_is_the_documented_version_1() -> None:
    assert formats.generic(SAMPLE) == {
        "SchemaVersion": 1,
        "Kind": "asked",
        "EventId": "C7061BAC-AF74-4E0E-9A4A-4B5D8B1B2C3D",
        "EventType": "Reboot",
        "Vms": ["sql-primary-0", "sql-replica-1"],
        "VmsNotListed": 0,
        "NotBefore": "2026-11-27T09:30:00.000Z",
        "Explanation": [
            "rule ask-db (ask: dba, deadline 30m, then hold)",
            "budget one-per-set: 0 of 1 in use",
        ],
        "DecidedBy": None,
        "Reason": None,
        "Link": "https://bridge.contoso.com/approvals/events/C7061BAC-AF74-4E0E-9A4A-4B5D8B1B2C3D",
        "Time": "2026-11-27T09:12:05.000Z",
    }
    paused = formats.generic(PAUSE)
    assert (paused["EventId"], paused["Vms"], paused["NotBefore"]) == (None, [], None)
    assert (paused["DecidedBy"], paused["Reason"]) == ("Ada Lovelace", "launch week")
    assert len(formats.generic(CROWDED)["Vms"]) == 1000, "the generic body names every VM"


def test_headlines_say_what_happened_to_what_and_by_whom() -> None:
    assert formats.headline(SAMPLE) == "Approval asked: Reboot of sql-primary-0, sql-replica-1"
    assert formats.headline(PAUSE) == "Early approvals paused, by Ada Lovelace"
    crowded = formats.headline(CROWDED)
    assert crowded.endswith("web-0009 and 990 more, by Ada <ada@contoso.com> & co")


def adaptive_elements(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [*card["body"], *card.get("actions", [])]


@pytest.mark.parametrize("notice", NOTICES, ids=["sample", "pause", "crowded", "no-link"])
def test_the_teams_body_is_a_message_with_one_adaptive_card(notice: Notice) -> None:
    body = formats.teams(notice)
    assert set(body) == {"type", "attachments"}
    assert body["type"] == "message"
    [attachment] = body["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    card = attachment["content"]
    assert card["type"] == "AdaptiveCard"
    assert tuple(map(int, card["version"].split("."))) >= (1, 4)
    assert card["$schema"] == "http://adaptivecards.io/schemas/adaptive-card.json"
    for element in adaptive_elements(card):
        assert element["type"] in {"TextBlock", "FactSet", "Action.OpenUrl"}
        if element["type"] == "TextBlock":
            assert isinstance(element["text"], str)
            assert element["text"]
        if element["type"] == "FactSet":
            assert all(set(f) == {"title", "value"} for f in element["facts"])
            assert all(isinstance(f["value"], str) and f["value"] for f in element["facts"])
    opens = [a["url"] for a in card.get("actions", []) if a["type"] == "Action.OpenUrl"]
    assert opens == ([notice.link] if notice.link else [])
    # Teams refuses a message over 28 KB.
    assert len(json.dumps(body).encode()) < 28 * 1024


@pytest.mark.parametrize("notice", NOTICES, ids=["sample", "pause", "crowded", "no-link"])
def test_the_slack_body_is_text_and_blocks_within_block_kit_s_limits(notice: Notice) -> None:
    body = formats.slack(notice)
    assert set(body) == {"text", "blocks"}
    shown = formats.headline(notice).replace("&", "&amp;").replace("<", "&lt;")
    assert body["text"] == shown.replace(">", "&gt;")
    for block in body["blocks"]:
        assert block["type"] in {"header", "section", "actions"}
        if block["type"] == "header":
            assert block["text"]["type"] == "plain_text"
            assert 0 < len(block["text"]["text"]) <= 150
        if block["type"] == "section":
            for text in [block["text"]] if "text" in block else block["fields"]:
                assert text["type"] == "mrkdwn"
                assert 0 < len(text["text"]) <= (3000 if "text" in block else 2000)
            assert len(block.get("fields", [])) <= 10
    buttons = [e for b in body["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert [b["url"] for b in buttons] == ([notice.link] if notice.link else [])
    for button in buttons:
        assert button["type"] == "button"
        assert button["text"]["type"] == "plain_text"
        assert len(button["text"]["text"]) <= 75
        assert len(button["action_id"]) <= 255


def test_slack_shows_angle_brackets_and_ampersands_as_typed() -> None:
    # In mrkdwn <...> is a link or a mention: a name must not ping a channel.
    fields = formats.slack(CROWDED)["blocks"][1]["fields"]
    [by] = [f["text"] for f in fields if f["text"].startswith("*Decided by*")]
    assert by == "*Decided by*\nAda &lt;ada@contoso.com&gt; &amp; co"


def test_every_body_is_json() -> None:
    for notice in NOTICES:
        for make in (formats.generic, formats.teams, formats.slack):
            assert json.loads(json.dumps(make(notice))) == make(notice)


DOCS = Path(__file__).resolve().parents[3] / "docs" / "notifications.md"


@pytest.mark.parametrize(
    ("heading", "make"),
    [("Generic JSON", formats.generic), ("Microsoft Teams", formats.teams),
     ("Slack", formats.slack)],
)  # fmt: skip
def test_the_docs_show_each_body_as_it_is_posted(heading: str, make: formats.Format) -> None:
    section = DOCS.read_text(encoding="utf-8").split(f"\n### {heading}\n", 1)[1]
    example = section.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(example) == make(SAMPLE), f"docs/notifications.md: {heading} is stale"


def test_teams_shows_markdown_characters_in_names_as_written() -> None:
    # Teams reads Markdown in a TextBlock and in a fact's value: web_1_db would lose its
    # underscores to italics, *x* its asterisks to bold. A backslash shows each as written.
    odd = replace(SAMPLE, vms=("web_1_db", "db*primary*"), by="ops_team", reason="fix [now]",
                  explanation=("rule approve_when_ready_db: ask",))  # fmt: skip
    card = formats.teams(odd)["attachments"][0]["content"]
    facts = {f["title"]: f["value"] for f in card["body"][1]["facts"]}
    assert facts["VMs"] == r"web\_1\_db, db\*primary\*"
    assert facts["Decided by"] == r"ops\_team"
    assert facts["Reason"] == r"fix \[now\]"
    assert card["body"][0]["text"].endswith(r"web\_1\_db, db\*primary\*, by ops\_team")
    assert card["body"][2]["text"] == r"- rule approve\_when\_ready\_db: ask"
    assert formats.generic(odd)["Vms"] == ["web_1_db", "db*primary*"]  # JSON is not Markdown


def test_slack_s_text_shows_names_as_typed_and_no_vm_s_name_as_unknown() -> None:
    # The top-level text is what Slack's notifications and its fallback show, read as mrkdwn:
    # <!channel> would ping everyone, <https://...|label> would be a link with any label.
    hostile = replace(SAMPLE, vms=("web-0", "<!channel>", "<https://evil.example|web-1>"),
                      by="Ada <ada@contoso.com> & co")  # fmt: skip
    body = formats.slack(hostile)
    assert body["text"] == (
        "Approval asked: Reboot of web-0, unknown, unknown, by Ada &lt;ada@contoso.com&gt; &amp; co"
    )
    texts = json.dumps(body)
    for said in ("<!channel>", "!channel", "evil.example", "<https"):
        assert said not in texts, said
    [vms] = [f["text"] for f in body["blocks"][1]["fields"] if f["text"].startswith("*VMs*")]
    assert vms == "*VMs*\nweb-0, unknown, unknown"
    # Names a VM can have are shown as they are, a scale set's instances' too.
    plain = replace(SAMPLE, vms=("_web_vmss_0", "db.primary-1", "A" * 64))
    assert formats.slack(plain)["text"].endswith(f"_web_vmss_0, db.primary-1, {'A' * 64}")
    assert formats.generic(hostile)["Vms"] == list(hostile.vms)  # the data, as sent


def test_a_notice_naming_some_of_its_vms_says_how_many_it_does_not() -> None:
    names, more = listed(f"web_{i:04d}" for i in range(1000))
    assert (len(names), more, MAX_VMS) == (20, 980, 20)
    assert names == tuple(f"web_{i:04d}" for i in range(20))
    assert listed(["b", "a"]) == (("b", "a"), 0)
    capped = replace(SAMPLE, event_type="PatchRun", vms=names, more_vms=more)
    body = formats.generic(capped)
    assert (body["Vms"], body["VmsNotListed"]) == (list(names), 980)
    assert formats.generic(SAMPLE)["VmsNotListed"] == 0
    assert formats.headline(capped).endswith("PatchRun of web_0000, web_0001, web_0002, web_0003, "
                                             "web_0004, web_0005, web_0006, web_0007, web_0008, "
                                             "web_0009 and 990 more")  # fmt: skip
    slack = json.dumps(formats.slack(capped))
    teams = json.dumps(formats.teams(capped))
    assert "web_0009 and 990 more" in slack
    assert "web\\\\_0009 and 990 more" in teams  # Teams' Markdown escape of _
    assert "web_0010" not in slack

"""The bodies a notice is posted as, one pure function per target kind: Notice -> JSON object.

bridge.notify.kinds names them for the settings (notify.targets' `kind`). Each function's
docstring shows what it makes of `SAMPLE`; docs/notifications.md#webhook-formats shows
the same bodies (tests/unit/notify/test_formats.py keeps the three in step).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from bridge.notify.notice import Notice, NoticeKind
from bridge.records import iso

Body = dict[str, Any]
Format = Callable[[Notice], Body]

GENERIC_SCHEMA_VERSION = 1
SHOWN_VMS = 10  # chat formats name this many VMs, then say how many more (generic: all it has)
MAX_LINE = 500  # an explanation line longer than this is cut in the chat formats
LINK_TITLE = "Open the approval page"
# A name an Azure VM can have (letters, digits, . _ -; a scale set's instance is name_N, and
# IMDS may put an underscore in front): what else a VM list holds is shown as UNKNOWN_VM in
# Slack, where a forged name could otherwise read as a mention or a link with any label.
VM_NAME = re.compile(r"_?[A-Za-z0-9][A-Za-z0-9._-]{0,79}")
UNKNOWN_VM = "unknown"

_SAID: dict[NoticeKind, str] = {
    "asked": "Approval asked",
    "approved": "Approved",
    "held": "Held until NotBefore",
    "timed_out": "Nobody answered in time",
    "override": "Approved over a budget",
    "paused": "Early approvals paused",
    "resumed": "Early approvals resumed",
    "rebalance": "Spot eviction risk rose (a rebalance recommendation, never approved)",
    "patch_over_budget": "A patch run runs over a budget",
    "patch_cancelled": "A patch run was cancelled before its cut-off",
}

SAMPLE = Notice(
    kind="asked",
    target="ops",
    event_id="C7061BAC-AF74-4E0E-9A4A-4B5D8B1B2C3D",
    event_type="Reboot",
    vms=("sql-primary-0", "sql-replica-1"),
    not_before=datetime(2026, 11, 27, 9, 30, tzinfo=timezone.utc),
    explanation=(
        "rule ask-db (ask: dba, deadline 30m, then hold)",
        "budget one-per-set: 0 of 1 in use",
    ),
    by=None,
    reason=None,
    link="https://bridge.contoso.com/approvals/events/C7061BAC-AF74-4E0E-9A4A-4B5D8B1B2C3D",
    at=datetime(2026, 11, 27, 9, 12, 5, tzinfo=timezone.utc),
)


def headline(notice: Notice) -> str:
    """One line: what happened, to what, by whom."""
    said = _SAID[notice.kind]
    if notice.event_id is not None:
        said += f": {notice.event_type or 'Event'} of {_vm_list(notice.vms, notice.more_vms)}"
    return said + (f", by {notice.by}" if notice.by else "")


def generic(notice: Notice) -> Body:
    """The documented, versioned body for any receiver; a new field is added, none renamed.

    {"SchemaVersion": 1, "Kind": "asked",
     "EventId": "C7061BAC-AF74-4E0E-9A4A-4B5D8B1B2C3D", "EventType": "Reboot",
     "Vms": ["sql-primary-0", "sql-replica-1"], "VmsNotListed": 0,
     "NotBefore": "2026-11-27T09:30:00.000Z",
     "Explanation": ["rule ask-db (ask: dba, deadline 30m, then hold)",
                     "budget one-per-set: 0 of 1 in use"],
     "DecidedBy": null, "Reason": null,
     "Link": "https://bridge.contoso.com/approvals/events/C7061BAC-AF74-4E0E-9A4A-4B5D8B1B2C3D",
     "Time": "2026-11-27T09:12:05.000Z"}
    """
    return {
        "SchemaVersion": GENERIC_SCHEMA_VERSION,
        "Kind": notice.kind,
        "EventId": notice.event_id,
        "EventType": notice.event_type,
        "Vms": list(notice.vms),
        "VmsNotListed": notice.more_vms,
        "NotBefore": iso(notice.not_before) if notice.not_before else None,
        "Explanation": list(notice.explanation),
        "DecidedBy": notice.by,
        "Reason": notice.reason,
        "Link": notice.link,
        "Time": iso(notice.at),
    }


def teams(notice: Notice) -> Body:
    """A message with one Adaptive Card (1.4), as the Teams workflow "Post to a channel when a
    webhook request is received" takes it (the "Send Adaptive Cards using an Incoming Webhook"
    body of https://learn.microsoft.com/microsoftteams/platform/webhooks-and-connectors/how-to/connectors-using;
    the card's elements: https://adaptivecards.io/explorer/).

        {"type": "message",
         "attachments": [{"contentType": "application/vnd.microsoft.card.adaptive",
                          "contentUrl": null,
                          "content": {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard", "version": "1.4",
            "body": [
              {"type": "TextBlock", "size": "Medium", "weight": "Bolder", "wrap": true,
               "text": "Approval asked: Reboot of sql-primary-0, sql-replica-1"},
              {"type": "FactSet", "facts": [
                {"title": "Event", "value": "C7061BAC-AF74-4E0E-9A4A-4B5D8B1B2C3D"},
                {"title": "Type", "value": "Reboot"},
                {"title": "VMs", "value": "sql-primary-0, sql-replica-1"},
                {"title": "Not before", "value": "2026-11-27T09:30:00.000Z"}]},
              {"type": "TextBlock", "wrap": true, "isSubtle": true,
               "text": "- rule ask-db (ask: dba, deadline 30m, then hold)\\r- budget ..."}],
            "actions": [{"type": "Action.OpenUrl", "title": "Open the approval page",
                         "url": "https://bridge.contoso.com/approvals/events/C7061BAC-..."}]}}]}
    """
    body: list[Body] = [
        {
            "type": "TextBlock",
            "size": "Medium",
            "weight": "Bolder",
            "wrap": True,
            "text": _teams_escape(headline(notice)),
        },
        {
            "type": "FactSet",
            "facts": [
                {"title": title, "value": _teams_escape(value)} for title, value in _facts(notice)
            ],
        },
    ]
    if notice.explanation:
        # TextBlocks take a Markdown subset whose list lines end in \r
        # (https://learn.microsoft.com/adaptive-cards/authoring-cards/text-features).
        lines = "\r".join(f"- {_teams_escape(_cut(line))}" for line in notice.explanation)
        body.append({"type": "TextBlock", "wrap": True, "isSubtle": True, "text": lines})
    card: Body = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    if notice.link:
        card["actions"] = [{"type": "Action.OpenUrl", "title": LINK_TITLE, "url": notice.link}]
    attachment = {
        "contentType": "application/vnd.microsoft.card.adaptive",
        "contentUrl": None,
        "content": card,
    }
    return {"type": "message", "attachments": [attachment]}


def slack(notice: Notice) -> Body:
    """A Slack incoming webhook message: `text` (what notifications show) and Block Kit blocks
    with a link button (https://api.slack.com/messaging/webhooks,
    https://api.slack.com/reference/block-kit/block-elements#button).

        {"text": "Approval asked: Reboot of sql-primary-0, sql-replica-1",
         "blocks": [
           {"type": "header", "text": {"type": "plain_text",
            "text": "Approval asked: Reboot of sql-primary-0, sql-replica-1"}},
           {"type": "section", "fields": [
             {"type": "mrkdwn", "text": "*Event*\\nC7061BAC-AF74-4E0E-9A4A-4B5D8B1B2C3D"},
             {"type": "mrkdwn", "text": "*Type*\\nReboot"},
             {"type": "mrkdwn", "text": "*VMs*\\nsql-primary-0, sql-replica-1"},
             {"type": "mrkdwn", "text": "*Not before*\\n2026-11-27T09:30:00.000Z"}]},
           {"type": "section", "text": {"type": "mrkdwn",
            "text": "• rule ask-db (ask: dba, deadline 30m, then hold)\\n• budget ..."}},
           {"type": "actions", "elements": [
             {"type": "button", "action_id": "open-approval-page", "style": "primary",
              "text": {"type": "plain_text", "text": "Open the approval page"},
              "url": "https://bridge.contoso.com/approvals/events/C7061BAC-..."}]}]}
    """
    notice = replace(
        notice, vms=tuple(v if VM_NAME.fullmatch(v) else UNKNOWN_VM for v in notice.vms)
    )
    said = headline(notice)
    blocks: list[Body] = [
        {"type": "header", "text": {"type": "plain_text", "text": _cut(said, 150)}},
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*{title}*\n{_slack_escape(value)}"}
                for title, value in _facts(notice)
            ],
        },
    ]
    if notice.explanation:
        lines = "\n".join(f"• {_slack_escape(_cut(line))}" for line in notice.explanation)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _cut(lines, 3000)}})
    if notice.link:
        button = {
            "type": "button",
            "action_id": "open-approval-page",
            "style": "primary",
            "text": {"type": "plain_text", "text": LINK_TITLE},
            "url": notice.link,
        }
        blocks.append({"type": "actions", "elements": [button]})
    # `text` is mrkdwn too: what notifications and Slack's fallback show.
    return {"text": _slack_escape(said), "blocks": blocks}


def _facts(notice: Notice) -> list[tuple[str, str]]:
    """The notice's fields a chat message shows, as (title, value), the empty ones left out."""
    facts = [
        ("Event", notice.event_id),
        ("Type", notice.event_type),
        ("VMs", _vm_list(notice.vms, notice.more_vms) if notice.vms else None),
        ("Not before", iso(notice.not_before) if notice.not_before else None),
        ("Decided by", notice.by),
        ("Reason", _cut(notice.reason) if notice.reason else None),
    ]
    return [(title, value) for title, value in facts if value]


def _vm_list(vms: tuple[str, ...], unlisted: int = 0) -> str:
    shown = ", ".join(vms[:SHOWN_VMS])
    more = max(0, len(vms) - SHOWN_VMS) + unlisted
    return f"{shown} and {more} more" if more > 0 else shown or "no VM"


def _cut(text: str, limit: int = MAX_LINE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _teams_escape(text: str) -> str:
    """Teams reads Markdown in a TextBlock and in a fact's title and value
    (https://learn.microsoft.com/microsoftteams/platform/task-modules-and-cards/cards/cards-format):
    the characters of its subset (bold, italic, links) get a backslash, so that a name such as
    web_1_db shows as written (Teams' desktop, web and, since 2024, mobile clients honour it:
    microsoft/AdaptiveCards#5590, microsoft/Teams-AdaptiveCards-Mobile#83)."""
    return _TEAMS_MARKDOWN.sub(r"\\\g<0>", text)


_TEAMS_MARKDOWN = re.compile(r"[\\*_\[\]]")


def _slack_escape(text: str) -> str:
    """Slack's mrkdwn reads &, < and > as markup (links, mentions): shown as typed instead."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

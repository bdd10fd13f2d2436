"""The command message (docs/contracts.md#command): what the consumer sends down one VM's channel.

A sample, as it travels (one JSON object per queue message or file):

    {"SchemaVersion": 1, "CommandId": "3d0c...", "Type": "Approve",
     "VmId": "1b1f7c1e-...", "EventId": "C7061BAC-AFDC-4513-B24B-AA5F13A16123",
     "DocumentIncarnation": 3, "IssuedAt": "2026-11-21T10:00:01.250Z",
     "ExpiresAt": "2026-11-21T10:15:00.000Z", "Rule": "user-initiated",
     "Reason": "User-initiated Reboot: approve at once",
     "ResourcesDigest": "9f86d081884c7d65",
     "KeyId": "5b1e0f3a9c2d4e61", "Signature": "q3N0...Ag=="}

`ResourcesDigest` binds the approval to the event's `Resources` as the consumer decided it
(`resources_digest`): the agent refuses the command (ResourcesChanged) when the live event
names other VMs. Commands without it (older consumers) are checked without it.

`Signature` is the consumer's Ed25519 signature (base64) over `signed_bytes` of every other
field, and `KeyId` names the key (bridge.commands.signing); an unsigned command has neither.

The shape is defined here once; both ends (consumer and agent) build and parse it
with this module. Parsing never trusts the sender: every field is checked and a
`CommandError` says which one is wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from bridge.records import SCHEMA_VERSION, RecordView, iso, record_id, vm_key

# Approve: POST the event's StartRequests. Prepare: the consumer granted this VM's drain (it took
# the event's budget slot); the agent drains its Kubernetes node and approves nothing.
CommandType = Literal["Approve", "Prepare"]
_KINDS: dict[str, CommandType] = {"Approve": "Approve", "Prepare": "Prepare"}
# The code an agent's refusal starts its ApprovalDetail with when the command came after its
# event Started or left the VM's document: the event went ahead unapproved, and no other VM
# can approve it any more (docs/contracts.md#command).
LATE = "Late"
_DIGEST = re.compile(r"[0-9a-f]{16}")
# Queue and file messages stay far below the 64 KiB a Storage Queue message may hold.
MAX_COMMAND_BYTES = 16 * 1024
# Prefixed to what is signed, so a command signature can never pass for a signature of
# anything else made with the same key (and the other way round).
SIGNING_CONTEXT = b"se-bridge command v1\n"


class CommandError(ValueError):
    """A command that must not be acted on: malformed, or missing a field."""


@dataclass(frozen=True)
class Command:
    command_id: str
    vm_id: str
    event_id: str
    document_incarnation: int | None
    issued_at: datetime
    expires_at: datetime
    rule: str
    reason: str
    type: CommandType = "Approve"
    resources_digest: str | None = None
    key_id: str | None = None
    signature: str | None = None
    # What the signature covers, as received (parse) or as built (body): not a field of its own.
    received: bytes | None = field(default=None, compare=False, repr=False)

    def body(self) -> dict[str, Any]:
        """Every field as sent, except Signature."""
        body: dict[str, Any] = {
            "SchemaVersion": SCHEMA_VERSION,
            "CommandId": self.command_id,
            "Type": self.type,
            "VmId": self.vm_id,
            "EventId": self.event_id,
            "DocumentIncarnation": self.document_incarnation,
            "IssuedAt": iso(self.issued_at),
            "ExpiresAt": iso(self.expires_at),
            "Rule": self.rule,
            "Reason": self.reason,
        }
        if self.resources_digest is not None:
            body["ResourcesDigest"] = self.resources_digest
        if self.key_id is not None:
            body["KeyId"] = self.key_id
        return body

    def to_json(self) -> str:
        body = self.body()
        if self.signature is not None:
            body["Signature"] = self.signature
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False)

    def signed_bytes(self) -> bytes:
        """The bytes the signature covers: the body as received, or as this side builds it."""
        return self.received if self.received is not None else signed_bytes(self.body())

    def expired(self, now: datetime) -> bool:
        return now >= self.expires_at


def signed_bytes(body: Mapping[str, Any]) -> bytes:
    """Canonical bytes of every field but Signature: sorted keys, no spaces, UTF-8.

    Taken from the body as parsed, not from the Command, so a field the parser does not
    know still counts: a sender cannot add one to a signed command unnoticed.
    """
    fields = {key: value for key, value in body.items() if key != "Signature"}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        return SIGNING_CONTEXT + text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate such as "\ud800", which JSON allows
        raise CommandError(f"command holds text that is not valid Unicode: {err.reason}") from err


def resources_digest(names: Iterable[str]) -> str:
    """What both ends compare: the set of VM names (records.vm_key), as 16 hex digits of SHA-256.

    The same VMs give the same digest whatever the order, case or 2017 leading "_" of
    the names; a VM more or less gives another.
    """
    keys = sorted({vm_key(name) for name in names})
    text = "\n".join(keys).encode("utf-8", errors="surrogatepass")
    return hashlib.sha256(text).hexdigest()[:16]


def command_id(event_id: str, vm_id: str, kind: CommandType = "Approve") -> str:
    """Deterministic per event, target VM and type, so a resent command is recognisably the
    same and a Prepare never shares its id with the Approve that follows it."""
    if kind == "Prepare":
        return record_id("Command", event_id.lower(), vm_id.lower(), "prepare")
    return record_id("Command", event_id.lower(), vm_id.lower())


def approve(
    *,
    vm_id: str,
    event_id: str,
    document_incarnation: int | None,
    issued_at: datetime,
    expires_at: datetime,
    rule: str,
    reason: str,
    resources: Iterable[str] | None = None,
    kind: CommandType = "Approve",
) -> Command:
    """A command of `kind` (an Approve unless told) for `event_id` to `vm_id`."""
    return Command(
        command_id=command_id(event_id, vm_id, kind),
        type=kind,
        vm_id=vm_id,
        event_id=event_id,
        document_incarnation=document_incarnation,
        issued_at=issued_at,
        expires_at=expires_at,
        rule=rule,
        reason=reason,
        resources_digest=None if resources is None else resources_digest(resources),
    )


def parse(text: str | bytes) -> Command:
    """The Command in `text`, or CommandError naming what is wrong with it."""
    if len(text) > MAX_COMMAND_BYTES:
        raise CommandError(f"command is {len(text)} bytes, more than {MAX_COMMAND_BYTES}")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise CommandError(f"command is not JSON: {err}") from err
    if not isinstance(body, dict):
        raise CommandError("command is not a JSON object")
    if body.get("SchemaVersion") != SCHEMA_VERSION:
        raise CommandError(f"unsupported SchemaVersion {body.get('SchemaVersion')!r}")
    named = _text(body, "Type")
    kind = _KINDS.get(named)
    if kind is None:
        raise CommandError(f"unknown command Type {named!r}")
    incarnation = body.get("DocumentIncarnation")
    if incarnation is not None and (type(incarnation) is not int or incarnation < 0):
        raise CommandError("DocumentIncarnation must be a non-negative integer or null")
    signature, key_id = body.get("Signature"), body.get("KeyId")
    if signature is not None and not isinstance(signature, str):
        raise CommandError("Signature must be a string")
    if key_id is not None and not isinstance(key_id, str):
        raise CommandError("KeyId must be a string")
    digest = body.get("ResourcesDigest")
    if digest is not None and not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
        raise CommandError("ResourcesDigest must be 16 lower-case hex digits")
    return Command(
        command_id=_text(body, "CommandId"),
        vm_id=_text(body, "VmId"),
        event_id=_text(body, "EventId"),
        document_incarnation=incarnation,
        issued_at=_time(body, "IssuedAt"),
        expires_at=_time(body, "ExpiresAt"),
        rule=_text(body, "Rule", empty=True),
        reason=_text(body, "Reason", empty=True),
        type=kind,
        resources_digest=digest,
        key_id=key_id,
        signature=signature,
        received=signed_bytes(body),
    )


def _text(body: dict[str, Any], key: str, *, empty: bool = False) -> str:
    value = body.get(key)
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise CommandError(f"{key} must be a non-empty string, got {value!r}")
    if len(value) > 1024:
        raise CommandError(f"{key} is longer than 1024 characters")
    return value


def _time(body: dict[str, Any], key: str) -> datetime:
    raw = _text(body, key)
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as err:
        raise CommandError(f"{key} is not an ISO 8601 time: {raw!r}") from err
    if moment.tzinfo is None:
        raise CommandError(f"{key} has no time zone: {raw!r}")
    return moment.astimezone(timezone.utc)


def is_late(approval: RecordView) -> bool:
    """An Approval record that says its command came too late (refused as `LATE`)."""
    detail = approval.get("ApprovalDetail")
    refused = approval.get("ApprovalOutcome") == "Refused"
    return refused and isinstance(detail, str) and detail.startswith(f"{LATE}:")

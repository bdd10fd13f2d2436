"""The operator log: what a person decides (approve or hold an event, pause or resume early
approvals), kept in the fleet state signed by the consumer, as it stands.

Who decided is proven, never claimed. A decision reaches the consumer only through a path that
authenticated the person (the API checks an Entra ID token; the loopback page its local
operator), which hands it to the people desk (bridge.consumer.people.desk). The consumer signs
the action with its own command signing key (under a context of its own, so it can never pass
for a command) and stores it in the collection `operator`; the decision pass applies only
actions whose signature verifies with the consumer's own public key. Someone who can write the
fleet state or a queue, but does not hold the key, cannot record a decision in another person's
name: such a document is ignored, with an ERROR and
`se_bridge_consumer_operator_actions_forged_total`.

A sample document (`operator/20261121T100500.000000-000001-1f2e3d4c5b6a`):

    {"Action": {"Kind": "approve", "By": "0b5e...", "ByName": "Alice", "Reason": "failover
     done", "At": "2026-11-21T10:05:00.000Z", "EventId": "C7061BAC-...", "ResourcesDigest":
     "9f86d081884c7d65", "OverrideBudget": false, "Scope": null, "Until": null},
     "Signed": "2026-11-21T10:05:00.000Z", "KeyId": "3b7a1c0d9e8f2a4b", "Signature": "base64..."}

The signature covers the action and `Signed`, when it was signed: an action that still decides
is signed again every day, so a copy of one the consumers forgot (signed before the signed mark
`mark-forgotten`) is refused, as is what a previous key signed after the current one took over
(`mark-key-KEYID`), and a standing document someone deleted is written back
(docs/people.md#what-is-kept).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, get_args

from bridge.commands.message import resources_digest
from bridge.commands.signing import Signer, key_id, verifies
from bridge.consumer.state import Conflict, Doc, Store, layout
from bridge.policy.model import Pause, Person, PersonDecision, parse_scope
from bridge.records import iso, parse_time, utc_now
from bridge.redact import describe

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

log = logging.getLogger(__name__)

OPERATOR = layout.OPERATOR
MARK = "mark-"  # the keys of the collection's documents that are no action
# What an operator action's signature covers starts with this, a command's with
# "se-bridge command v1\n": one can never be taken for the other.
SIGNING_CONTEXT = b"se-bridge operator v1\n"
OperatorKind = Literal["approve", "hold", "pause", "resume"]
KINDS: tuple[str, ...] = get_args(OperatorKind)
# A Decision record's EventId must be a string: a pause or resume names what it covers.
FLEET = "fleet"
# How long an operator document is kept once it is spent (its event ended, its pause lifted or
# was superseded). The Decision records are the audit trail (Log Analytics keeps them for its
# retention); the documents only decide, and a week leaves them to `status --consumer` (the
# overrides of the last day) and to a look at the state itself after an incident.
KEEP_OPERATOR_ACTIONS = timedelta(days=7)
# A document that still decides (a pause in force, a decision about an open event) is signed
# again, with a new `Signed` time, once its signature is this old: what is in the state was
# signed within KEEP_OPERATOR_ACTIONS, and a copy of one the consumer forgot never is (issue 37).
SIGN_AGAIN_AFTER = timedelta(days=1)
# How often a consumer looks whether the documents it stands on are all still there: a deleted
# one is written back (the state does not report deletions; issue 37).
CHECK_STANDING_EVERY = timedelta(minutes=1)
# Documents of the collection that are no action (their keys sort after every action's):
# up to when the consumers have forgotten what was spent (FORGOTTEN), and since when each
# signing key signs (KEY_SINCE + KeyId). Both signed as actions are.
FORGOTTEN = "mark-forgotten"
KEY_SINCE = "mark-key-"
# Why a document in the state is refused (se_bridge_consumer_operator_documents_refused_total).
REFUSED = ("deleted", "reappeared", "signed_after_rotation")


@dataclass(frozen=True)
class OperatorAction:
    kind: OperatorKind
    by: Person
    reason: str  # required non-empty for pause, resume, override; may be "" otherwise
    at: datetime
    event_id: str | None = None  # approve / hold
    resources_digest: str | None = None  # approve / hold: the Resources shown to the person
    override_budget: bool = False  # approve only
    scope: str | None = None  # pause/resume: None = fleet, else "KIND:VALUE" (a budget group)
    until: datetime | None = None  # pause: None = until resumed


# --- the signed documents ------------------------------------------------------------------


def action_body(action: OperatorAction) -> dict[str, Any]:
    return {
        "Kind": action.kind,
        "By": action.by.object_id,
        "ByName": action.by.name,
        "Reason": action.reason,
        "At": iso(action.at),
        "EventId": action.event_id,
        "ResourcesDigest": action.resources_digest,
        "OverrideBudget": action.override_budget,
        "Scope": action.scope,
        "Until": iso(action.until) if action.until else None,
    }


def parse_body(body: Mapping[str, Any]) -> OperatorAction:
    """The action a stored body holds; ValueError when it is not one."""
    kind = body.get("Kind")
    at = parse_time(body.get("At"))
    if kind not in KINDS or at is None:
        raise ValueError(f"not an operator action (Kind {kind!r}, At {body.get('At')!r})")
    texts = ("By", "ByName", "Reason")
    if not all(isinstance(body.get(k), str) for k in texts):
        raise ValueError(f"By, ByName and Reason must be strings: {', '.join(texts)}")
    return OperatorAction(
        kind=kind,
        by=Person(body["By"], body["ByName"]),
        reason=body["Reason"],
        at=at,
        event_id=_text_or_none(body, "EventId"),
        resources_digest=_text_or_none(body, "ResourcesDigest"),
        override_budget=body.get("OverrideBudget") is True,
        scope=_text_or_none(body, "Scope"),
        until=parse_time(body.get("Until")),
    )


def _text_or_none(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} must be a string or null, got {type(value).__name__}")
    return value


def signed_bytes(body: Mapping[str, Any], signed: str | None = None) -> bytes:
    """What a document's signature covers: its action, and when it was signed (`Signed`;
    documents from before issue 37 have none, and their action's At stands for it)."""
    value = body if signed is None else {"Action": body, "Signed": signed}
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return SIGNING_CONTEXT + text.encode("utf-8", errors="surrogatepass")


def signed_at(value: Mapping[str, Any], action: OperatorAction) -> datetime:
    """When a verified document was last signed: its `Signed`, else its action's time."""
    return parse_time(value.get("Signed")) or action.at


def scope_key(scope: str | None) -> str:
    """What tells one pause's scope from another's: its kind and value as `parse_scope` reads
    them, case-blind (`Scale_Set : web` is `scale_set:web`), `fleet` for the fleet."""
    return (canonical_scope(scope) or FLEET).strip().lower()


def canonical_scope(scope: str | None) -> str | None:
    """`scope` as it is kept once accepted: None for the fleet, else KIND:VALUE with the kind as
    `parse_scope` reads it and the value as given, trimmed (`Scale_Set : web` is
    `scale_set:web`). A scope that does not parse is kept as given (it is refused anyway)."""
    try:
        parsed = parse_scope(scope)
    except ValueError:
        return scope
    return None if parsed is None else f"{parsed[0]}:{parsed[1]}"


def scope_error(scope: str | None) -> str | None:
    """Why `scope` names no budget group (KIND:VALUE); None when it does, or is the fleet."""
    try:
        parse_scope(scope)
    except ValueError as err:
        return str(err)
    return None


class OperatorLog:
    """The operator actions of the fleet state that this consumer signed, as they stand: each
    event's last decision by a person, and the pauses in force."""

    def __init__(
        self,
        store: Store,
        signer: Signer | None,
        *,
        trusted: Sequence[Ed25519PublicKey] = (),
        sign_again: bool = True,
        now: Callable[[], datetime] = utc_now,
    ) -> None:
        """`trusted`: the previous signing keys while they rotate. An action signed with one
        before `signer`'s key took over applies, and (`sign_again`; not for a read-only look
        such as `status --consumer`) is signed again, in place, with `signer`, so it outlives
        the old key."""
        self.store = store
        self.signer = signer
        self._trusted = tuple(trusted)
        self._sign_again = sign_again
        self._now = now
        self.forged = 0  # documents in the state that did not verify, ignored (the metrics)
        # Documents refused, by why (REFUSED), each said once at ERROR (the metrics).
        self.refused: Counter[str] = Counter()
        # When each verified action's document was last signed (`signed_at`), by key.
        self._stamps: dict[str, datetime] = {}
        # Up to when the consumers have forgotten spent documents (FORGOTTEN), and since when
        # this consumer's key signs (KEY_SINCE); None: not known (yet).
        self._forgotten: datetime | None = None
        self._since: datetime | None = None
        self._marks: dict[str, Doc] = {}
        self._checked: datetime | None = None  # the last look for deleted documents
        self._said: set[tuple[str, str]] = set()  # (key, why) refused and said
        # Documents whose action verified with a previous key only, by key: (the document as
        # read, that key's KeyId). Each is signed again at every look until it is.
        self._previous: dict[str, tuple[Doc, str]] = {}
        self._warned: set[str] = set()  # documents whose re-signing failed, said once each
        self._mark: int | None = None
        self._looked: datetime | None = None
        self._recorded = 0
        self._lapsed: set[tuple[str, str | None]] = set()  # approvals said to have lapsed
        self._docs: dict[str, Doc] = {}
        # EventId (upper case) -> (its action's order, the decision).
        self._decisions: dict[str, tuple[tuple[str, str], OperatorAction]] = {}
        # scope_key -> (order, the last pause or resume of that scope).
        self._scopes: dict[str, tuple[tuple[str, str], OperatorAction]] = {}
        # Every verified action by its document's key: what `status --consumer` lists.
        self._actions: dict[str, OperatorAction] = {}

    @property
    def can_sign(self) -> bool:
        return self.signer is not None

    def record(self, action: OperatorAction) -> None:
        """Sign `action` and store it; it applies from now on (RuntimeError without a key)."""
        if self.signer is None:
            raise RuntimeError("no commands.signing_key: operator actions cannot be signed")
        value = self._signed(action_body(action), action.at)
        # In time order, then in the order this consumer recorded them (two in the same
        # microsecond: the later one stands); unique across consumers.
        self._recorded += 1
        key = f"{action.at:%Y%m%dT%H%M%S.%f}-{self._recorded:06d}-{uuid.uuid4().hex[:12]}"
        try:
            stored = self.store.write(OPERATOR, Doc(key, value))
        except Conflict:  # a random key already taken: not worth a second try's code
            raise RuntimeError(f"operator/{key} already exists") from None
        self._docs[key] = stored
        self._stamps[key] = action.at
        self._take(key, action)

    def _signed(self, body: Mapping[str, Any], at: datetime) -> dict[str, Any]:
        """A document's value: `body` signed by this consumer, as signed at `at`."""
        assert self.signer is not None
        signed = iso(at)
        return {
            "Action": body,
            "Signed": signed,
            "KeyId": self.signer.key_id,
            "Signature": self.signer.sign_data(signed_bytes(body, signed)),
        }

    def refresh(self, now: datetime | None = None) -> None:
        """Take in the actions stored since the last look (by any consumer of this state);
        with `now`, only when the store's feed_interval has passed since (a look at Table
        Storage is a query, and every batch decides)."""
        if self.signer is None:
            return  # nothing can be verified, so nothing applies (operate refuses, too)
        pace = self.store.feed_interval
        if now is not None:
            if self._looked is not None and (now - self._looked).total_seconds() < pace:
                return
            self._looked = now
        docs, self._mark = self.store.scan_changes(OPERATOR, self._mark, known=self._docs)
        # The marks first: they say which of the actions are refused.
        for doc in sorted(docs, key=lambda d: not d.key.startswith(MARK)):
            self._docs[doc.key] = doc
            if doc.key.startswith(MARK):
                self._take_mark(doc)
                continue
            self._previous.pop(doc.key, None)
            action = self._verified(doc)
            if action is not None and self._admitted(doc, action):
                self._take(doc.key, action)
        if self._sign_again:
            self._own_key()
            for doc, previous in list(self._previous.values()):
                self._sign_with_current_key(doc, previous)
            self._check_standing()

    def _take_mark(self, doc: Doc) -> None:
        """Read a mark (FORGOTTEN, this key's KEY_SINCE): signed by this consumer's key, or by
        a previous one (then signed again, as an action is), or it is ignored as a forgery is.
        Another key's KEY_SINCE says nothing to this consumer."""
        assert self.signer is not None
        if doc.key.startswith(KEY_SINCE) and doc.key != KEY_SINCE + self.signer.key_id:
            return
        body, signature = doc.value.get("Mark"), doc.value.get("Signature")
        current = previous = False
        if isinstance(body, dict) and isinstance(signature, str):
            data = signed_bytes(body)
            current = verifies(self.signer.public_key(), data, signature)
            previous = not current and any(verifies(k, data, signature) for k in self._trusted)
        if not (current or previous):
            self.forged += 1
            log.error(
                "mark %s in the fleet state is ignored: its signature does not verify "
                "with this consumer's key nor a previous one (was the state written by "
                "hand?)",
                doc.key,
            )
            return
        assert isinstance(body, dict)
        self._marks[doc.key] = doc
        when = parse_time(body.get("At"))
        if when is not None and doc.key == FORGOTTEN:
            self._forgotten = max(self._forgotten or when, when)
        elif when is not None:
            self._since = min(self._since or when, when)
        if previous and self._sign_again:
            self._write_mark(doc.key, body)

    def _write_mark(self, key: str, body: dict[str, Any]) -> None:
        """Sign and store a mark over the one held (best effort: the next look tries again)."""
        assert self.signer is not None
        held = self._docs.get(key)
        value = {
            "Mark": body,
            "KeyId": self.signer.key_id,
            "Signature": self.signer.sign_data(signed_bytes(body)),
        }
        try:
            self._marks[key] = self._docs[key] = self.store.write(
                OPERATOR, Doc(key, value, held.etag if held else None)
            )
        except Exception as err:  # another consumer wrote it, or the state is down
            log.debug("mark %s not written: %s", key, describe(err))

    def _own_key(self) -> None:
        """Say since when this consumer's key signs, once: what a previous key signed after
        that is refused (a retired key, or one that leaked, signs nothing new)."""
        assert self.signer is not None
        if self._since is None:
            self._since = self._now()
            self._write_mark(
                KEY_SINCE + self.signer.key_id,
                {"Kind": "key", "KeyId": self.signer.key_id, "At": iso(self._since)},
            )

    def _admitted(self, doc: Doc, action: OperatorAction) -> bool:
        """Whether a verified document may apply: not signed by a previous key after this
        one took over, nor a copy of one forgotten (signed before the FORGOTTEN mark)."""
        stamp = signed_at(doc.value, action)
        previous = self._previous.get(doc.key)
        if previous is not None and self._since is not None and stamp > self._since:
            del self._previous[doc.key]
            assert self.signer is not None
            return self._refuse(
                doc.key,
                "signed_after_rotation",
                f"it is signed with the previous key {previous[1]} at {iso(stamp)}, after key "
                f"{self.signer.key_id} took over at {iso(self._since)}: a previous key only "
                "vouches for what it signed before; whoever still holds it must not decide",
            )
        if self._forgotten is not None and stamp < self._forgotten and doc.key not in self._actions:
            return self._refuse(
                doc.key,
                "reappeared",
                f"it was last signed at {iso(stamp)}, before {iso(self._forgotten)}, up to when "
                "the consumers have forgotten the documents they spent: it is a copy of a "
                "forgotten one put back, and a decision that ended does not apply again",
            )
        self._stamps[doc.key] = stamp
        return True

    def _refuse(self, key: str, why: str, sentence: str) -> bool:
        """Count and say once that document `key` is refused; False."""
        if (key, why) not in self._said:
            self._said.add((key, why))
            self.refused[why] += 1
            log.error(
                "operator document %s in the fleet state is refused: %s (was the state "
                "written by someone without the signing key?)",
                key,
                sentence,
            )
        return False

    def _check_standing(self) -> None:
        """Write back each document that still decides, or was signed within the last
        KEEP_OPERATOR_ACTIONS, that someone deleted: no consumer deletes those, and the state
        does not say what was deleted, so a full look is made every CHECK_STANDING_EVERY."""
        now = self._now()
        if self._checked is not None and abs(now - self._checked) < CHECK_STANDING_EVERY:
            return
        self._checked = now
        present = {doc.key for doc in self.store.scan(OPERATOR)}
        horizon = now - KEEP_OPERATOR_ACTIONS
        standing = {
            held[0][1]
            for held in self._scopes.values()
            if held[1].kind == "pause" and pause_of(held[1]).active(now)
        }
        gone = [key for key in (*self._actions, *self._marks) if key not in present]
        for key in gone:
            if key in self._actions and self._stamps[key] < horizon and key not in standing:
                self._drop(key)  # spent a week: another consumer forgot it
                continue
            doc = self._docs[key]
            try:
                self._docs[key] = self.store.write(OPERATOR, Doc(key, doc.value))
            except Conflict:
                pass  # written back already (by another consumer)
            except Exception as err:  # it still applies here; the next look tries again
                self._checked = None
                log.warning(
                    "operator document %s was deleted from the fleet state and could "
                    "not be written back yet (%s)",
                    key,
                    describe(err),
                )
                continue
            if key in self._marks:
                self._marks[key] = self._docs[key]
            what = self._actions.get(key)
            self._refuse(
                key,
                "deleted",
                f"it was deleted before its time ({_said(what)}): written back as "
                "it was signed; it still applies",
            )

    @property
    def on_previous_key(self) -> int:
        """Actions that apply only through a previous key (commands.verify_key): that key is
        needed until this is 0."""
        return len(self._previous)

    def _verified(self, doc: Doc) -> OperatorAction | None:
        body, signature = doc.value.get("Action"), doc.value.get("Signature")
        signed = doc.value.get("Signed")
        why = None
        if self.signer is None:
            why = "this consumer has no signing key to verify it with (commands.signing_key)"
        elif (
            not isinstance(body, dict)
            or not isinstance(signature, str)
            or not isinstance(signed, str | None)
        ):
            why = "it is not signed"
        elif not verifies(self.signer.public_key(), signed_bytes(body, signed), signature):
            previous = next(
                (k for k in self._trusted if verifies(k, signed_bytes(body, signed), signature)),
                None,
            )
            if previous is not None:
                self._previous[doc.key] = (doc, key_id(previous))
            else:
                mine = key_id(self.signer.public_key())
                why = (
                    f"its signature (key {doc.value.get('KeyId')}) does not verify with "
                    f"this consumer's key {mine} nor a previous one "
                    "(commands.verify_key)"
                )
        if why is None:
            try:
                return parse_body(body)  # type: ignore[arg-type]  # a dict, checked above
            except ValueError as err:
                why = f"it does not hold an operator action ({err})"
        self.forged += 1
        log.error(
            "operator action %s in the fleet state is ignored: %s; only what a person "
            "decided through the API or the page, signed by this consumer, applies (was "
            "the state written by hand, or the signing key rotated?)",
            doc.key,
            why,
        )
        return None

    def _sign_with_current_key(self, doc: Doc, previous: str) -> None:
        """Sign `doc`'s action with the current key, in place (its key, so its order, stays,
        and its ETag: of two consumers, one does it)."""
        assert self.signer is not None
        value = self._signed(doc.value["Action"], self._now())
        try:
            stored = self.store.write(OPERATOR, Doc(doc.key, value, doc.etag))
        except Conflict:
            # Another consumer signed it again first, or it changed: the next look reads it.
            self._previous.pop(doc.key, None)
            return
        except Exception as err:  # best effort: the action applies meanwhile, tried next look
            if doc.key not in self._warned:
                self._warned.add(doc.key)
                log.warning(
                    "operator action %s, signed with the previous key %s, applies but "
                    "could not be signed again with key %s (%s); tried again at every "
                    "look: keep that key in commands.verify_key until it is",
                    doc.key,
                    previous,
                    self.signer.key_id,
                    describe(err),
                )
            return
        self._docs[doc.key] = stored
        self._stamps[doc.key] = parse_time(value["Signed"]) or self._now()
        self._previous.pop(doc.key, None)
        self._warned.discard(doc.key)
        if not previous:  # still deciding, signed again so that it is not taken as forgotten
            log.debug("operator action %s signed again: it still decides", doc.key)
            return
        log.info(
            "operator action %s was signed with the previous key %s: re-signed with key %s, "
            "so it still applies once that key is gone",
            doc.key,
            previous,
            self.signer.key_id,
        )

    def _take(self, key: str, action: OperatorAction) -> None:
        self._actions[key] = action
        order = (iso(action.at), key)
        if action.kind in ("approve", "hold"):
            event = (action.event_id or "").upper()
            held = self._decisions.get(event)
            if held is None or held[0] < order:
                self._decisions[event] = (order, action)
        else:
            scope = scope_key(action.scope)
            held = self._scopes.get(scope)
            if held is None or held[0] < order:
                self._scopes[scope] = (order, action)

    def decision_for(self, event_id: str, resources: Sequence[str]) -> PersonDecision | None:
        """The last decision a person made about the event, if it still applies to the event's
        `resources`: an approval was made for the VMs the person was shown (its digest) and
        lapses when they change; a hold stands (it only lets NotBefore come)."""
        held = self._decisions.get(event_id.upper())
        if held is None:
            return None
        action = held[1]
        if action.kind == "approve" and action.resources_digest != resources_digest(resources):
            if (event_id, action.resources_digest) not in self._lapsed:
                self._lapsed.add((event_id, action.resources_digest))
                log.info(
                    "the approval of event %s by %s (%s) no longer applies: the event's "
                    "Resources changed since they were shown (now %s); the policy decides "
                    "it again, and a person may approve it anew",
                    event_id,
                    action.by.name,
                    action.by.object_id,
                    ", ".join(resources) or "none",
                )
            return None
        kind: Literal["approve", "hold"] = "approve" if action.kind == "approve" else "hold"
        return PersonDecision(
            kind, action.by, action.reason, action.at, override_budget=action.override_budget
        )

    def forget(self, now: datetime, is_open: Callable[[str], bool]) -> int:
        """Delete the documents spent for longer than KEEP_OPERATOR_ACTIONS: a decision about
        an event no longer open (`is_open(EventId)` False), a pause or resume superseded by a
        later one of its scope, a resume, a pause whose time has passed. Oldest first, so that
        what is left says the same at every step (a resume never goes before the pause it
        lifted). Documents that did not verify stay, for whoever investigates them. The count
        deleted."""
        self.refresh()
        horizon = now - KEEP_OPERATOR_ACTIONS
        standing = {held[0][1] for held in self._scopes.values()}
        spent, live = [], []
        for key, action in sorted(self._actions.items(), key=lambda kv: (iso(kv[1].at), kv[0])):
            if self._stamps[key] >= now - SIGN_AGAIN_AFTER:
                continue
            if action.kind in ("approve", "hold"):
                deciding = is_open(action.event_id or "")
            else:
                deciding = (
                    key in standing and action.kind == "pause" and pause_of(action).active(now)
                )
            if deciding:
                live.append(key)
            elif self._stamps[key] < horizon:
                spent.append(key)
        for key in spent:
            self.store.delete(OPERATOR, self._docs[key])  # nothing when another consumer did
            self._drop(key)
        if self._sign_again and self.signer is not None:
            for key in live:  # still deciding: signed within the week, whatever its age
                self._sign_with_current_key(self._docs[key], "")
            # Forgotten up to here: no document left was signed before it.
            mark = min((horizon, *(self._stamps[key] for key in self._actions)))
            if self._forgotten is None or mark > self._forgotten:
                self._forgotten = mark
                self._write_mark(FORGOTTEN, {"Kind": "forgotten", "At": iso(mark)})
        if spent:
            log.info(
                "forgot %d operator documents of events that ended and pauses that lifted "
                "more than %d days ago; the Decision records keep what people decided",
                len(spent),
                KEEP_OPERATOR_ACTIONS.days,
            )
        return len(spent)

    def _drop(self, key: str) -> None:
        del self._docs[key]
        self._stamps.pop(key, None)
        action = self._actions.pop(key)
        if action.kind in ("approve", "hold"):
            held, which = self._decisions, (action.event_id or "").upper()
        else:
            held, which = self._scopes, scope_key(action.scope)
        if which in held and held[which][0][1] == key:
            del held[which]

    def actions(self, since: datetime) -> list[OperatorAction]:
        """The verified actions taken at or after `since`, oldest first."""
        found = [(iso(a.at), key, a) for key, a in self._actions.items() if a.at >= since]
        return [action for _, _, action in sorted(found, key=lambda f: (f[0], f[1]))]

    def pauses(self, now: datetime) -> tuple[Pause, ...]:
        """The pauses in force at `now`, fleet-wide first."""
        found = []
        for _, action in self._scopes.values():
            if action.kind != "pause":
                continue
            pause = pause_of(action)
            if pause.active(now):
                found.append(pause)
        return tuple(sorted(found, key=lambda p: (p.scope is not None, scope_key(p.scope))))


def _said(action: OperatorAction | None) -> str:
    """An action in a few words, for a log line."""
    if action is None:
        return "a mark of when the consumers forgot, or since when a key signs"
    what = action.event_id if action.kind in ("approve", "hold") else scope_key(action.scope)
    return f"{action.kind} of {what} by {action.by.name} at {iso(action.at)}"


def pause_of(action: OperatorAction) -> Pause:
    scope = None if scope_key(action.scope) == FLEET else (action.scope or "").strip()
    return Pause(scope, action.until, action.by, action.reason, action.at)

"""The approval page and its API, as one WSGI app (PEP 3333), so that the standalone consumer
(bridge/consumer/people/server.py, behind bridge.httpfront) and the Functions app (an HTTP
trigger in bridge/consumer/functionapp.py) serve the same thing.

Routes (docs/people.md#the-api):

- `GET /`: the page: pauses, what each budget holds, the open events with their forms.
- `GET /events/{id}`: the same page with that one event alone (404 once it is no longer
  open): where the links in notices lead (bridge.notify.notifier.event_link).
- `POST /decide`: a form of the page (CSRF token checked first; 403 when it is forged or old).
- `GET /api/v1/events` (the open events, each with its Advisory flag, the patch-run asks, the
  pauses, the budgets), `POST /api/v1/events/{id}/approve|hold`, `POST /api/v1/pause`,
  `POST /api/v1/resume`: the JSON API of `se-bridge approve|hold|pause|resume`;
  `POST /api/v1/patchruns/{configuration}/{run}/run|cancel`: a person's answer to the ask
  about an Update Manager patch run (issue 40; `{"Reason": "..."}`). Only a bearer
  token signs a call in (never a cookie, nor the header App Service Authentication adds), and
  a POST must say `Content-Type: application/json`: a page of another site cannot make a
  browser send either, so the API needs no CSRF token.
- `GET|POST /login`: the standalone consumer's loopback page only: the one-time code (in the
  state directory's operator-login file), or the operator token, for a session cookie. There
  each decision's form carries the operator token as well (LocalOperator says why).

Every answer carries the strict Content-Security-Policy (no script at all: the page works
with scripting off, forms only), nosniff, no referrer and no-store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import parse_qsl, quote, urlsplit

from bridge.consumer.people import page
from bridge.consumer.people.auth import EntraVerifier, LocalOperator, Refused
from bridge.consumer.people.desk import Answer, OpenEvent, PatchAsk
from bridge.consumer.people.operatorlog import OperatorAction, OperatorKind
from bridge.policy.model import Pause, Person
from bridge.records import iso, parse_time, utc_now
from bridge.redact import describe

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024  # bytes: a form or an API call is a few hundred
CSRF_MAX_AGE = 12 * 3600.0  # seconds a rendered form stays good
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
# App Service Authentication (Easy Auth) signs the browser in and adds the person's Entra ID
# ID token to every request it lets through; the app validates it again all the same.
EASY_AUTH_ID_HEADER = "x-ms-token-aad-id-token"
CSP = "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'"
SECURITY_HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
HTML = "text/html; charset=utf-8"
JSON = "application/json"
_DURATION = re.compile(r"(\d{1,4})([mhd])")


class Desk(Protocol):
    """What the page needs of the people desk (bridge.consumer.people.desk.PeopleDesk)."""

    def operate(self, action: OperatorAction) -> Answer: ...

    def open_events(self, now: datetime) -> list[OpenEvent]: ...

    def pauses(self, now: datetime) -> list[Pause]: ...

    def budget_use(self) -> dict[str, float]: ...

    def answer_patch_run(self, run: str, said: str, by: Person, reason: str) -> Answer: ...

    def patch_runs_asked(self, now: datetime) -> list[PatchAsk]: ...


def header(asked: WSGIEnvironment, name: str) -> str:
    """A request header's value from the WSGI environ ("" when it is not there)."""
    key = name.upper().replace("-", "_")
    return str(asked.get(key if key == "CONTENT_TYPE" else f"HTTP_{key}", ""))


def bearer(asked: WSGIEnvironment) -> str:
    scheme, _, token = header(asked, "authorization").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "no bearer token: sign in (az login) and try again")
    return token.strip()


def cookie(asked: WSGIEnvironment, name: str) -> str:
    try:
        morsel = SimpleCookie(header(asked, "cookie")).get(name)
    except CookieError:
        return ""
    return morsel.value if morsel is not None else ""


def _form(body: bytes) -> dict[str, str]:
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def _path(asked: WSGIEnvironment) -> str:
    """The path as text: WSGI gives its bytes as Latin-1."""
    path = str(asked.get("PATH_INFO", "")).encode("latin-1", "replace").decode("utf-8", "replace")
    return path or "/"


class Reply(NamedTuple):
    """One answer of the app, before the security headers every answer carries."""

    status: int
    body: bytes
    content_type: str = HTML
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Caller:
    """A signed-in person, and what the page's CSRF tokens are bound to (their session)."""

    person: Person
    binding: str


class EntraSignIn:
    """Entra ID: the API takes a bearer token, the page the ID token App Service
    Authentication adds (or a bearer token); both are validated here."""

    local = False

    def __init__(self, verifier: EntraVerifier) -> None:
        self.verifier = verifier

    def api(self, asked: WSGIEnvironment) -> Person:
        return self.verifier.person(bearer(asked))

    def page(self, asked: WSGIEnvironment) -> Caller:
        token = header(asked, EASY_AUTH_ID_HEADER).strip()
        if not token and not header(asked, "authorization"):
            raise Refused(
                401,
                "not signed in: the page is served behind App Service Authentication, which "
                "adds your ID token (is its token store on?)",
            )
        token = token or bearer(asked)
        person = self.verifier.person(token)
        return Caller(person, person.object_id)


class LocalSignIn:
    """The standalone consumer's one operator: the token file's bearer token for the API, a
    session cookie for the page."""

    local = True

    def __init__(self, operator: LocalOperator) -> None:
        self.operator = operator

    def api(self, asked: WSGIEnvironment) -> Person:
        return self.operator.bearer(bearer(asked))

    def page(self, asked: WSGIEnvironment) -> Caller:
        host, _, port = header(asked, "host").rpartition(":")
        if host.strip("[]") not in LOOPBACK_NAMES or port != str(self.operator.port):
            # Another name that resolves to this machine (DNS rebinding) is another site.
            raise Refused(403, "this page answers only at its own loopback address")
        session = cookie(asked, self.operator.cookie_name)
        return Caller(self.operator.session(session), session)

    def decides(self, form: Mapping[str, str]) -> None:
        """Refused unless the form carries the operator token: the session's cookie alone
        reaches every page on 127.0.0.1, whatever its port."""
        self.operator.decides(form.get("token", ""))


class Csrf:
    """Tokens `<unix time>.<HMAC-SHA256(secret, binding|time)>`: good for CSRF_MAX_AGE and only
    for the session (or person) they were made for. Without a secret given, one of this
    process's own: a form rendered before a restart is refused, and reloading mends it."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def make(self, binding: str, now: datetime) -> str:
        stamp = str(int(now.timestamp()))
        return f"{stamp}.{self._mac(binding, stamp)}"

    def good(self, token: str, binding: str, now: datetime) -> bool:
        stamp, _, mac = token.partition(".")
        if not stamp.isdigit() or not hmac.compare_digest(mac, self._mac(binding, stamp)):
            return False
        return 0 <= now.timestamp() - int(stamp) <= CSRF_MAX_AGE

    def _mac(self, binding: str, stamp: str) -> str:
        return hmac.new(self._secret, f"{binding}|{stamp}".encode(), hashlib.sha256).hexdigest()


def parse_until(text: str, now: datetime) -> datetime | None:
    """An ISO 8601 time (UTC when it names no zone) or a duration from now (30m, 2h, 1d);
    None for an empty text. ValueError for anything else."""
    text = text.strip()
    if not text:
        return None
    found = _DURATION.fullmatch(text)
    if found is not None:
        unit = {"m": "minutes", "h": "hours", "d": "days"}[found.group(2)]
        return now + timedelta(**{unit: int(found.group(1))})
    moment = parse_time(text)
    if moment is None:
        raise ValueError(f"expected an ISO 8601 time or a duration such as 2h, got {text[:40]!r}")
    return moment


@dataclass
class PeopleApp:
    """The page and the API over the people desk, for the people `sign_in` proves."""

    desk: Desk
    sign_in: EntraSignIn | LocalSignIn
    clock: Callable[[], datetime] = utc_now
    csrf: Csrf = field(default_factory=Csrf)

    def __call__(self, asked: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        reply = self.answer(asked)
        headers = [("Content-Type", reply.content_type), *SECURITY_HEADERS, *reply.headers]
        start_response(f"{reply.status} {HTTPStatus(reply.status).phrase}", headers)
        return [reply.body]

    def answer(self, asked: WSGIEnvironment) -> Reply:
        method, path = str(asked.get("REQUEST_METHOD", "GET")), _path(asked)
        length = str(asked.get("CONTENT_LENGTH") or "0")
        if not length.isdigit() or int(length) > MAX_BODY:  # never read past the bound
            return _text(413, f"a request body may hold at most {MAX_BODY} bytes")
        body = asked["wsgi.input"].read(int(length)) if int(length) else b""
        try:
            return self._route(asked, method, path, body)
        except Refused as err:
            return self._refused(method, path, err.status, "Refused", err.reason)
        except Exception as err:  # the state did not answer: say so, keep serving
            log.warning(
                "answering %s %s failed: %s",
                method,
                path,
                describe(err, with_type=True),
                exc_info=True,
            )
            said = f"the consumer could not answer: {describe(err)}; try again"
            return self._refused(method, path, 500, "Failed", said)

    def _refused(self, method: str, path: str, status: int, code: str, reason: str) -> Reply:
        if path.startswith("/api/"):
            return _json(status, {"Accepted": False, "Code": code, "Detail": reason})
        if status == 401 and self.sign_in.local and method == "GET":
            return _html(401, page.login(reason, _local_path(quote(path))))
        return _html(status, page.refused(reason))

    def _route(self, asked: WSGIEnvironment, method: str, path: str, body: bytes) -> Reply:
        path = path.rstrip("/") or "/"
        routes: dict[str, tuple[tuple[str, ...], Callable[[], Reply]]] = {
            "/style.css": (("GET",), lambda: Reply(200, page.STYLE.encode(), "text/css")),
            "/": (("GET",), lambda: self._page(self.sign_in.page(asked), None, 200)),
            "/decide": (("POST",), lambda: self._decide(asked, body)),
            "/api/v1/events": (("GET",), lambda: self._listing(self.sign_in.api(asked))),
            "/api/v1/pause": (("POST",), lambda: self._api_action(asked, path, body, None)),
            "/api/v1/resume": (("POST",), lambda: self._api_action(asked, path, body, None)),
        }
        if isinstance(self.sign_in, LocalSignIn):
            local = self.sign_in
            routes["/login"] = (("GET", "POST"), lambda: self._log_in(local, asked, method, body))
        shown = re.fullmatch(r"/events/([^/]{1,200})", path)
        if shown is not None:
            one = shown.group(1)
            routes[path] = (("GET",), lambda: self._page(self.sign_in.page(asked), None, 200, one))
        run = re.fullmatch(r"/patchruns/([-\w._]{1,128})/(\d{14})", path)
        if run is not None:
            subject = f"(patch:{run.group(1)}/{run.group(2)})"
            routes[path] = (
                ("GET",),
                lambda: self._page(self.sign_in.page(asked), None, 200, only_run=subject),
            )
        found = re.fullmatch(r"/api/v1/events/([^/]{1,200})/(approve|hold)", path)
        if found is not None:
            routes[path] = (("POST",), lambda: self._api_action(asked, path, body, found))
        patch = re.fullmatch(r"/api/v1/patchruns/([-\w._]{1,128})/(\d{14})/(run|cancel)", path)
        if patch is not None:
            routes[path] = (("POST",), lambda: self._patch_answer(asked, body, patch))
        if path not in routes:
            return _text(404, "not found")
        allowed, serve = routes[path]
        return _only(method, *allowed) or serve()

    # --- the page --------------------------------------------------------------------------

    def _page(
        self,
        caller: Caller,
        answer: Answer | None,
        status: int,
        only: str | None = None,
        *,
        only_run: str | None = None,
    ) -> Reply:
        now = self.clock()
        events = self.desk.open_events(now) if only_run is None else []
        patch_asks = self.desk.patch_runs_asked(now) if only is None else []
        if only is not None:
            events = [e for e in events if e.event_id == only]
            status = status if events else 404
        if only_run is not None:
            patch_asks = [a for a in patch_asks if a.subject == only_run]
            status = status if patch_asks else 404
        body = page.render(
            page.View(
                person=caller.person,
                local=self.sign_in.local,
                csrf=self.csrf.make(caller.binding, now),
                events=events,
                pauses=self.desk.pauses(now),
                budgets=self.desk.budget_use(),
                answer=answer,
                now=now,
                only=only,
                patch_asks=tuple(patch_asks),
                only_run=only_run,
            )
        )
        return _html(status, body)

    def _decide(self, asked: WSGIEnvironment, body: bytes) -> Reply:
        caller = self.sign_in.page(asked)
        form = _form(body)
        if not self.csrf.good(form.get("csrf", ""), caller.binding, self.clock()):
            log.warning(
                "refused a form from %s (%s): its CSRF token is forged or older than %g h",
                caller.person.name,
                caller.person.object_id,
                CSRF_MAX_AGE / 3600,
            )
            return _html(
                403,
                page.refused(
                    "this form is stale or was not made by this page: reload the page and try again"
                ),
            )
        if isinstance(self.sign_in, LocalSignIn):
            self.sign_in.decides(form)
        kind = form.get("action", "")
        if kind in ("patch_run", "patch_cancel"):
            said = kind.removeprefix("patch_")
            answer = self.desk.answer_patch_run(
                form.get("run", "")[:200], said, caller.person, form.get("reason", "")
            )
            return self._page(caller, answer, 200 if answer.accepted else 409)
        if kind == "override":
            form["override"], kind = "1", "approve"
        answer = self._act(caller.person, kind, form.get("event") or None, form)
        return self._page(caller, answer, 200 if answer.accepted else 409)

    def _log_in(
        self, sign_in: LocalSignIn, asked: WSGIEnvironment, method: str, body: bytes
    ) -> Reply:
        query = dict(parse_qsl(str(asked.get("QUERY_STRING", ""))))
        given = _form(body) if method == "POST" else query
        secret = given.get("token" if method == "POST" else "code", "")
        then = _local_path(given.get("next", "/"))
        if not secret:
            return _html(200, page.login(None, then))
        session = sign_in.operator.log_in(secret)
        set_cookie = f"{sign_in.operator.cookie_name}={session}; HttpOnly; SameSite=Strict; Path=/"
        return Reply(303, b"", "text/plain", (("Location", then), ("Set-Cookie", set_cookie)))

    # --- the API ---------------------------------------------------------------------------

    def _listing(self, person: Person) -> Reply:
        now = self.clock()
        log.debug("%s (%s) listed the open events", person.name, person.object_id)
        return _json(
            200,
            {
                "Events": [_event_json(e) for e in self.desk.open_events(now)],
                "PatchRuns": [_patch_json(a) for a in self.desk.patch_runs_asked(now)],
                "Pauses": [_pause_json(p) for p in self.desk.pauses(now)],
                "Budgets": self.desk.budget_use(),
            },
        )

    def _api_action(
        self, asked: WSGIEnvironment, path: str, sent: bytes, found: re.Match[str] | None
    ) -> Reply:
        person = self.sign_in.api(asked)
        if header(asked, "content-type").split(";")[0].strip() != JSON:
            return _json(415, _answer_json(Answer(False, "BadRequest", "send JSON")))
        try:
            body = json.loads(sent or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _json(400, _answer_json(Answer(False, "BadRequest", "the body is no object")))
        if found is not None:
            kind, event = found.group(2), found.group(1)
        else:
            kind, event = path.rsplit("/", 1)[1], None
        fields = {
            "reason": _str(body.get("Reason")),
            "digest": _str(body.get("ResourcesDigest")),
            "override": "1" if body.get("OverrideBudget") is True else "",
            "scope": _str(body.get("Scope")),
            "until": _str(body.get("Until")),
        }
        answer = self._act(person, kind, event, fields)
        return _json(200 if answer.accepted else 409, _answer_json(answer))

    def _patch_answer(self, asked: WSGIEnvironment, sent: bytes, found: re.Match[str]) -> Reply:
        """A person's answer to the ask about a patch run, signed in as the API's callers."""
        person = self.sign_in.api(asked)
        if header(asked, "content-type").split(";")[0].strip() != JSON:
            return _json(415, _answer_json(Answer(False, "BadRequest", "send JSON")))
        try:
            body = json.loads(sent or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _json(400, _answer_json(Answer(False, "BadRequest", "the body is no object")))
        run = f"(patch:{found.group(1)}/{found.group(2)})"
        answer = self.desk.answer_patch_run(run, found.group(3), person, _str(body.get("Reason")))
        return _json(200 if answer.accepted else 409, _answer_json(answer))

    # --- one path for both -----------------------------------------------------------------

    def _act(
        self, person: Person, kind: str, event: str | None, fields: Mapping[str, str]
    ) -> Answer:
        now = self.clock()
        if kind not in ("approve", "hold", "pause", "resume"):
            return Answer(False, "BadRequest", f"no such action {kind[:40]!r}")
        try:
            until = parse_until(fields.get("until", ""), now) if kind == "pause" else None
        except ValueError as err:
            return Answer(False, "BadTime", str(err))
        action = OperatorAction(
            kind=_kind(kind),
            by=person,
            reason=fields.get("reason", "").strip(),
            at=now,
            event_id=event if kind in ("approve", "hold") else None,
            resources_digest=(fields.get("digest") or None)
            if kind in ("approve", "hold")
            else None,
            override_budget=kind == "approve" and fields.get("override") == "1",
            scope=(fields.get("scope", "").strip() or None)
            if kind in ("pause", "resume")
            else None,
            until=until,
        )
        try:
            answer = self.desk.operate(action)
        except Exception as err:
            log.error(
                "the consumer could not take %s's %s of %s: %s",
                person.name,
                kind,
                event or action.scope or "the fleet",
                describe(err, with_type=True),
                exc_info=True,
            )
            return Answer(False, "Failed", f"the consumer could not take it: {describe(err)}")
        log.info(
            "%s (%s) asked to %s %s: %s, %s",
            person.name,
            person.object_id,
            kind,
            event or action.scope or "the fleet",
            answer.code,
            answer.detail,
        )
        return answer


def _kind(kind: str) -> OperatorKind:
    kinds: dict[str, OperatorKind] = {
        "approve": "approve",
        "hold": "hold",
        "pause": "pause",
        "resume": "resume",
    }
    return kinds[kind]


def _local_path(text: str) -> str:
    """`text` when it is a path of this page (where a notice's link led before signing in),
    else `/`: never another site (`//host`, `/\\host` and `https:` are refused), nor a line
    break that would end the Location header."""
    if not text.startswith("/") or text.startswith("//") or "\\" in text:
        return "/"
    if any(ch <= " " or ch == "\x7f" for ch in text):
        return "/"
    parts = urlsplit(text)
    return "/" if parts.scheme or parts.netloc else text


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _only(method: str, *allowed: str) -> Reply | None:
    if method in allowed:
        return None
    return Reply(405, b"method not allowed\n", "text/plain", (("Allow", ", ".join(allowed)),))


def _html(status: int, body: str) -> Reply:
    return Reply(status, body.encode())


def _text(status: int, text: str) -> Reply:
    return Reply(status, (text + "\n").encode(), "text/plain; charset=utf-8")


def _json(status: int, body: Mapping[str, Any]) -> Reply:
    return Reply(status, json.dumps(body, ensure_ascii=False).encode(), JSON)


def _time(moment: datetime | None) -> str | None:
    return iso(moment) if moment is not None else None


def _event_json(event: OpenEvent) -> dict[str, Any]:
    return {
        "EventId": event.event_id,
        "EventType": event.event_type,
        "Vms": list(event.vms),
        "NotBefore": _time(event.not_before),
        "Explanation": list(event.explanation),
        "Ask": event.ask,
        "ResourcesDigest": event.resources_digest,
        # A Spot rebalance recommendation: never approved, an approve or hold is refused.
        "Advisory": event.advisory,
    }


def _patch_json(ask: PatchAsk) -> dict[str, Any]:
    """A patch run asked about, as the page lists it; answered at
    POST /api/v1/patchruns/{configuration}/{run}/run|cancel."""
    config, _, run = ask.subject.removeprefix("(patch:").removesuffix(")").partition("/")
    return {
        "Run": ask.subject,
        "Configuration": ask.configuration,
        "Name": ask.name,
        "Vms": ask.vms,
        "Start": _time(ask.start),
        "End": _time(ask.end),
        "CutOff": _time(ask.cutoff),
        "Asked": ask.target,
        "Deadline": _time(ask.deadline),
        "OnDeadline": ask.on_deadline,
        "Breaches": list(ask.breaches),
        "Page": f"/patchruns/{config}/{run}",
    }


def _pause_json(pause: Pause) -> dict[str, Any]:
    return {
        "Scope": pause.scope,
        "Until": _time(pause.until),
        "By": pause.by.name,
        "ByObjectId": pause.by.object_id,
        "Reason": pause.reason,
        "At": _time(pause.at),
    }


def _answer_json(answer: Answer) -> dict[str, Any]:
    body = {"Accepted": answer.accepted, "Code": answer.code, "Detail": answer.detail}
    return {**body, "Warning": answer.warning} if answer.warning else body

"""The standalone consumer's approval page and API on `consumer.people.page_address`
(bridge.httpfront: idle and slow clients hold no thread, and each request has a deadline).

Without Entra ID settings the page is for one operator on loopback: a non-loopback address is
refused at start (`PageError`, the consumer exits 2), the operator token file is written and
the one-time login address beside it. With `consumer.people.tenant_id` and `audience` set, the
API takes Entra ID tokens (the CLI's) on any address; put TLS in front of a non-loopback one.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.config import PeopleSettings
from bridge.consumer.people.app import (
    EASY_AUTH_ID_HEADER,
    MAX_BODY,
    Desk,
    EntraSignIn,
    LocalSignIn,
    PeopleApp,
    header,
)
from bridge.consumer.people.auth import LocalOperator, verifier_for
from bridge.httpfront import Front
from bridge.records import utc_now
from bridge.telemetry import parse_address

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

log = logging.getLogger(__name__)

REQUEST_DEADLINE = 10.0  # seconds a client has for its whole request, however it sends it
REQUEST_LINE_DEADLINE = 1.0  # seconds a new connection has to send its request line
MAX_CONNECTIONS = 8  # requests answered at once: one operator, or a few people and their CLIs
RESERVED = 8  # more, only for requests that carry a credential
PER_CLIENT = 8  # requests read at once from one address


class PageError(ValueError):
    """The page's settings cannot work (the consumer's start says so and exits 2)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_app(
    settings: PeopleSettings,
    desk: Desk,
    state_dir: Path,
    clock: Callable[[], datetime] = utc_now,
) -> PeopleApp:
    """The app the settings ask for: Entra ID sign-in when they name a tenant and audience,
    else the local operator (loopback only)."""
    try:
        host, _ = parse_address(settings.page_address)
    except ValueError as err:
        raise PageError(f"consumer.people.page_address: {err}") from err
    verifier = verifier_for(settings)
    if verifier is not None:
        return PeopleApp(desk, EntraSignIn(verifier), clock)
    if not is_loopback(host):
        raise PageError(
            f"consumer.people.page_address {settings.page_address} is not a loopback address: "
            "without Entra ID sign-in (consumer.people.tenant_id and audience) the page is for "
            "one operator on this machine; listen on 127.0.0.1 or set them"
        )
    operator = LocalOperator.start(state_dir, idle=settings.session_idle)
    return PeopleApp(desk, LocalSignIn(operator), clock)


class PageServer:
    """Serves `app` on `address` (bridge.httpfront) until `close`.

    Idle clients cannot keep the people out: a connection that sends no request line within
    a second is dropped, one address has at most PER_CLIENT requests being read at once (the
    oldest is dropped past that), and besides MAX_CONNECTIONS workers for anyone, RESERVED
    more answer only requests that carry a credential (a bearer token, a session cookie,
    App Service Authentication's ID token)."""

    def __init__(self, app: PeopleApp, address: str) -> None:
        self.app = app
        self.host, wanted = parse_address(address)
        self._front = Front(
            self.host,
            wanted,
            app,
            name="se-bridge page",
            workers=MAX_CONNECTIONS,
            reserved=RESERVED,
            is_reserved=_signed,
            line_deadline=REQUEST_LINE_DEADLINE,
            request_deadline=REQUEST_DEADLINE,
            per_client=PER_CLIENT,
            max_body=MAX_BODY,
        )
        self.port = self._front.port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> PageServer:
        sign_in = self.app.sign_in
        if isinstance(sign_in, LocalSignIn):
            sign_in.operator.port = self.port
        self._front.start()
        if isinstance(sign_in, LocalSignIn):
            login = sign_in.operator.write_login(self.url)
            # The code is a secret: in a file only this user reads, never in the log.
            log.info(
                "the approval page is at %s for one operator on this machine: open the "
                "one-time address in %s to sign in (or give the token in %s at %s/login); "
                "each decision asks for that token too",
                self.url,
                login,
                sign_in.operator.path,
                self.url,
            )
        else:
            log.info("the approval page and its API are at %s (Entra ID sign-in)", self.url)
        return self

    def close(self) -> None:
        self._front.close()


CREDENTIALS = ("authorization", "cookie", EASY_AUTH_ID_HEADER)


def _signed(asked: WSGIEnvironment) -> bool:
    """Whether the request carries a credential: the workers kept for such requests answer
    it (and the app then proves it)."""
    return any(header(asked, name) for name in CREDENTIALS)

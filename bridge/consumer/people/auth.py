"""Who is asking: an Entra ID token, validated here, or the standalone consumer's one local
operator.

A person's decision reaches the consumer only through a request this module has proven:

- `EntraVerifier`: an RS256 JWT from the tenant (its signing keys from the tenant's JWKS,
  fetched with a bounded timeout and cached), issued by the tenant (v1 or v2 issuer), for the
  API's audience, within its lifetime (`LEEWAY` seconds of clock skew), carrying the app role
  (`SeBridge.Decide` by default) in `roles`. Without the role: 403. Its `oid` and `name` (or
  `preferred_username`) are the Person.
- `LocalOperator`: the standalone consumer's loopback page for one operator. Its secret is the
  token file `<state dir>/operator-token` (mode 0600, new at each start), which the CLI sends
  as a bearer token; the browser exchanges a one-time login code (in the address written to
  `<state dir>/operator-login`, mode 0600) or the token itself for a session cookie, and each
  decision on the page carries the token too. The person is `local:<os user>`.
"""

from __future__ import annotations

import getpass
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jwt

from bridge.config import PeopleSettings
from bridge.policy.model import Person

log = logging.getLogger(__name__)

LEEWAY = 120  # seconds of clock skew between Entra ID and this host
JWKS_TIMEOUT = 5.0  # seconds for one fetch of the signing keys
JWKS_LIFESPAN = 3600.0  # seconds the key set is kept before it is fetched again
OPERATOR_FILE = "operator-token"
LOGIN_FILE = "operator-login"  # the one-time login address, beside the token file
SESSION_IDLE = 1800.0  # seconds a page session lasts unused (consumer.people.session_idle)
DEFAULT_ROLE = "SeBridge.Decide"


class Refused(Exception):
    """The request is not proven (401), not allowed (403), or cannot be checked now (503)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def default_jwks_url(tenant_id: str) -> str:
    return f"https://login.microsoftonline.com/{tenant_id}/discovery/v2.0/keys"


def issuers(tenant_id: str) -> tuple[str, ...]:
    """The tenant's v2 and v1 token issuers (an app registration issues either, as its
    manifest's accessTokenAcceptedVersion says)."""
    return (
        f"https://login.microsoftonline.com/{tenant_id}/v2.0",
        f"https://sts.windows.net/{tenant_id}/",
    )


class EntraVerifier:
    """Validates Entra ID tokens of one tenant for one API (audience) and one app role."""

    def __init__(
        self,
        tenant_id: str,
        audience: Sequence[str],
        *,
        role: str = DEFAULT_ROLE,
        jwks_url: str = "",
        timeout: float = JWKS_TIMEOUT,
    ) -> None:
        if not tenant_id or not audience:
            raise ValueError("Entra ID sign-in needs the tenant id and the API's audience")
        self.tenant_id, self.audience, self.role = tenant_id, tuple(audience), role
        self.jwks_url = jwks_url or default_jwks_url(tenant_id)
        self._keys = jwt.PyJWKClient(
            self.jwks_url, cache_keys=True, lifespan=JWKS_LIFESPAN, timeout=timeout
        )

    def person(self, token: str) -> Person:
        """The person `token` proves, with the role; Refused otherwise."""
        try:
            key = self._keys.get_signing_key_from_jwt(token)
        except jwt.PyJWKClientConnectionError as err:
            log.warning(
                "cannot fetch Entra ID's signing keys from %s (%s): nobody can be "
                "signed in until it answers",
                self.jwks_url,
                err,
            )
            raise Refused(503, "the token's signing keys cannot be fetched now") from err
        except jwt.PyJWKClientError as err:
            raise Refused(401, f"the token is not signed by a key of the tenant: {err}") from err
        except jwt.InvalidTokenError as err:
            raise Refused(401, f"not a token: {err}") from err
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                audience=list(self.audience),
                issuer=issuers(self.tenant_id),
                leeway=LEEWAY,
                options={"require": ["exp", "iss", "aud", "oid"]},
            )
        except jwt.InvalidTokenError as err:
            raise Refused(401, f"the token is not valid: {err}") from err
        return self._allowed(claims)

    def _allowed(self, claims: Mapping[str, Any]) -> Person:
        oid = claims.get("oid")
        if not isinstance(oid, str) or not oid:
            raise Refused(401, "the token names no object id (oid)")
        name = next(
            (
                v
                for k in ("name", "preferred_username", "upn")
                if isinstance(v := claims.get(k), str) and v
            ),
            oid,
        )
        roles = claims.get("roles")
        if not isinstance(roles, list) or self.role not in roles:
            raise Refused(
                403,
                f"{name} does not have the app role {self.role}: ask an owner of "
                "the se-bridge app registration to assign it",
            )
        return Person(object_id=oid, name=name)


def verifier_for(settings: PeopleSettings) -> EntraVerifier | None:
    """The verifier `[consumer.people]` sets up; None without its tenant and audience."""
    if not (settings.tenant_id and settings.audience):
        return None
    return EntraVerifier(
        settings.tenant_id, settings.audience, role=settings.role, jwks_url=settings.jwks_url
    )


class LocalOperator:
    """The one operator of a standalone consumer's loopback page: whoever can read the token
    file (the consumer's own OS user, or root).

    The loopback model: a browser sends its cookies for 127.0.0.1 to every port of it, so a
    page any local user serves on another port receives the session cookie. The cookie is
    therefore never the whole credential: it lets the browser see the page, and each decision
    also carries the operator token (`decides`). A session ends after `idle` seconds unused,
    and every session (and the login code) ends when the token file is rewritten: the token is
    read from the file again, and the old one no longer works anywhere.
    """

    def __init__(
        self,
        path: Path,
        user: str,
        *,
        idle: float = SESSION_IDLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path, self.user, self.idle, self._clock = path, user, idle, clock
        self.login_code: str | None = secrets.token_urlsafe(24)  # one use, in LOGIN_FILE
        self.port = 0  # the page's, once it listens: part of the cookie's name
        self._start = secrets.token_hex(4)
        self._sessions: dict[str, float] = {}  # session id -> last used (clock)
        self._lock = threading.Lock()
        self._token, self._read = "", False
        self._reload()

    @classmethod
    def start(
        cls,
        state_dir: Path,
        *,
        idle: float = SESSION_IDLE,
        clock: Callable[[], float] = time.monotonic,
    ) -> LocalOperator:
        """A new token, written to `<state_dir>/operator-token` readable by this user only."""
        state_dir.mkdir(parents=True, exist_ok=True)
        _private(state_dir / OPERATOR_FILE, secrets.token_urlsafe(32))
        (state_dir / LOGIN_FILE).unlink(missing_ok=True)  # an earlier start's, used or not
        return cls(state_dir / OPERATOR_FILE, getpass.getuser(), idle=idle, clock=clock)

    @property
    def token(self) -> str:
        with self._lock:
            self._reload()
            return self._token

    @property
    def cookie_name(self) -> str:
        """Named for this start and the page's port: a cookie of another start, or of another
        consumer's page on this machine, is never taken for this one's."""
        return f"se_bridge_{self.port}_{self._start}"

    @property
    def person(self) -> Person:
        return Person(object_id=f"local:{self.user}", name=self.user)

    def write_login(self, url: str) -> Path:
        """The one-time login address, in a file beside the token file (mode 0600): never in
        the log, which other people may read."""
        path = self.path.with_name(LOGIN_FILE)
        _private(path, f"{url}/login?code={self.login_code}")
        return path

    def bearer(self, token: str) -> Person:
        if not _same(token, self.token):
            raise Refused(401, "the token is not this consumer's operator token")
        return self.person

    def decides(self, token: str) -> Person:
        """The proof a decision on the page carries: the operator token itself (a cookie
        alone may have been sent to another page on this machine)."""
        if not token or not _same(token, self.token):
            raise Refused(
                403,
                "give the operator token (the file operator-token in the "
                "consumer's state directory) with each decision",
            )
        return self.person

    def log_in(self, secret: str) -> str:
        """A new session id, for the one-time login code or the operator token."""
        with self._lock:
            self._reload()
            if self.login_code is not None and _same(secret, self.login_code):
                self.login_code = None
            elif not self._token or not _same(secret, self._token):
                raise Refused(401, "neither the login code (used once) nor the operator token")
            session = secrets.token_urlsafe(32)
            self._sessions[session] = self._clock()
        return session

    def session(self, session: str) -> Person:
        with self._lock:
            self._reload()
            now = self._clock()
            for stale in [s for s, used in self._sessions.items() if now - used > self.idle]:
                del self._sessions[stale]
            if session not in self._sessions:
                raise Refused(
                    401,
                    "not signed in, or signed out after "
                    f"{self.idle / 60:g} minutes unused: sign in again",
                )
            self._sessions[session] = now
        return self.person

    def _reload(self) -> None:
        """Read the token file again (a few bytes, once per request): a new token in it ends
        every session and the login code, and the old token no longer works."""
        try:
            token = self.path.read_text(encoding="utf-8").strip()
        except OSError as err:
            token = ""
            if self._token:
                log.warning(
                    "cannot read the operator token file %s (%s): nobody can sign in "
                    "to the page until it is there again",
                    self.path,
                    err,
                )
        if token == self._token:
            return
        if self._sessions:
            log.info(
                "the operator token file %s changed: the page's %d session(s) ended",
                self.path,
                len(self._sessions),
            )
        if self._read:
            self._sessions.clear()
            self.login_code = None
        self._token, self._read = token, True


def _private(path: Path, text: str) -> None:
    """`text` in a new file readable by this user only."""
    path.unlink(missing_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)  # touch's mode is masked by the umask, never widened by it
    path.write_text(text + "\n", encoding="utf-8")


def _same(given: str, secret: str) -> bool:
    return hmac.compare_digest(given.encode(), secret.encode())


def read_token(state_dir: Path) -> str:
    """The operator token the local consumer wrote (OSError when there is none)."""
    return (state_dir / OPERATOR_FILE).read_text(encoding="utf-8").strip()

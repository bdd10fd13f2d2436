"""The VM's managed identity, read from IMDS by hand: `identity.kind = "managed"` on a plain VM.

Written by hand rather than taken from azure-identity's ManagedIdentityCredential because that
one costs every VM ~3.4 MB resident (azure-identity and msal) and makes msal load cryptography
(~8 MB more), for one GET an hour. Only the plain VM case is ours: where the environment names
another managed-identity host (App Service or Functions, Azure Arc, Cloud Shell, Service Fabric,
workload identity), `applies` says no and azure-identity serves it.

It speaks IMDS's token endpoint as Microsoft documents it: GET
{host}/metadata/identity/oauth2/token?api-version=2018-02-01&resource=RESOURCE[&client_id=ID]
with `Metadata: true`, the host being AZURE_POD_IDENTITY_AUTHORITY_HOST when set (as
azure-identity honours it) and 169.254.169.254 otherwise; the answer's `access_token` and
`expires_on` (epoch seconds, a string). A token is kept until 5 minutes before it expires, and
never for more than a day whatever its answer claims. An error answer is quoted in the exception
shortened and with its control characters escaped.
IMDS's transient answers (404 while it updates, 410, 429, 5xx) and lost connections are retried
with the project's backoff within a total deadline; every read is bounded and a timer shuts the
socket at the deadline, so a server that drips its answer cannot hold the caller. The token
never appears in a log line or an error.

It is azure.core's TokenCredential (and SupportsTokenInfo), so the Event Hubs and Logs Ingestion
clients take it as they take azure-identity's.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any, cast

from azure.core.credentials import AccessToken, AccessTokenInfo, TokenRequestOptions
from azure.core.exceptions import ClientAuthenticationError

from bridge.cloud.advice import CREDENTIAL_ADVICE
from bridge.redact import printable
from bridge.retry import Backoff, RetryableError, ThrottledError, parse_retry_after

# Where the environment names one of these, azure-identity picks a host other than IMDS.
OTHER_HOSTS = (
    "IDENTITY_ENDPOINT",  # App Service, Functions; with IMDS_ENDPOINT, Azure Arc
    "IMDS_ENDPOINT",
    "MSI_ENDPOINT",  # Cloud Shell
    "IDENTITY_SERVER_THUMBPRINT",  # Service Fabric
    "AZURE_FEDERATED_TOKEN_FILE",  # workload identity
)
AUTHORITY_HOST = "AZURE_POD_IDENTITY_AUTHORITY_HOST"
IMDS_HOST = "http://169.254.169.254"
TOKEN_PATH = "/metadata/identity/oauth2/token"  # noqa: S105 - a path
API_VERSION = "2018-02-01"
REFRESH_BEFORE = 300.0  # seconds before expiry a kept token is fetched anew
# IMDS answers 410 for up to 70 s while it updates: the deadline outlasts that.
DEADLINE = 80.0
CONNECT_TIMEOUT = 5.0  # link-local: a connection takes milliseconds or never comes
MAX_BODY = 64 * 1024  # a token answer is a few KB
MAX_QUOTED = 300  # characters of an endpoint's error text an exception quotes
# IMDS's tokens live about 24 hours; an answer that claims years is kept no longer than this,
# so a token that is revoked, or whose clock was wrong, is not used for years.
MAX_LIFETIME = 24 * 3600
RETRIED = frozenset({404, 410, 429})


def applies(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the managed identity is IMDS's (a plain VM), not another host's."""
    return not any(environ.get(name) for name in OTHER_HOSTS)


class ImdsManagedIdentity:
    """The system-assigned managed identity, or the user-assigned one `client_id` names."""

    def __init__(
        self,
        client_id: str = "",
        *,
        host: str | None = None,
        deadline: float = DEADLINE,
        backoff: Backoff | None = None,
    ) -> None:
        base = (host or os.environ.get(AUTHORITY_HOST) or IMDS_HOST).strip("/")
        parts = urllib.parse.urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{AUTHORITY_HOST} must be http://HOST[:PORT]: {base!r}")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._path = parts.path.rstrip("/") + TOKEN_PATH
        self._client_id = client_id
        self._deadline = deadline
        self._backoff = backoff or Backoff(initial=1.0, maximum=20.0)
        self._tokens: dict[str, AccessTokenInfo] = {}
        self._lock = threading.Lock()

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        **kwargs: Any,
    ) -> AccessToken:
        info = self._token(scopes)
        return AccessToken(info.token, info.expires_on)

    def get_token_info(
        self,
        *scopes: str,
        options: TokenRequestOptions | None = None,
    ) -> AccessTokenInfo:
        return self._token(scopes)

    def close(self) -> None:
        """Nothing held: each fetch uses a connection of its own (one an hour)."""

    def __enter__(self) -> ImdsManagedIdentity:
        return self

    def __exit__(self, *args: object) -> None:
        self.close()

    def _token(self, scopes: tuple[str, ...]) -> AccessTokenInfo:
        if len(scopes) != 1:
            raise ValueError(f"a managed identity takes one scope per token, got {len(scopes)}")
        resource = scopes[0].removesuffix("/.default")
        with self._lock:
            kept = self._tokens.get(resource)
            if kept is not None and kept.expires_on - REFRESH_BEFORE > time.time():
                return kept
            fresh = self._fetch(resource)
            self._tokens[resource] = fresh
            return fresh

    def _fetch(self, resource: str) -> AccessTokenInfo:
        query = {"api-version": API_VERSION, "resource": resource}
        if self._client_id:
            query["client_id"] = self._client_id
        target = f"{self._path}?{urllib.parse.urlencode(query)}"
        until = time.monotonic() + self._deadline
        self._backoff.reset()
        while True:
            try:
                status, body = self._exchange(target, until)
            except (RetryableError, OSError, http.client.HTTPException) as err:
                delay = self._backoff.delay_for(err)
                if time.monotonic() + delay >= until:
                    raise ClientAuthenticationError(
                        f"the managed identity endpoint gave no token within {self._deadline:g} s "
                        f"(last: {_said(err)}); {CREDENTIAL_ADVICE}"
                    ) from None
                time.sleep(delay)
                continue
            if status == 200:
                return self._parse(body)
            raise self._refusal(status, body)

    def _exchange(self, target: str, until: float) -> tuple[int, bytes]:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = kind(self._host, self._port, timeout=CONNECT_TIMEOUT)
        try:
            conn.connect()
        except OSError as err:
            # IMDS is link-local and always there on a VM: none answering means no VM.
            raise ClientAuthenticationError(
                f"no managed identity endpoint answers at {self._host} ({_said(err)}); "
                f"{CREDENTIAL_ADVICE}"
            ) from None
        sock = cast(socket.socket, conn.sock)
        # A socket timeout bounds each read, not an answer sent a byte at a time: the timer
        # shuts the socket at the deadline, whatever the server does.
        timer = threading.Timer(max(until - time.monotonic(), 0.0), _shut, (sock,))
        timer.daemon = True
        try:
            sock.settimeout(max(until - time.monotonic(), 0.001))
            timer.start()
            try:
                conn.request("GET", target, headers={"Metadata": "true", "User-Agent": "se-bridge"})
                response = conn.getresponse()
                body = response.read(MAX_BODY + 1)
            except (OSError, http.client.HTTPException):
                # The timer shut the socket mid-exchange: a broken pipe or a closed connection
                # is then the deadline's doing, and is said as such.
                if time.monotonic() < until:
                    raise
                body = b""
            if time.monotonic() >= until:  # shut mid-answer: what was read is not all of it
                raise TimeoutError(f"no whole answer within {self._deadline:g} s")
            if len(body) > MAX_BODY:
                raise RetryableError(f"the answer is larger than {MAX_BODY} bytes")
            if response.status in RETRIED or response.status >= 500:
                said = f"HTTP {response.status}"
                if response.status == 429:
                    raise ThrottledError(said, parse_retry_after(response.getheader("Retry-After")))
                raise RetryableError(said)
            return response.status, body
        finally:
            timer.cancel()
            conn.close()

    def _refusal(self, status: int, body: bytes) -> ClientAuthenticationError:
        # IMDS's error bodies name the problem ("Identity not found") and hold no secret.
        try:
            answer = json.loads(body)
            said = _quoted(f"{answer.get('error', '')}: {answer.get('error_description', '')}")
        except (ValueError, AttributeError, RecursionError):
            said = "no JSON error"
        who = f"the user-assigned identity {self._client_id}" if self._client_id else "the VM"
        return ClientAuthenticationError(
            f"the managed identity endpoint refused a token for {who} (HTTP {status}, {said}); "
            f"{CREDENTIAL_ADVICE}"
        )

    def _parse(self, body: bytes) -> AccessTokenInfo:
        try:
            answer = json.loads(body)
            token, expires_on = answer["access_token"], int(answer["expires_on"])
        except (ValueError, KeyError, TypeError):
            # Never the body itself: it may hold a token.
            raise ClientAuthenticationError(
                f"the managed identity endpoint answered 200 without a token and its expiry; "
                f"{CREDENTIAL_ADVICE}"
            ) from None
        if not isinstance(token, str) or not token:
            raise ClientAuthenticationError(
                f"the managed identity endpoint answered an empty token; {CREDENTIAL_ADVICE}"
            )
        return AccessTokenInfo(token, min(expires_on, int(time.time()) + MAX_LIFETIME))


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed already: nothing to end
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _quoted(text: str) -> str:
    """What a server said, fit for one line of a log: escapes shown, at most MAX_QUOTED."""
    shown = printable(text)
    return shown if len(shown) <= MAX_QUOTED else shown[:MAX_QUOTED] + "..."


def _said(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__

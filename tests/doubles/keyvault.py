"""An HTTPS double of Key Vault's secrets API, read by the real azure-keyvault-secrets client.

No Key Vault emulator exists, so this double answers what `SecretClient.get_secret` asks, the
way the service does:

    GET /secrets/{name}[/{version}]?api-version=...
    200 {"value", "id": "https://{vault}/secrets/{name}/{version}", "attributes": {...}}
    401 without `Authorization: Bearer <token>`, with Key Vault's challenge:
        WWW-Authenticate: Bearer authorization="https://login.microsoftonline.com/{tenant}",
                          resource="https://vault.azure.net"
    403 {"error": {"code": "Forbidden", ...}} while `refuse` is set (a missing role)
    404 {"error": {"code": "SecretNotFound", ...}} for an unknown secret or version
    400 {"error": {"code": "BadParameter", ...}} without an api-version

The client's challenge-based authentication runs for real: its first request carries no token,
it parses the challenge, asks the credential for a token for https://vault.azure.net/.default,
and checks that the challenge's resource is the vault's domain. That check is why the vault has
a real-looking name, https://kv-XXXXXXXX.vault.azure.net (fresh per double, so the SDK's
process-wide challenge cache never carries one test's challenge into another's first request):
the client reaches it through `HTTPS_PROXY`, which this double also serves. It answers the
client's `CONNECT kv-XXXXXXXX.vault.azure.net:443` itself, then speaks TLS on that connection
with a certificate for the vault's name from a throwaway CA (trusted through
`REQUESTS_CA_BUNDLE`). `reachable(monkeypatch)` sets both, so bridge.cloud.keyvault runs
unchanged, with no test switch. Any other CONNECT target is refused (403), so nothing leaves.

`requests` lists what came, in order (path, whether a bearer token was sent, the answer);
tokens are not kept. Any token is accepted: the IMDS simulator issues random ones.
"""

from __future__ import annotations

import json
import logging
import secrets
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from io import BufferedIOBase
from types import TracebackType
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from tests.doubles.httpdouble import Asked, DoubleHandler, Reply, listener
from tests.doubles.tls import ThrowawayCertificate

logger = logging.getLogger("tests.doubles.keyvault")
JSON_UTF8 = "application/json; charset=utf-8"

TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
RESOURCE = "https://vault.azure.net"
CHALLENGE = (
    f'Bearer authorization="https://login.microsoftonline.com/{TENANT}", resource="{RESOURCE}"'
)
# The service's own texts.
NO_TOKEN = "AKV10000: Request is missing a Bearer or PoP token."
NOT_FOUND = (
    "A secret with (name/id) {} was not found in this key vault. If you recently deleted this "
    "secret you may be able to recover it using the correct recovery command. For help "
    "resolving this issue, please see https://go.microsoft.com/fwlink/?linkid=2125182"
)
FORBIDDEN = (
    "Caller is not authorized to perform action on resource.\r\nIf role assignments, deny "
    "assignments or role definitions were changed recently, please observe propagation time."
)


@dataclass(frozen=True)
class SecretRequest:
    """One request as the double saw it. Never the token."""

    method: str
    path: str  # without the query
    api_version: str | None
    authorized: bool  # an `Authorization: Bearer <token>` header came with it
    status: int


@dataclass(frozen=True)
class _Version:
    version: str
    value: str
    created: int


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"code": code, "message": message}}


def _handler(double: KeyVaultDouble) -> type[DoubleHandler]:
    """HTTPS through a CONNECT tunnel, as a client behind HTTPS_PROXY reaches the vault."""

    class Handler(DoubleHandler):
        def finish(self) -> None:
            super().finish()
            if isinstance(self.connection, ssl.SSLSocket):
                # The server shuts down the plain socket it accepted; this one is the TLS one.
                self.server.shutdown_request(self.connection)

        def do_CONNECT(self) -> None:
            if isinstance(self.connection, ssl.SSLSocket) or self.path != f"{double.host}:443":
                self.send(_reply(403, {"error": {"code": "Forbidden", "message": "not the vault"}},
                                 close=True))  # fmt: skip
                return
            self.send_response(200, "Connection established")
            self.end_headers()
            self.wfile.flush()
            plain = self.connection
            try:
                tls = double._certificate.context.wrap_socket(plain, server_side=True)
            except (ssl.SSLError, OSError) as err:
                logger.debug("TLS handshake failed: %s", err)
                self.close_connection = True
                return
            self.server.upgraded(plain, tls)
            self.request = self.connection = tls
            self.rfile = cast(BufferedIOBase, tls.makefile("rb", self.rbufsize))
            self.wfile = cast(BufferedIOBase, tls.makefile("wb"))  # flushed after each request
            self.close_connection = False  # urllib3's CONNECT is HTTP/1.0, the tunnel lives on

        def serve(self) -> None:
            if not isinstance(self.connection, ssl.SSLSocket):
                said = {"error": {"code": "BadRequest", "message": "use HTTPS"}}
                self.send(_reply(400, said, close=True))
                return
            super().serve()

    return Handler


def _reply(
    status: int,
    body: dict[str, Any],
    headers: tuple[tuple[str, str], ...] = (),
    close: bool = False,
) -> Reply:
    data = json.dumps(body).encode()
    return Reply(status, data, (*headers, ("Content-Type", JSON_UTF8)), close)


class KeyVaultDouble:
    """A vault at `vault_url` holding `secrets_by_name` ({name: value}).

    with KeyVaultDouble({"ops-webhook": "https://..."}) as vault:
        vault.reachable(monkeypatch)
        read_secret(f"{vault.vault_url}/secrets/ops-webhook", identity)
        vault.requests
    """

    def __init__(self, secrets_by_name: dict[str, str] | None = None) -> None:
        self.host = f"kv-{secrets.token_hex(4)}.vault.azure.net"
        self.vault_url = f"https://{self.host}"
        self.refuse = False  # every authorized read gets 403, as without the Secrets User role
        self._lock = threading.Lock()
        self._secrets: dict[str, list[_Version]] = {}
        self._requests: list[SecretRequest] = []
        for name, value in (secrets_by_name or {}).items():
            self.put(name, value)
        self._certificate = ThrowawayCertificate("key-vault-double-", self.host)
        self._listener = listener(self._serve, "key-vault-double", handler=_handler(self))

    def put(self, name: str, value: str, version_id: str | None = None) -> str:
        """Store a new version of secret `name` (the current one from now on); its version id."""
        version = _Version(version_id or secrets.token_hex(16), value, int(time.time()))
        with self._lock:
            self._secrets.setdefault(name, []).append(version)
        return version.version

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> KeyVaultDouble:
        try:
            self._listener.up()
        except BaseException:
            self._certificate.cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._listener.down()
        self._certificate.cleanup()

    # --- what tests use ------------------------------------------------------------------

    @property
    def proxy_url(self) -> str:
        if not self._listener.port:
            raise RuntimeError("the double is not started")
        return f"http://127.0.0.1:{self._listener.port}"

    def reachable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Set, for this test, what a process sets to reach this vault: the proxy, the CA to
        trust, and no proxy for loopback (the IMDS simulator, webhook receivers)."""
        for name in ("HTTPS_PROXY", "https_proxy"):
            monkeypatch.setenv(name, self.proxy_url)
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(self._certificate.ca_bundle))
        monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.setenv(name, "127.0.0.1,localhost")

    @property
    def requests(self) -> list[SecretRequest]:
        with self._lock:
            return list(self._requests)

    # --- the service ---------------------------------------------------------------------

    def _serve(self, asked: Asked) -> Reply:
        if asked.method != "GET":
            return _reply(405, {"error": {"code": "BadRequest", "message": "GET a secret"}})
        return _reply(*self._answer(asked.method, asked.target, asked.headers))

    def _answer(
        self, method: str, target: str, headers: Mapping[str, str]
    ) -> tuple[int, dict[str, Any], tuple[tuple[str, str], ...]]:
        url = urlsplit(target)
        versions = parse_qs(url.query).get("api-version")
        api_version = versions[0] if versions else None
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        authorized = scheme.lower() == "bearer" and bool(token.strip())
        extra: tuple[tuple[str, str], ...] = ()
        if api_version is None:
            status, body = _error(400, "BadParameter", "The api-version query is required.")
        elif not authorized:
            status, body = _error(401, "Unauthorized", NO_TOKEN)
            extra = (("WWW-Authenticate", CHALLENGE),)
        elif self.refuse:
            status, body = _error(403, "Forbidden", FORBIDDEN)
        else:
            status, body = self._secret(url.path)
        with self._lock:
            self._requests.append(SecretRequest(method, url.path, api_version, authorized, status))
        return status, body, extra

    def _secret(self, path: str) -> tuple[int, dict[str, Any]]:
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if len(parts) not in (2, 3) or parts[0] != "secrets":
            return _error(404, "NotFound", f"No route for {path!r}.")
        name, wanted = parts[1], parts[2] if len(parts) == 3 else ""
        with self._lock:
            known = list(self._secrets.get(name, ()))
        found = [v for v in known if v.version == wanted] if wanted else known[-1:]
        if not found:
            return _error(404, "SecretNotFound", NOT_FOUND.format("/".join(parts[1:])))
        version = found[0]
        return 200, {
            "value": version.value,
            "id": f"{self.vault_url}/secrets/{name}/{version.version}",
            "attributes": {
                "enabled": True,
                "created": version.created,
                "updated": version.created,
                "recoveryLevel": "Recoverable+Purgeable",
                "recoverableDays": 90,
            },
            "tags": {},
        }

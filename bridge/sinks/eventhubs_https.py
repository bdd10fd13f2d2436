"""`eventhubs` over HTTPS (`eventhubs.transport: https`, the default): records to Azure Event Hubs
by the service's REST send, one request per VM's run of records.

Why not the AMQP producer here: an agent sends a heartbeat every few minutes and, now and then,
the records of an event that someone is waiting to approve. Held open, an AMQP connection per agent
counts against the namespace's connection quota (5,000 on Standard); closed when idle, the next
send reopens it, and azure-eventhub's open steps through the connection, its token and its link
sleeping 50 ms between looks (about 0.46 s, whatever the network), so the first record of every
event waited that long (docs/benchmarks.md, issue 35). A REST send holds no AMQP connection and
costs one request on a kept-alive HTTPS connection, or a TLS handshake after a quiet spell. It
is written with `requests` (already every agent's) rather than a second SDK because it is one
POST; the consumer still reads with azure-eventhub over AMQP, which sees the same events.

A batch as it leaves (learn.microsoft.com/rest/api/eventhub/send-batch-events):
    POST https://contoso.servicebus.windows.net/se-bridge/messages?api-version=2014-01
    Authorization: Bearer eyJ0eXAi...   (or SharedAccessSignature sr=...&sig=...&se=...&skn=...)
    Content-Type: application/vnd.microsoft.servicebus.json
    [{"Body": "{\\"SchemaVersion\\": 1, \\"RecordType\\": \\"Event\\", ...}",
      "UserProperties": {"RecordType": "Event", "SchemaVersion": 1, "VmId": "02aab8a4-...",
                         "RecordId": "5f0c6d1e9a4b2c37"},
      "BrokerProperties": {"PartitionKey": "02aab8a4-..."}}]
    -> 201 Created
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, quote_plus

from bridge.cloud import advice, identity
from bridge.cloud.identity import Identity
from bridge.redact import describe
from bridge.retry import (
    DeliveryError,
    PermanentError,
    PoisonRecords,
    RetryableError,
    ThrottledError,
    parse_retry_after,
)
from bridge.sinks import eventhubs
from bridge.sinks.base import BaseSink, SpooledRecord
from bridge.sinks.eventhubs import (
    EventHub,
    EventHubsSink,
    check_hub,
    grant_advice,
    routing,
    target,
)

if TYPE_CHECKING:
    import requests
    from azure.core.credentials import AccessToken, TokenCredential

log = logging.getLogger(__name__)

API_VERSION = "2014-01"
SCOPE = "https://eventhubs.azure.net/.default"
BATCH_TYPE = "application/vnd.microsoft.servicebus.json"
# Basic tier takes publications of up to 256 KB (Standard and above 1 MB): a request stays
# within it on every tier, and an agent's run of records is rarely larger.
MAX_POST_BYTES = 256 * 1000
TIMEOUT = (10.0, 30.0)  # seconds to connect, and to wait for the answer
MAX_ANSWER = 16 * 1024  # an error answer is read at most this far
TOKEN_SPARE = 300.0  # a token is renewed this long before it expires
SAS_LIFETIME = 3600


@dataclass(frozen=True)
class Endpoint:
    """Where a REST send goes, and how it proves itself (a shared key, a ready SAS, Entra ID)."""

    url: str  # .../<hub>/messages
    resource: str  # what a SAS signs: the hub's URL
    key_name: str = ""
    key: str = ""
    signature: str = ""  # a SharedAccessSignature given whole in the connection string


def endpoint(hub: EventHub) -> Endpoint:
    """The REST endpoint of `hub`; ValueError naming what the settings lack."""
    if not hub.connection_string:
        resource = f"https://{hub.namespace}/{quote(hub.name)}"
        return Endpoint(f"{resource}/messages", resource)
    fields = _connection_fields(hub.connection_string)
    address = fields.get("endpoint", "")
    host = address.split("://", 1)[-1].strip("/")
    name = hub.name or fields.get("entitypath", "")
    if not host or not name:
        raise ValueError(
            "eventhubs.connection_string names no Endpoint host, or no event hub "
            "(EntityPath=, or eventhubs.name)"
        )
    # The emulator is plain text on localhost, as azure-eventhub treats it.
    scheme = "http" if fields.get("usedevelopmentemulator", "").lower() == "true" else "https"
    resource = f"{scheme}://{host}/{quote(name)}"
    return Endpoint(
        f"{resource}/messages",
        resource,
        key_name=fields.get("sharedaccesskeyname", ""),
        key=fields.get("sharedaccesskey", ""),
        signature=fields.get("sharedaccesssignature", ""),
    )


def check_settings(hub: EventHub, transport: str) -> None:
    """ValueError naming the setting unless `hub` can be sent to over `transport`."""
    check_hub(hub)
    if transport == "https":
        endpoint(hub)


def _connection_fields(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in text.split(";"):
        name, sep, value = part.partition("=")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return fields


def sas_token(resource: str, key_name: str, key: str, expiry: int) -> str:
    """A shared access signature for `resource` until `expiry` (Unix seconds), as the service
    checks it: HMAC-SHA256 of the URL-encoded resource, a newline and the expiry."""
    encoded = quote_plus(resource)
    signed = hmac.new(key.encode(), f"{encoded}\n{expiry}".encode(), hashlib.sha256).digest()
    signature = quote_plus(base64.b64encode(signed).decode())
    return f"SharedAccessSignature sr={encoded}&sig={signature}&se={expiry}&skn={key_name}"


class EventHubsHttpsSink(BaseSink):
    """Sends each VM's run of records in requests of at most MAX_POST_BYTES, on one session."""

    max_batch = EventHubsSink.max_batch

    def __init__(
        self,
        hub: EventHub,
        identity_settings: Identity,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = hub
        self._identity = identity_settings
        self._endpoint = endpoint(hub)
        self._clock = clock
        self._credential: TokenCredential | None = None
        self._token: tuple[str, float] = ("", 0.0)  # the Authorization value, and until when
        self._session: requests.Session | None = None
        self._last_send = 0.0  # time.monotonic() of the last request

    @property
    def name(self) -> str:
        return "eventhubs"  # the AMQP sink's name: the spool's progress carries across

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        runs: dict[str, list[tuple[SpooledRecord, str]]] = {}
        too_large: list[SpooledRecord] = []
        for record in batch:
            key, properties = routing(record)
            item = json.dumps(
                {
                    "Body": record.body,
                    "UserProperties": properties,
                    "BrokerProperties": {"PartitionKey": key},
                },
                separators=(",", ":"),
            )
            if len(item.encode("utf-8")) + 2 > MAX_POST_BYTES:
                too_large.append(record)
            runs.setdefault(key, []).append((record, item))
        if too_large:  # before anything is sent, so nothing goes twice
            raise PoisonRecords(
                f"record {too_large[0].record_id} is larger than an Event Hubs request "
                f"({MAX_POST_BYTES} bytes) on {self._target()}",
                [record.seq for record in too_large],
            )
        for run in runs.values():
            for part in _parts(run):
                self._post(part)

    def _post(self, part: list[tuple[SpooledRecord, str]]) -> None:
        """Send one request; where the hub finds it too large (a tier whose limit is below
        MAX_POST_BYTES as it counts), each half again, down to the one record it refuses."""
        status, text, retry_after = self._request([item for _, item in part])
        if status == 201:
            return
        if status == 413 and len(part) > 1:
            middle = len(part) // 2
            self._post(part[:middle])
            self._post(part[middle:])
            return
        if status == 413:
            raise PoisonRecords(
                f"{self._target()} refused record {part[0][0].record_id} as too large",
                [part[0][0].seq],
            )
        raise self._refusal(status, text, retry_after)

    def _request(self, items: list[str]) -> tuple[int, str, str | None]:
        import requests  # noqa: PLC0415 - loaded only by an agent that sends to Event Hubs

        data = ("[" + ",".join(items) + "]").encode("utf-8")
        session = self._session_open()
        try:
            answer = session.post(
                self._endpoint.url,
                params={"api-version": API_VERSION},
                data=data,
                headers={"Authorization": self._authorization(), "Content-Type": BATCH_TYPE},
                timeout=TIMEOUT,
                stream=True,
                allow_redirects=False,  # the token goes to the namespace, nowhere else
            )
        except DeliveryError:
            raise
        except requests.RequestException as err:
            self._drop_session()
            raise RetryableError(
                f"cannot reach {self._target()}: {describe(err, with_type=True)}"
                f"{_EMULATOR_HINT if self._endpoint.url.startswith('http:') else ''}"
            ) from err
        except Exception as err:
            raise self._token_error(err) from err
        with answer:  # an answer read to its end leaves the connection for the next send
            status, text = answer.status_code, _read(answer)
        self._last_send = time.monotonic()
        return status, text, answer.headers.get("Retry-After")

    def _refusal(self, status: int, text: str, retry_after: str | None) -> DeliveryError:
        where = self._target()
        said = f"HTTP {status}: {describe(Exception(text)) if text else 'no details'}"
        if status in (401, 403):
            advice_ = grant_advice(self._settings, self._identity)
            return PermanentError(f"Event Hubs refused {where}: {advice_} ({said})")
        if status == 404:
            return PermanentError(
                f"{where} does not exist: check eventhubs.namespace and eventhubs.name ({said})"
            )
        if status in (429, 503):
            return ThrottledError(f"{where} is busy ({said})", parse_retry_after(retry_after))
        if status >= 500 or status == 408:
            return RetryableError(f"{where} could not take the records ({said})")
        return PermanentError(f"{where} refused the request ({said})")

    def _token_error(self, err: Exception) -> DeliveryError:
        text = describe(err, with_type=True)
        if type(err).__name__ in ("CredentialUnavailableError", "ClientAuthenticationError"):
            return PermanentError(f"no token for Event Hubs ({text}); {advice.CREDENTIAL_ADVICE}")
        return RetryableError(f"no token for Event Hubs yet ({text})")

    def _authorization(self) -> str:
        value, until = self._token
        now = self._clock()
        if value and now < until - TOKEN_SPARE:
            return value
        e = self._endpoint
        if e.signature:
            self._token = (e.signature, float("inf"))
        elif self._settings.connection_string:
            expiry = int(now) + SAS_LIFETIME
            self._token = (sas_token(e.resource, e.key_name, e.key, expiry), float(expiry))
        else:
            if self._credential is None:
                self._credential = identity.credential(self._identity)
            token: AccessToken = self._credential.get_token(SCOPE)
            self._token = (f"Bearer {token.token}", float(token.expires_on))
        return self._token[0]

    def check(self) -> str:
        """The AMQP sender's round trip (a token and a sender link, nothing sent): the REST
        send has no harmless call, and the same right (Data Sender, or the policy's Send)
        lets both send."""
        with contextlib.closing(EventHubsSink(self._settings, self._identity)) as amqp:
            found = amqp.check()
        return f"{found}; records go over HTTPS to {self._endpoint.url}"

    def idle(self) -> float | None:
        """Nothing to send: let go of the kept-alive connection `eventhubs.IDLE_CLOSE` after
        the last send."""
        if self._session is None:
            return None
        unused = time.monotonic() - self._last_send
        if unused < eventhubs.IDLE_CLOSE:
            return eventhubs.IDLE_CLOSE - unused
        self._drop_session()
        log.debug("closed the idle HTTPS connection to %s", self._target())
        return None

    def close(self) -> None:
        self._drop_session()

    def _session_open(self) -> requests.Session:
        if self._session is None:
            import requests  # noqa: PLC0415 - as in _post

            self._session = requests.Session()
        return self._session

    def _drop_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def _target(self) -> str:
        return target(self._settings)


_EMULATOR_HINT = (
    " (UseDevelopmentEmulator=true: the Event Hubs emulator takes AMQP only; set "
    "eventhubs.transport to amqp)"
)


def _parts(run: list[tuple[SpooledRecord, str]]) -> list[list[tuple[SpooledRecord, str]]]:
    """Consecutive items of one VM's run whose JSON list stays within MAX_POST_BYTES."""
    parts: list[list[tuple[SpooledRecord, str]]] = [[]]
    size = 2  # the brackets
    for record, item in run:
        length = len(item.encode("utf-8")) + 1  # and its comma
        if parts[-1] and size + length > MAX_POST_BYTES:
            parts.append([])
            size = 2
        parts[-1].append((record, item))
        size += length
    return parts


def _read(answer: requests.Response) -> str:
    """The answer's body, read at most MAX_ANSWER far (a longer one costs its connection)."""
    import requests  # noqa: PLC0415 - as in EventHubsHttpsSink._post

    chunks: list[bytes] = []
    size = 0
    try:
        for chunk in answer.iter_content(4096):
            chunks.append(chunk)
            size += len(chunk)
            if size >= MAX_ANSWER:
                break
    except requests.RequestException:  # the details are a nicety: the status says what happened
        pass
    return b"".join(chunks)[:MAX_ANSWER].decode("utf-8", errors="replace")

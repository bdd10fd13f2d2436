"""The HTTPS side of the test Event Hubs broker: the service's REST send, on the broker's own port.

Azure takes events over HTTPS as well as AMQP, on the same namespace host (port 443); the broker
answers both on its one port, telling them apart by the client's first bytes (`AMQP`, a TLS
handshake, or an HTTP request line). What it serves, as the service documents it
(learn.microsoft.com/rest/api/eventhub/send-batch-events and send-event):

    POST /hub/messages?api-version=2014-01 HTTP/1.1
    Authorization: SharedAccessSignature sr=...&sig=...&se=...&skn=...   (or Bearer <Entra token>)
    Content-Type: application/vnd.microsoft.servicebus.json
    [{"Body": "{...}", "UserProperties": {"RecordType": "Event"},
      "BrokerProperties": {"PartitionKey": "02aab8a4-..."}}]
    -> 201 Created, empty body

A single event is any other content type: the body is the event, `BrokerProperties` a header.
Each event is stored as the service stores it, an AMQP message (its Body the data section, its
UserProperties the application properties, its PartitionKey the partition key), so the broker's
receivers deliver it like one sent over AMQP. 401 for a bad or missing token, 404 for another hub,
413 past the broker's `max_message_size`, and the broker's scripted failures (`fail_sends`,
`reject_tokens`) as the statuses the service answers (503 server busy, 500, 401).
"""

from __future__ import annotations

import json
import logging
import socket
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, ClassVar, cast
from urllib.parse import unquote, urlsplit

from azure.eventhub._pyamqp import _encode
from azure.eventhub._pyamqp.message import Message

from tests.doubles.eventhubs_amqp import ParsedMessage, parse_message

if TYPE_CHECKING:
    from tests.doubles.eventhubs_broker import EventHubsBroker

_LOG = logging.getLogger(__name__)

BATCH_TYPE = "application/vnd.microsoft.servicebus.json"
MAX_DISCARD = 8 << 20  # bytes of a refused body read and dropped to keep its connection
_STATUS_OF_FAILURE = {
    "com.microsoft:server-busy": 503,
    "amqp:unauthorized-access": 401,
    "amqp:resource-limit-exceeded": 403,
}


def as_message(
    body: str, user_properties: dict[str, Any], partition_key: str | None
) -> ParsedMessage:
    """One event of a REST send as the service keeps it: an AMQP message."""
    annotations: dict[str | bytes, Any] = {}
    if partition_key:
        annotations[b"x-opt-partition-key"] = partition_key
    message = Message(
        data=[body.encode("utf-8")],
        application_properties=cast(dict[str | bytes, Any], user_properties) or None,
        message_annotations=annotations or None,
    )
    output = bytearray()
    _encode.encode_payload(output, message)
    return parse_message(bytes(output))


class RestHandler(BaseHTTPRequestHandler):
    """One HTTP(S) connection to the broker, kept alive, served on its own thread."""

    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection is closed after this long, as a front end does
    server: Any  # the broker: BaseHTTPRequestHandler keeps whatever it is handed as `server`
    statuses: ClassVar[dict[int, str]] = {401: "Unauthorized", 404: "Not Found"}

    @property
    def broker(self) -> EventHubsBroker:
        return self.server  # type: ignore[no-any-return]

    def log_message(self, format: str, *args: Any) -> None:  # the base's name
        _LOG.debug("event hubs broker (https): " + format, *args)

    def do_POST(self) -> None:  # http.server's name
        length = int(self.headers.get("Content-Length") or 0)
        if length > self.broker.max_message_size:
            # Read before answering: a socket closed with a body still unread resets the
            # connection, and the client may lose the 413 in the reset (as it did on a loaded
            # machine). Past MAX_DISCARD, answer and close: no client of these tests sends that.
            if length <= MAX_DISCARD:
                left = length
                while left > 0 and (chunk := self.rfile.read(min(65536, left))):
                    left -= len(chunk)
            else:
                self.close_connection = True
            self._answer(413, "The request body exceeds the maximum message size.")
            return
        body = self.rfile.read(length)
        path = [unquote(part) for part in urlsplit(self.path).path.strip("/").split("/")]
        if len(path) != 2 or path[1].lower() != "messages":
            self._answer(404, f"No such resource: {urlsplit(self.path).path}")
            return
        if path[0] != self.broker.hub:
            self._answer(404, f"The messaging entity '{path[0]}' could not be found.")
            return
        problem = self.broker.http_token(self.headers.get("Authorization") or "", path[0])
        if problem is not None:
            self._answer(401, f"Unauthorized: {problem}")
            return
        try:
            messages, key = self._messages(body)
        except (ValueError, TypeError, AttributeError) as err:
            self._answer(400, f"The request body is not a valid event or batch: {err}")
            return
        failure = self.broker.store(messages, None, key)
        if failure is not None:
            self._answer(_STATUS_OF_FAILURE.get(failure[0], 500), failure[1])
            return
        self._answer(201, "")

    def _messages(self, body: bytes) -> tuple[list[ParsedMessage], str | None]:
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != BATCH_TYPE:
            broker = json.loads(self.headers.get("BrokerProperties") or "{}")
            key = broker.get("PartitionKey")
            return [as_message(body.decode("utf-8"), {}, key)], key
        items = json.loads(body)
        if not isinstance(items, list):
            raise TypeError("a batch is a JSON list of messages")
        messages, keys = [], set()
        for item in items:
            key = (item.get("BrokerProperties") or {}).get("PartitionKey")
            keys.add(key)
            user = item.get("UserProperties") or {}
            if not isinstance(item["Body"], str) or not isinstance(user, dict):
                raise TypeError("Body is a string and UserProperties an object")
            messages.append(as_message(item["Body"], user, key))
        return messages, (next(iter(keys)) if len(keys) == 1 else None)

    def _answer(self, status: int, text: str) -> None:
        data = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        if status == 503:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)


def serve_http(broker: EventHubsBroker, sock: socket.socket, peer: tuple[str, int]) -> None:
    """Serve one HTTP(S) connection until the client closes it or the broker stops."""
    try:
        RestHandler(sock, peer, broker)  # type: ignore[arg-type]  # it only keeps `server`
    except OSError as err:  # the client went, or the broker stopped: the connection is over
        _LOG.debug("https connection from %s ended: %r", peer, err)
    finally:
        sock.close()

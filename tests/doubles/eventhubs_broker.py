"""A small Event Hubs broker for tests: the real azure-eventhub SDK talks AMQP 1.0 to it.

No Event Hubs emulator installs without Docker, so this double speaks just enough of the service:
`$cbs` put-token, `$management` READ of the hub and its partitions, senders to the hub or to
`hub/Partitions/N` (single messages and EventDataBatch transfers, routed by partition key), and
partition receivers (`hub/ConsumerGroups/<cg>/Partitions/N`) that honour the SDK's start position.

    with EventHubsBroker(hub="hub", partitions=4) as broker:
        producer = EventHubProducerClient.from_connection_string(broker.connection_string)
        ...
        broker.events(partition="0")

The connection string carries `UseDevelopmentEmulator=true`: the SDK then speaks plain AMQP (no
TLS) to the host and port of `Endpoint=sb://127.0.0.1:PORT`. The wire side, built on the SDK's own
AMQP codec (private modules of the pinned azure-eventhub==5.15.1), is in `eventhubs_amqp`. The
same port takes the service's REST send over HTTP, and over HTTPS when the broker is given a
certificate (`eventhubs_rest`).

Events are kept across `stop()` / `start()`, which reopens the same port: an outage. Failures can
be scripted: `fail_sends()` rejects the next sends with an AMQP error, `reject_tokens()` answers
the next put-token requests with 401, `hold(partition)` delivers nothing of a partition to its
receivers until `release(partition)` (its events are stored and its properties say so: a
receiver that falls behind). Tokens are recorded (`tokens`), never logged.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import logging
import select
import socket
import ssl
import threading
import time
import zlib
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, quote_plus

from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes

from tests.doubles.eventhubs_amqp import (
    Connection,
    ParsedMessage,
    delivery_payload,
    parse_selector,
)
from tests.doubles.eventhubs_rest import serve_http
from tests.doubles.tls import ServerCertificate

_LOG = logging.getLogger(__name__)

SERVER_BUSY = "com.microsoft:server-busy"  # retryable: the service asks the client to back off
INTERNAL_ERROR = "amqp:internal-error"  # retryable
UNAUTHORIZED = "amqp:unauthorized-access"  # not retryable
_SAS_PREFIX = "SharedAccessSignature "


@dataclass(frozen=True)
class StoredEvent:
    """One event as the broker stored it."""

    body: bytes  # the data sections, joined
    application_properties: dict[str, Any]  # strings come back as str, binary as bytes
    content_type: str | None
    partition_key: str | None
    partition: str  # "0", "1", ...: Event Hubs partition ids are strings
    offset: str  # as the SDK's EventData.offset: pass it as a starting_position as it is
    sequence_number: int
    enqueued_time: datetime
    properties: dict[str, Any] = field(default_factory=dict)  # AMQP properties set, by name
    annotations: dict[str, Any] = field(default_factory=dict)  # message annotations the sender set


@dataclass(frozen=True)
class CbsToken:
    """A token presented on `$cbs` (put-token), and the status the broker answered."""

    audience: str
    token_type: str  # "servicebus.windows.net:sastoken" for SAS, "jwt" for Entra ID
    token: str = field(repr=False)
    status: int = 202


@dataclass(frozen=True)
class _Record:
    event: StoredEvent
    payload: bytes  # the message as a consumer receives it
    enqueued_ms: int


class EventHubsBroker:
    """An AMQP 1.0 listener on `host` (a free port unless `port` is given) serving one event hub."""

    def __init__(
        self,
        hub: str = "hub",
        partitions: int = 4,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        key_name: str = "RootManageSharedAccessKey",
        key: str = "SAS_KEY_VALUE",
        max_message_size: int = 1024 * 1024,  # what Standard tier advertises on a sender link
        max_frame_size: int = 65536,  # a 1 MB batch arrives in many frames
        tls: ServerCertificate | None = None,  # HTTPS too (the REST send), with this certificate
    ) -> None:
        self.hub = hub
        self.host = host
        self.key_name = key_name
        self.key = key
        self.max_message_size = max_message_size
        self.max_frame_size = max_frame_size
        self.partition_ids = [str(i) for i in range(partitions)]
        self._port = port
        self._created_ms = int(time.time() * 1000)
        self._lock = threading.Lock()
        self._records: dict[str, list[_Record]] = {p: [] for p in self.partition_ids}
        self._next_offset = dict.fromkeys(self.partition_ids, 0)
        self._arrival: list[StoredEvent] = []
        self._round_robin = 0
        self._send_failures: deque[tuple[str, str]] = deque()
        self._token_rejections = 0
        self._held: set[str] = set()
        self.partition_reads: Counter[str] = Counter()  # $management READs, by partition
        self._tokens: list[CbsToken] = []
        self._connections: set[Connection] = set()
        self._http: set[socket.socket] = set()
        self._tls = tls.server_context() if tls is not None else None
        self._running = False
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> EventHubsBroker:
        """Listen; after a stop(), on the same port again, with the stored events kept."""
        if self._listener is not None:
            raise RuntimeError("the broker is already running")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((self.host, self._port))
            listener.listen(16)
        except OSError:
            listener.close()
            raise
        self._port = listener.getsockname()[1]
        self._listener = listener
        self._running = True
        self._acceptor = threading.Thread(
            target=self._accept, args=(listener,), name="eventhubs-broker accept", daemon=True
        )
        self._acceptor.start()
        _LOG.debug("event hubs broker listening on %s:%d", self.host, self._port)
        return self

    def stop(self) -> None:
        """Drop every connection and stop listening (an outage: clients see the sockets close)."""
        if self._listener is None:
            return
        self._running = False
        if self._acceptor is not None:
            self._acceptor.join()
        self._listener.close()
        self._listener = None
        with self._lock:
            connections = list(self._connections)
        for connection in connections:  # each closes its own socket within a poll interval
            connection.thread.join(timeout=15)
        with self._lock:
            http = list(self._http)
        for sock in http:  # an HTTP(S) client sees its kept-alive connection end
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        _LOG.debug("event hubs broker on port %d stopped", self._port)

    def __enter__(self) -> EventHubsBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _accept(self, listener: socket.socket) -> None:
        while self._running:
            try:
                readable, _, _ = select.select([listener], [], [], 0.02)
                if not readable:
                    continue
                sock, address = listener.accept()
            except OSError as exc:
                _LOG.debug("accept failed: %r", exc)
                time.sleep(0.02)
                continue
            threading.Thread(
                target=self._serve, args=(sock, address), name="eventhubs-broker", daemon=True
            ).start()

    def _serve(self, sock: socket.socket, address: tuple[str, int]) -> None:
        """AMQP, TLS (then HTTPS) or HTTP, told apart by what the client sends first."""
        try:
            sock.settimeout(10)
            first = sock.recv(1, socket.MSG_PEEK)
        except OSError:
            sock.close()
            return
        if not self._running:  # stopped meanwhile: the outage has begun
            sock.close()
            return
        if first == b"A":  # b"AMQP..."
            connection = Connection(self, sock, f"{address[0]}:{address[1]}")
            with self._lock:
                self._connections.add(connection)
            connection.start()
            return
        with self._lock:
            self._http.add(sock)
        try:
            if first == b"\x16" and self._tls is not None:  # a TLS ClientHello
                with self._tls.wrap_socket(sock, server_side=True) as tls:
                    serve_http(self, tls, address)
            elif first:
                serve_http(self, sock, address)
        except (OSError, ssl.SSLError) as err:
            _LOG.debug("https connection from %s failed: %r", address, err)
        finally:
            sock.close()
            with self._lock:
                self._http.discard(sock)

    # --- the test API -------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://{self.host}:{self._port};SharedAccessKeyName={self.key_name};"
            f"SharedAccessKey={self.key};UseDevelopmentEmulator=true;EntityPath={self.hub}"
        )

    def events(self, partition: str | int | None = None) -> list[StoredEvent]:
        """Stored events of one partition in order, or of all in the order they arrived."""
        with self._lock:
            if partition is None:
                return list(self._arrival)
            return [record.event for record in self._records[str(partition)]]

    @property
    def tokens(self) -> list[CbsToken]:
        with self._lock:
            return list(self._tokens)

    @property
    def connection_count(self) -> int:
        with self._lock:
            return len(self._connections)

    @property
    def sender_connection_count(self) -> int:
        """AMQP connections that attached a sender link to the hub: producers' (agents sending
        over AMQP), not receivers' or management's (a consumer's)."""
        with self._lock:
            return sum(1 for connection in self._connections if connection.sends)

    def fail_sends(
        self, count: int = 1, condition: str = SERVER_BUSY, description: str | None = None
    ) -> None:
        """Reject the next `count` transfers to the hub with `condition` (a rejected disposition,
        as the service answers). azure-eventhub 5.15.1 does not retry a rejected send whatever
        its retry_total, but EventHubProducerClient.send_batch/send_event rebuild the producer
        and send once more after any EventHubError: one failed SDK call is two transfers."""
        text = description or f"Injected by the test broker: {condition}"
        with self._lock:
            self._send_failures.extend([(condition, text)] * count)

    def reject_tokens(self, count: int = 1) -> None:
        """Answer the next `count` put-token requests with 401, as for a wrong key."""
        with self._lock:
            self._token_rejections += count

    # --- what the connections ask (eventhubs_amqp.Hub) ---------------------------------------

    def running(self) -> bool:
        return self._running

    def closed(self, connection: Connection) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _partition(self, partition: str, path: list[str]) -> str:
        if partition not in self._records:
            raise LookupError(f"The messaging entity '{'/'.join(path)}' could not be found.")
        return partition

    def producer_target(self, path: list[str]) -> str | None:
        if path == [self.hub]:
            return None
        if len(path) == 3 and path[:2] == [self.hub, "Partitions"]:
            return self._partition(path[2], path)
        raise LookupError(f"The messaging entity '{'/'.join(path)}' could not be found.")

    def consumer_source(self, path: list[str], selector: str | None) -> tuple[str, int]:
        if len(path) != 5 or path[0] != self.hub or path[1::2] != ["ConsumerGroups", "Partitions"]:
            raise LookupError(f"The messaging entity '{'/'.join(path)}' could not be found.")
        partition = self._partition(path[4], path)
        with self._lock:
            records = list(self._records[partition])
        if selector is None:
            return partition, 0
        name, inclusive, value = parse_selector(selector)
        if value == "@latest":
            return partition, len(records)
        bound = int(value)
        for index, record in enumerate(records):
            if name == "x-opt-offset":
                position = int(record.event.offset)
            elif name == "x-opt-sequence-number":
                position = record.event.sequence_number
            else:
                position = record.enqueued_ms
            if position > bound or (inclusive and position == bound):
                return partition, index
        return partition, len(records)

    def store(
        self, messages: list[ParsedMessage], partition: str | None, batch_key: str | None
    ) -> tuple[str, str] | None:
        with self._lock:
            if self._send_failures:
                failure = self._send_failures.popleft()
                _LOG.debug("rejected a transfer of %d event(s): %s", len(messages), failure[0])
                return failure
            key = batch_key or next((m.partition_key for m in messages if m.partition_key), None)
            if not partition:
                partition = self._route(key)
            enqueued_ms = int(time.time() * 1000)
            records = self._records[partition]
            for message in messages:
                sequence, offset = len(records), self._next_offset[partition]
                added: dict[str, Any] = {
                    "x-opt-sequence-number": {TYPE: AMQPTypes.long, VALUE: sequence},
                    "x-opt-offset": {TYPE: AMQPTypes.string, VALUE: str(offset)},
                    "x-opt-enqueued-time": {TYPE: AMQPTypes.timestamp, VALUE: enqueued_ms},
                }
                if message.partition_key is None and key is not None:
                    added["x-opt-partition-key"] = {TYPE: AMQPTypes.string, VALUE: key}
                payload = delivery_payload(message, added)
                self._next_offset[partition] = offset + len(payload)  # byte offsets, as the service
                content_type = message.properties.get("content_type")
                event = StoredEvent(
                    body=b"".join(message.data),
                    application_properties={
                        str(k): v for k, v in message.application_properties.items()
                    },
                    content_type=None if content_type is None else str(content_type),
                    partition_key=message.partition_key or key,
                    partition=partition,
                    offset=str(offset),
                    sequence_number=sequence,
                    enqueued_time=datetime.fromtimestamp(enqueued_ms / 1000, tz=timezone.utc),
                    properties=dict(message.properties),
                    annotations={str(k): v for k, v in message.annotations.items()},
                )
                records.append(_Record(event, payload, enqueued_ms))
                self._arrival.append(event)
            _LOG.debug("stored %d event(s) in partition %s", len(messages), partition)
            connections = list(self._connections)
        for connection in connections:
            connection.wake()
        return None

    def _route(self, key: str | None) -> str:
        if key is None:
            self._round_robin += 1
            return self.partition_ids[(self._round_robin - 1) % len(self.partition_ids)]
        return self.partition_ids[zlib.crc32(key.encode("utf-8")) % len(self.partition_ids)]

    def payloads(self, partition: str, start: int, limit: int) -> list[bytes]:
        with self._lock:
            if partition in self._held:
                return []
            return [record.payload for record in self._records[partition][start : start + limit]]

    def hold(self, partition: str) -> None:
        """Deliver nothing more of `partition` to its receivers (until `release`)."""
        with self._lock:
            self._held.add(partition)

    def release(self, partition: str) -> None:
        with self._lock:
            self._held.discard(partition)
            connections = list(self._connections)
        for connection in connections:
            connection.wake()

    def http_token(self, authorization: str, hub: str) -> str | None:
        """What is wrong with a REST send's Authorization header, or None; recorded as on $cbs."""
        token_type = (
            "jwt" if authorization.startswith("Bearer ") else "servicebus.windows.net:sastoken"
        )
        if not authorization:
            problem: str | None = "no Authorization header"
        elif token_type == "jwt":
            problem = None if authorization[len("Bearer ") :].strip() else "an empty bearer token"
        else:
            problem = self._check_sas(authorization)
        with self._lock:
            if problem is None and self._token_rejections > 0:
                self._token_rejections -= 1
                problem = "the token was rejected (injected by the test broker)"
            token = authorization.split(" ", 1)[-1] if token_type == "jwt" else authorization
            self._tokens.append(CbsToken(hub, token_type, token, 202 if problem is None else 401))
        return problem

    @property
    def http_connections(self) -> int:
        """HTTP(S) connections open now (REST sends; a client's keep-alive one stays)."""
        with self._lock:
            return len(self._http)

    def put_token(self, request: ParsedMessage) -> tuple[int, str]:
        properties = request.application_properties
        audience, token_type = str(properties.get("name")), str(properties.get("type"))
        token = request.value if isinstance(request.value, str) else str(request.value)
        problem = self._check_sas(token) if token_type.endswith(":sastoken") else None
        with self._lock:
            if problem is None and self._token_rejections > 0:
                self._token_rejections -= 1
                problem = "the token was rejected (injected by the test broker)"
            status = 202 if problem is None else 401
            self._tokens.append(CbsToken(audience, token_type, token, status))
        if problem is None:
            return 202, "Accepted"
        return 401, f"Unauthorized: {problem}"

    def _check_sas(self, token: str) -> str | None:
        if not token.startswith(_SAS_PREFIX):
            return "not a shared access signature"
        fields = dict(parse_qsl(token[len(_SAS_PREFIX) :], keep_blank_values=True))
        if fields.get("skn") != self.key_name:
            return "unknown shared access key name"
        to_sign = f"{quote_plus(fields.get('sr', ''))}\n{fields.get('se', '')}".encode()
        digest = hmac.new(self.key.encode(), to_sign, hashlib.sha256).digest()
        if not hmac.compare_digest(base64.b64encode(digest).decode(), fields.get("sig", "")):
            return "invalid signature"
        if not fields.get("se", "").isdigit() or int(fields["se"]) < time.time():
            return "expired token"
        return None

    def management(self, request: ParsedMessage) -> tuple[int, str, Any]:
        properties = request.application_properties
        name, kind = properties.get("name"), properties.get("type")
        if properties.get("operation") != "READ":
            return 400, f"Unsupported operation {properties.get('operation')!r}", None
        if name != self.hub:
            return 404, f"The messaging entity '{name}' could not be found.", None
        if kind == "com.microsoft:eventhub":
            value = {
                "name": self.hub,
                "type": kind,
                "created_at": {TYPE: AMQPTypes.timestamp, VALUE: self._created_ms},
                "partition_count": {TYPE: AMQPTypes.int, VALUE: len(self.partition_ids)},
                "partition_ids": list(self.partition_ids),
            }
            return 200, "OK", value
        partition = str(properties.get("partition"))
        self.partition_reads[partition] += 1
        if kind != "com.microsoft:partition" or partition not in self._records:
            return 404, f"The partition '{partition}' of '{name}' could not be found.", None
        with self._lock:
            records = list(self._records[partition])
        last = records[-1] if records else None
        value = {
            "name": self.hub,
            "type": kind,
            "partition": partition,
            "begin_sequence_number": {TYPE: AMQPTypes.long, VALUE: 0},
            "last_enqueued_sequence_number": {
                TYPE: AMQPTypes.long,
                VALUE: last.event.sequence_number if last else -1,
            },
            "last_enqueued_offset": last.event.offset if last else "-1",
            "last_enqueued_time_utc": {
                TYPE: AMQPTypes.timestamp,
                VALUE: last.enqueued_ms if last else 0,
            },
            "is_partition_empty": not records,
        }
        return 200, "OK", value

"""AMQP 1.0 wire side of the Event Hubs test broker (the API is in `eventhubs_broker`).

Built on azure-eventhub's own AMQP codec: the private modules `azure.eventhub._pyamqp._decode`,
`_encode`, `performatives`, `endpoints`, `outcomes`, `error`, `message` and `types`. That is
acceptable only because pyproject.toml pins azure-eventhub==5.15.1; a version bump may move them,
and the component tests of the broker will say so.

One `Connection` per client socket, run in its own thread: protocol headers, SASL (ANONYMOUS,
which is what the SDK offers for a SAS or token credential: it authenticates through `$cbs`),
open/begin/attach/flow/transfer/disposition/detach/end/close, multi-frame transfers both ways.
What a node does with a message (store it, answer a token or a READ) is the `Hub`'s business.
"""

from __future__ import annotations

import contextlib
import logging
import re
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlparse

from azure.eventhub._pyamqp import _decode, _encode
from azure.eventhub._pyamqp.endpoints import Source, Target
from azure.eventhub._pyamqp.error import AMQPError
from azure.eventhub._pyamqp.message import Message, Properties
from azure.eventhub._pyamqp.outcomes import Accepted, Rejected
from azure.eventhub._pyamqp.performatives import (
    AttachFrame,
    BeginFrame,
    CloseFrame,
    DetachFrame,
    DispositionFrame,
    EndFrame,
    FlowFrame,
    OpenFrame,
    SASLMechanism,
    SASLOutcome,
    TransferFrame,
)
from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes

_LOG = logging.getLogger(__name__)

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
BATCH_FORMAT = 0x80013700  # the SDK's EventDataBatch: data sections that each hold a message
SELECTOR_FILTER = b"apache.org:selector-filter:string"
_HEARTBEAT = b"\x00\x00\x00\x08\x02\x00\x00\x00"
_WINDOW = 65536
_CREDIT = 1000
_POLL = 0.02  # how often an idle connection looks for new events to deliver, in seconds
_DECODERS: list[Any] = _decode._DECODE_BY_CONSTRUCTOR
_TEXT = frozenset({0xA1, 0xB1, 0xA3, 0xB3})  # str8, str32, sym8, sym32
_PROPERTY_NAMES = Properties._fields


class ProtocolError(Exception):
    """The peer broke the protocol: the connection is dropped."""


def decode_value(buf: memoryview) -> tuple[memoryview, Any]:
    """One AMQP value, as the SDK decodes it except that strings and symbols come back as str
    (the SDK's decoder gives bytes for both, which loses what the sender sent)."""
    code = buf[0]
    if code in _TEXT:
        rest, raw = _DECODERS[code](buf[1:])
        return rest, bytes(raw).decode("utf-8")
    if code not in _COMPOUND:
        decoder = _DECODERS[code]
        if decoder is None:
            raise ProtocolError(f"unknown AMQP constructor 0x{code:02x}")
        result: tuple[memoryview, Any] = decoder(buf[1:])
        return result
    count, start = _compound(buf)
    body = buf[start:]
    items = []
    for _ in range(count):
        body, item = decode_value(body)
        items.append(item)
    if code in (0xC1, 0xD1):
        return body, dict(zip(items[::2], items[1::2], strict=True))
    return body, items


_COMPOUND = frozenset({0xC0, 0xC1, 0xD0, 0xD1})


def _compound(buf: memoryview) -> tuple[int, int]:
    """A list or map's item count (for a map: keys + values) and where its items start."""
    if buf[0] in (0xC0, 0xC1):  # list8, map8: constructor, size, count
        return buf[2], 3
    return int.from_bytes(buf[5:9], "big"), 9  # list32, map32


@dataclass
class ParsedMessage:
    """A received message: decoded for the test API, raw sections kept to deliver it unchanged."""

    header: bytes = b""
    annotations: dict[Any, Any] = field(default_factory=dict)
    annotation_entries: bytes = b""  # the encoded entries of the message-annotations map
    annotation_count: int = 0  # keys + values in it
    properties: dict[str, Any] = field(default_factory=dict)
    application_properties: dict[Any, Any] = field(default_factory=dict)
    data: list[bytes] = field(default_factory=list)
    value: Any = None
    rest: bytes = b""  # properties, application-properties, body and footer, raw and in order

    @property
    def partition_key(self) -> str | None:
        key = self.annotations.get("x-opt-partition-key")
        return None if key is None else str(key)


def parse_message(payload: bytes) -> ParsedMessage:
    message = ParsedMessage()
    rest = bytearray()
    buf = memoryview(payload)
    while buf:
        if buf[0] != 0x00:
            raise ProtocolError("a message section must be a described type")
        if buf[1] == 0x53:  # smallulong descriptor
            code, body = buf[2], buf[3:]
        elif buf[1] == 0x80:  # ulong descriptor
            code, body = int.from_bytes(buf[2:10], "big"), buf[10:]
        else:
            raise ProtocolError("unknown message section descriptor")
        after, decoded = decode_value(body)
        raw = buf[: len(buf) - len(after)].tobytes()
        if code == 0x70:
            message.header = raw
        elif code == 0x72 and decoded:
            message.annotations = decoded
            message.annotation_count, start = _compound(body)
            message.annotation_entries = body[start : len(body) - len(after)].tobytes()
        elif code == 0x73:
            fields = dict(zip(_PROPERTY_NAMES, decoded or [], strict=False))
            message.properties = {k: v for k, v in fields.items() if v is not None}
        elif code == 0x74:
            message.application_properties = decoded or {}
        elif code == 0x75:
            message.data.append(bytes(decoded))
        elif code == 0x77:
            message.value = decoded
        if code not in (0x70, 0x71, 0x72):  # delivery annotations are not passed on
            rest += raw
        buf = after
    message.rest = bytes(rest)
    return message


def parse_transfer(payload: bytes, message_format: int) -> tuple[list[ParsedMessage], str | None]:
    """The events in a transfer, and the partition key of the batch (if one was sent)."""
    outer = parse_message(payload)
    if message_format != BATCH_FORMAT:
        return [outer], outer.partition_key
    return [parse_message(data) for data in outer.data], outer.partition_key


def delivery_payload(message: ParsedMessage, annotations: dict[str, Any]) -> bytes:
    """`message` as a consumer receives it: the sender's sections, plus the broker's annotations
    (typed values: {TYPE: ..., VALUE: ...}) appended to its message annotations."""
    entries = bytearray(message.annotation_entries)
    for key, value in annotations.items():
        _encode.encode_value(entries, {TYPE: AMQPTypes.symbol, VALUE: key})
        _encode.encode_value(entries, value)
    count = message.annotation_count + 2 * len(annotations)
    section = b"\x00\x53\x72\xd1" + struct.pack(">II", len(entries) + 4, count) + entries
    return message.header + section + message.rest


def encode_reply(correlation_id: Any, status: int, description: str, value: Any = None) -> bytes:
    """A `$cbs` / `$management` response in the shape the SDK's ManagementLink reads."""
    message = Message(
        properties=Properties(correlation_id=correlation_id),
        application_properties={
            "status-code": status,
            "status-description": description,
            "statusDescription": description,  # the SDK reads this one for $management
        },
        value=value,
    )
    output = bytearray()
    _encode.encode_payload(output, message)
    return bytes(output)


def entity_path(address: str) -> list[str]:
    """`amqps://host/hub/Partitions/0`, `/hub` or `hub` -> ["hub", "Partitions", "0"]."""
    path = urlparse(address).path if "://" in address else address
    return [part for part in path.split("/") if part]


_SELECTOR = re.compile(
    r"amqp\.annotation\.(x-opt-offset|x-opt-sequence-number|x-opt-enqueued-time)\s*(>=|>)\s*'([^']*)'"
)


def parse_selector(selector: str) -> tuple[str, bool, str]:
    """`amqp.annotation.x-opt-offset > '12'` -> ("x-opt-offset", False, "12"); True if >=."""
    match = _SELECTOR.fullmatch(selector.strip())
    if not match:
        raise ValueError(f"unsupported selector filter: {selector!r}")
    return match.group(1), match.group(2) == ">=", match.group(3)


class Hub(Protocol):
    """What a connection needs from the broker behind it (EventHubsBroker)."""

    @property
    def max_frame_size(self) -> int: ...
    @property
    def max_message_size(self) -> int: ...
    def running(self) -> bool: ...
    def producer_target(self, path: list[str]) -> str | None:
        """The partition a sender link writes to (None: any); raises LookupError if unknown."""
        ...

    def consumer_source(self, path: list[str], selector: str | None) -> tuple[str, int]:
        """(partition, index of the first event to deliver); raises LookupError/ValueError."""
        ...

    def store(
        self, messages: list[ParsedMessage], partition: str, batch_key: str | None
    ) -> tuple[str, str] | None:
        """Store one transfer's events; or (condition, description) to reject it."""
        ...

    def payloads(self, partition: str, start: int, limit: int) -> list[bytes]: ...
    def put_token(self, request: ParsedMessage) -> tuple[int, str]: ...
    def management(self, request: ParsedMessage) -> tuple[int, str, Any]: ...
    def closed(self, connection: Connection) -> None: ...


@dataclass
class _Link:
    name: str
    handle: int
    broker_sends: bool  # the broker is the sender (a consumer or a $cbs/$management reply link)
    node: str  # "$cbs", "$management", "send" (to the hub), "receive" (from a partition)
    partition: str = ""
    settled: bool = False  # how the broker sends: settled, or unsettled (peer settles)
    delivery_count: int = 0
    credit: int = 0
    drain: bool = False
    cursor: int = 0
    replies: deque[bytes] = field(default_factory=deque)
    incoming: bytearray | None = None
    delivery_id: int | None = None
    delivery_settled: bool = False
    message_format: int = 0
    detached: bool = False  # by the broker, with an error: the peer's detach is still to come


@dataclass
class _Session:
    channel: int
    links: dict[int, _Link] = field(default_factory=dict)  # by the peer's handle
    next_handle: int = 0
    next_outgoing_id: int = 0
    next_incoming_id: int = 0


class Connection:
    """One client connection, served by its own thread until the peer closes or the broker stops."""

    def __init__(self, hub: Hub, sock: socket.socket, peer: str) -> None:
        self._hub = hub
        self._sock = sock
        self.peer = peer
        self._buffer = bytearray()
        self._expect_header = True
        self._opened = False
        self._closing = False
        self._peer_max_frame = 2**32 - 1
        self._peer_idle: float | None = None
        self._last_sent = time.monotonic()
        self._sessions: dict[int, _Session] = {}
        self.sends = False  # a sender link to the hub was attached: a producer's connection
        # The service hands a stored event to its receivers at once: `wake` ends the loop's wait
        # (otherwise up to _POLL, which an approval's round trip in benchmark 3 would carry).
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self.thread = threading.Thread(target=self._run, name=f"eventhubs-broker {peer}")
        self.thread.daemon = True

    def start(self) -> None:
        self.thread.start()

    def wake(self) -> None:
        """New events may be waiting for this connection's receivers: deliver them now."""
        # OSError: a wake-up already pending (the pair is full), or the connection ended.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # --- the loop -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._sock.settimeout(10)
            while self._hub.running() and not self._closing:
                readable, _, _ = select.select([self._sock, self._wake_r], [], [], _POLL)
                if self._wake_r in readable:
                    self._wake_r.recv(4096)
                if self._sock in readable:
                    chunk = self._sock.recv(65536)
                    if not chunk:
                        break
                    self._buffer += chunk
                    self._process()
                if self._opened and not self._closing:
                    self._pump()
                    self._heartbeat()
        except Exception as exc:  # a misbehaving client must never take the broker down
            _LOG.debug("connection from %s dropped: %r", self.peer, exc)
        finally:
            self._sock.close()
            self._hub.closed(self)
            self._wake_r.close()
            self._wake_w.close()

    def _process(self) -> None:
        buf = self._buffer
        while not self._closing:
            if len(buf) < 8:
                return
            if self._expect_header:
                header = bytes(buf[:8])
                del buf[:8]
                self._on_header(header)
                continue
            size, doff, frame_type, channel = struct.unpack(">IBBH", buf[:8])
            if size < 8 or doff < 2 or size > max(self._hub.max_frame_size, 512):
                raise ProtocolError(f"bad frame header: size {size}, doff {doff}")
            if len(buf) < size:
                return
            body = bytes(buf[doff * 4 : size])
            del buf[:size]
            if body:  # an empty frame is a heartbeat
                code, fields = _decode.decode_frame(memoryview(body))
                self._on_frame(frame_type, channel, code, fields)

    def _on_header(self, header: bytes) -> None:
        if header == SASL_HEADER:
            self._write(SASL_HEADER)
            mechanisms = SASLMechanism(sasl_server_mechanisms=[b"ANONYMOUS", b"PLAIN", b"MSSBCBS"])
            self._send(0, mechanisms, b"\x01")
        elif header == AMQP_HEADER:
            self._write(AMQP_HEADER)
        else:
            self._write(SASL_HEADER)
            raise ProtocolError(f"unsupported protocol header {header!r}")
        self._expect_header = False

    def _write(self, data: bytes) -> None:
        self._sock.sendall(data)
        self._last_sent = time.monotonic()

    def _send(self, channel: int, frame: Any, frame_type: bytes = b"\x00") -> None:
        header, body = _encode.encode_frame(frame, frame_type)
        self._write(header + struct.pack(">H", channel) + (body or b""))

    def _heartbeat(self) -> None:
        if self._peer_idle and time.monotonic() - self._last_sent >= self._peer_idle / 2:
            self._write(_HEARTBEAT)

    # --- frames -----------------------------------------------------------------------------

    def _on_frame(self, frame_type: int, channel: int, code: int, fields: list[Any]) -> None:
        if frame_type == 1:
            if code != 0x41:  # sasl-init; the only SASL frame a client sends for ANONYMOUS
                raise ProtocolError(f"unexpected SASL frame 0x{code:02x}")
            self._send(0, SASLOutcome(code=0, additional_data=None), b"\x01")
            self._expect_header = True  # the AMQP header follows
            return
        handlers: dict[int, Callable[[int, list[Any]], None]] = {
            0x10: self._on_open,
            0x11: self._on_begin,
            0x12: self._on_attach,
            0x13: self._on_flow,
            0x14: self._on_transfer,
            0x15: lambda _channel, _fields: None,  # disposition: consumers settle; nothing to do
            0x16: self._on_detach,
            0x17: self._on_end,
            0x18: self._on_close,
        }
        if code not in handlers or (code != 0x10 and not self._opened):
            raise ProtocolError(f"unexpected frame 0x{code:02x}")
        if code in (0x10, 0x11, 0x18) or channel in self._sessions:
            handlers[code](channel, fields)
        else:  # the SDK detaches links after it has ended their session: ignore, as the service
            _LOG.debug("ignored frame 0x%02x on channel %d: no session", code, channel)

    def _session(self, channel: int) -> _Session:
        return self._sessions[channel]

    def _on_open(self, _channel: int, fields: list[Any]) -> None:
        self._opened = True
        self._peer_max_frame = fields[2] if len(fields) > 2 and fields[2] else 2**32 - 1
        idle = fields[4] if len(fields) > 4 else None
        self._peer_idle = idle / 1000 if idle else None
        reply = OpenFrame(
            container_id="eventhubs-test-broker",
            hostname=None,
            max_frame_size=self._hub.max_frame_size,
            channel_max=65535,
            idle_timeout=None,
            outgoing_locales=None,
            incoming_locales=None,
            offered_capabilities=None,
            desired_capabilities=None,
            properties=None,
        )
        self._send(0, reply)

    def _on_begin(self, channel: int, fields: list[Any]) -> None:
        self._sessions[channel] = _Session(channel, next_incoming_id=fields[1] or 0)
        reply = BeginFrame(
            remote_channel=channel,
            next_outgoing_id=0,
            incoming_window=_WINDOW,
            outgoing_window=_WINDOW,
            handle_max=65535,
            offered_capabilities=None,
            desired_capabilities=None,
            properties=None,
        )
        self._send(channel, reply)

    def _on_attach(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        fields = fields + [None] * (14 - len(fields))
        name, handle, peer_receives = fields[0].decode(), fields[1], bool(fields[2])
        source, target = fields[5] or [None], fields[6] or [None]
        address = (source if peer_receives else target)[0]
        address = address.decode() if isinstance(address, bytes) else str(address)
        link = _Link(name, session.next_handle, broker_sends=peer_receives, node=address)
        link.settled = fields[3] == 1  # sender-settle-mode the peer asked for: settled
        link.delivery_count = 0 if peer_receives else (fields[9] or 0)
        session.next_handle += 1
        error: AMQPError | None = None
        try:
            self._classify(link, address, source)
        except (LookupError, ValueError) as exc:
            error = AMQPError(condition=b"amqp:not-found", description=str(exc), info=None)
        session.links[handle] = link
        link.detached = error is not None
        reply = AttachFrame(
            name=name,
            handle=link.handle,
            role=not peer_receives,
            send_settle_mode=fields[3],
            rcv_settle_mode=fields[4],
            source=Source(source[0], *[None] * 10),
            target=Target(target[0], *[None] * 6),
            unsettled=None,
            incomplete_unsettled=None,
            initial_delivery_count=0 if peer_receives else None,
            max_message_size=self._hub.max_message_size,
            offered_capabilities=None,
            desired_capabilities=None,
            properties=None,
        )
        self._send(channel, reply)
        if error is not None:  # as the service: attached, then detached with the reason
            self._send(channel, DetachFrame(handle=link.handle, closed=True, error=error))
        elif not peer_receives:
            link.credit = _CREDIT
            self._flow(session, link)

    def _classify(self, link: _Link, address: str, source: list[Any]) -> None:
        if address in ("$cbs", "$management"):
            return
        path = entity_path(address)
        if link.broker_sends:
            filters = source[7] if len(source) > 7 and source[7] else {}
            selector = filters.get(SELECTOR_FILTER)
            if isinstance(selector, bytes):
                selector = selector.decode()
            link.node = "receive"
            link.partition, link.cursor = self._hub.consumer_source(path, selector)
        else:
            link.node = "send"
            link.partition = self._hub.producer_target(path) or ""
            self.sends = True

    def _flow(self, session: _Session, link: _Link) -> None:
        frame = FlowFrame(
            next_incoming_id=session.next_incoming_id,
            incoming_window=_WINDOW,
            next_outgoing_id=session.next_outgoing_id,
            outgoing_window=_WINDOW,
            handle=link.handle,
            delivery_count=link.delivery_count,
            link_credit=link.credit,
            available=None,
            drain=link.drain,
            echo=None,
            properties=None,
        )
        self._send(session.channel, frame)

    def _on_flow(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        fields = fields + [None] * (11 - len(fields))
        link = session.links.get(fields[4]) if fields[4] is not None else None
        if link is None or link.detached:
            return
        if link.broker_sends:
            peer_count = link.delivery_count if fields[5] is None else fields[5]
            link.credit = peer_count + (fields[6] or 0) - link.delivery_count
            link.drain = bool(fields[8])
        if fields[9]:  # echo
            self._flow(session, link)

    def _on_transfer(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        chunk, fields = fields[-1], fields[:-1] + [None] * (12 - len(fields))
        link = session.links.get(fields[0])
        if link is not None and link.broker_sends:
            raise ProtocolError("transfer on a link the client does not send on")
        if link is None or link.detached:  # sent before the client saw the detach: discarded
            _LOG.debug("discarded a transfer on detached handle %r", fields[0])
            return
        if link.incoming is None:
            link.incoming = bytearray()
            link.delivery_id = fields[1]
            link.delivery_settled = bool(fields[4])
            link.message_format = fields[3] or 0
        if fields[1] is not None:
            session.next_incoming_id = fields[1] + 1
        if len(link.incoming) <= self._hub.max_message_size:  # beyond that it is rejected anyway
            link.incoming += chunk
        if fields[5] and not fields[9]:  # more, not aborted
            return
        payload, link.incoming = bytes(link.incoming), None
        if fields[9]:
            return
        link.delivery_count += 1
        link.credit -= 1
        if link.credit <= _CREDIT // 2:
            link.credit = _CREDIT
            self._flow(session, link)
        error = self._deliver(session, link, payload)
        if not link.delivery_settled:
            state = Accepted() if error is None else Rejected(error=error)
            disposition = DispositionFrame(
                role=True,
                first=link.delivery_id,
                last=None,
                settled=True,
                state=state,
                batchable=None,
            )
            self._send(channel, disposition)

    def _deliver(self, session: _Session, link: _Link, payload: bytes) -> AMQPError | None:
        _LOG.debug("transfer of %d bytes to %s", len(payload), link.node)
        if len(payload) > self._hub.max_message_size:
            return AMQPError(
                condition=b"amqp:link:message-size-exceeded",
                description=f"The received message ({len(payload)} bytes) exceeds the limit "
                f"({self._hub.max_message_size} bytes) currently allowed on the link.",
                info=None,
            )
        try:
            messages, batch_key = parse_transfer(payload, link.message_format)
        except Exception as exc:
            return AMQPError(condition=b"amqp:decode-error", description=str(exc), info=None)
        if link.node == "send":
            failure = self._hub.store(messages, link.partition, batch_key)
            if failure is None:
                return None
            condition, description = failure
            return AMQPError(condition=condition.encode(), description=description, info=None)
        request = messages[0]
        if link.node == "$cbs":
            status, description = self._hub.put_token(request)
            value = None
        else:
            status, description, value = self._hub.management(request)
        reply = encode_reply(request.properties.get("message_id"), status, description, value)
        for other in session.links.values():
            if other.broker_sends and other.node == link.node:
                other.replies.append(reply)
                break
        return None

    def _on_detach(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        link = session.links.pop(fields[0], None)
        if link is not None and not link.detached:
            closed = bool(fields[1]) if len(fields) > 1 else False
            self._send(channel, DetachFrame(handle=link.handle, closed=closed, error=None))

    def _on_end(self, channel: int, _fields: list[Any]) -> None:
        self._sessions.pop(channel, None)
        self._send(channel, EndFrame(error=None))

    def _on_close(self, _channel: int, _fields: list[Any]) -> None:
        self._send(0, CloseFrame(error=None))
        self._closing = True

    # --- deliveries from the broker ---------------------------------------------------------

    def _pump(self) -> None:
        for session in list(self._sessions.values()):
            for link in list(session.links.values()):
                if not link.broker_sends or link.detached:
                    continue
                if link.replies:
                    while link.credit > 0 and link.replies:
                        self._transfer(session, link, link.replies.popleft())
                elif link.node == "receive" and link.credit > 0:
                    for payload in self._hub.payloads(link.partition, link.cursor, link.credit):
                        self._transfer(session, link, payload)
                        link.cursor += 1
                if link.drain and link.credit > 0:
                    link.delivery_count += link.credit
                    link.credit = 0
                    self._flow(session, link)

    def _transfer(self, session: _Session, link: _Link, payload: bytes) -> None:
        frame = TransferFrame(
            handle=link.handle,
            delivery_id=session.next_outgoing_id,
            delivery_tag=struct.pack(">I", link.delivery_count),
            message_format=0,
            settled=link.settled,
            more=True,
            payload=b"",
        )
        overhead = len(_encode.encode_frame(frame)[1] or b"") + 8
        room = max(self._peer_max_frame - overhead, 512)
        for start in range(0, max(len(payload), 1), room):
            chunk = payload[start : start + room]
            more = start + room < len(payload)
            self._send(session.channel, frame._replace(more=more, payload=chunk))
        session.next_outgoing_id += 1
        link.delivery_count += 1
        link.credit -= 1

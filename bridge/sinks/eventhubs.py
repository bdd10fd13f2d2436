"""`eventhubs`: records to Azure Event Hubs, the stream the central consumer reads, over AMQP
(`eventhubs.transport = "amqp"`; the default, HTTPS, is bridge.sinks.eventhubs_https, which shares
the routing and the advice below).

Partition key = VmId (the host name until the VmId is known), so one VM's records stay in
order. Batches come from the SDK's batch API, so they fit the hub's real size limit (1 MB
on Standard and above, 256 KB on Basic). Each event carries application properties a
consumer can route on without parsing the body, and content type application/json.

An event as it leaves (body = the record's JSON text):
    properties: {"RecordType": "Event", "SchemaVersion": 1, "VmId": "02aab8a4-..."}
    content_type: application/json      partition_key: 02aab8a4-...
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from bridge.cloud import advice, identity
from bridge.cloud.identity import Identity
from bridge.recordtypes import RECORD_TYPE
from bridge.redact import describe
from bridge.retry import DeliveryError, PermanentError, PoisonRecords, RetryableError
from bridge.sinks.base import BaseSink, SpooledRecord

log = logging.getLogger(__name__)

# An idle agent sends a heartbeat every few minutes: its AMQP connection is closed this long
# after its last send (the delivery loop looks again when `idle` asks it to) and opened again
# for the next. Held open, every agent of the fleet counts against the namespace's connection
# quota (5,000 on Standard): for ever, 5,000 VMs; for a minute after each 5-minute heartbeat,
# 25,000; for 5 s, about 300,000 (docs/capacity.md#azure-quotas). 5 s still carries the
# records of one transition (an event, its hook, its approval) over one connection.
IDLE_CLOSE = 5.0

if TYPE_CHECKING:
    from azure.eventhub import EventData, EventDataBatch, EventHubProducerClient


class EventHub(Protocol):
    """Which event hub (config's `eventhubs` section is one): a namespace and a name, reached
    with Entra ID, or a connection string."""

    @property
    def namespace(self) -> str:
        """The namespace's host name, as in contoso.servicebus.windows.net."""

    @property
    def name(self) -> str:
        """The event hub's name (may be left to the connection string's EntityPath)."""

    @property
    def connection_string(self) -> str:
        """A connection string (a shared access key) instead of Entra ID; "" for none."""


class EventHubsSink(BaseSink):
    """Sends batches with one producer, created at the first send and kept open."""

    # Records read from the spool per send: a backlog costs few round trips and few
    # acknowledgements (500 made a 100-VM backlog drain at a third of the speed), while
    # `_send_by_key` keeps only one SDK batch (at most 1 MB) per VM in memory.
    max_batch = 5000

    def __init__(self, hub: EventHub, identity: Identity) -> None:
        self._settings = hub
        self._identity = identity
        self._producer: EventHubProducerClient | None = None
        self._last_send = 0.0  # time.monotonic() of the last batch sent

    @property
    def name(self) -> str:
        return "eventhubs"

    def idle(self) -> float | None:
        """Nothing to send: close the connection once it has been unused for IDLE_CLOSE.

        azure-eventhub's own idle_timeout only acts at the next send, so the connection of
        an idle producer would stay open; this closes it (the next send opens another).
        Returns the seconds until the connection is due to close, or None once it is closed.
        """
        if self._producer is None:
            return None
        unused = time.monotonic() - self._last_send
        if unused < IDLE_CLOSE:
            return IDLE_CLOSE - unused
        producer, self._producer = self._producer, None
        with contextlib.suppress(Exception):  # closing a broken connection: it is gone anyway
            producer.close()
        log.debug("closed the idle Event Hubs connection to %s", self._target())
        return None

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        try:
            self._send_by_key(batch)
        except DeliveryError:
            raise
        except Exception as err:
            raise self._classify(err) from err

    def _send(self, events: EventDataBatch, seqs: list[int]) -> None:
        try:
            self._get_producer().send_batch(events)
            self._last_send = time.monotonic()
        except Exception as err:
            if "message-size-exceeded" in str(getattr(err, "error", "")):
                # The hub's limit is below what the link advertised: these records never fit.
                raise PoisonRecords(f"{self._target()} refused a batch as too large", seqs) from err
            raise

    def check(self) -> str:
        """A harmless real round trip: authenticate and open a sender link, send nothing."""
        try:
            size = self._get_producer().create_batch().max_size_in_bytes
        except Exception as err:
            raise self._classify(err) from err
        return f"Event Hubs accepted a sender for {self._target()} (batches up to {size} bytes)"

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None

    def _send_by_key(self, batch: Sequence[SpooledRecord]) -> None:
        """One SDK batch per partition key at a time, sent when full, the rest at the end.

        Grouped by key, not only by run: a backlog that interleaves VMs (records from before
        the VmId was known, a relay) would otherwise cost one round trip per record. Each
        key's records keep their spool order, which is all per-VM order needs; only one
        full batch per key is held, so one VM's backlog never sits in memory whole.
        """
        open_batches: dict[str, tuple[EventDataBatch, list[int]]] = {}
        for record in batch:
            event, key = _event(record)
            current = open_batches.get(key)
            if current is not None and _fits(current[0], event):
                current[1].append(record.seq)
                continue
            fresh = self._new_batch(key)
            if not _fits(fresh, event):
                raise PoisonRecords(
                    f"record {record.record_id} is larger than an Event Hubs batch "
                    f"({fresh.max_size_in_bytes} bytes) on {self._target()}",
                    [record.seq],
                )
            if current is not None:
                self._send(*current)  # full: it goes before this key's next records
            open_batches[key] = (fresh, [record.seq])
        for events, seqs in open_batches.values():
            self._send(events, seqs)

    def _new_batch(self, key: str) -> EventDataBatch:
        return self._get_producer().create_batch(partition_key=key)

    def _get_producer(self) -> EventHubProducerClient:
        if self._producer is None:
            self._producer = self._open()
        return self._producer

    def _open(self) -> EventHubProducerClient:
        from azure.eventhub import EventHubProducerClient  # noqa: PLC0415

        s = self._settings
        # Retries are the delivery loop's (jittered, never giving up); keep the SDK's short.
        options: dict[str, Any] = {"retry_total": 1, "logging_enable": False}
        if s.connection_string:
            return EventHubProducerClient.from_connection_string(
                s.connection_string, eventhub_name=s.name or None, **options
            )
        return EventHubProducerClient(
            s.namespace, s.name, identity.credential(self._identity), **options
        )

    def _classify(self, err: BaseException) -> DeliveryError:
        from azure.eventhub import exceptions  # noqa: PLC0415

        text = describe(err, with_type=True)
        where = self._target()
        if isinstance(err, exceptions.AuthenticationError) or "unauthorized" in text.lower():
            return PermanentError(
                f"Event Hubs refused {where}: {grant_advice(self._settings, self._identity)} "
                f"({text})"
            )
        if "not-found" in text.lower() or "notfound" in text.lower():
            return PermanentError(
                f"{where} does not exist: check eventhubs.namespace and eventhubs.name ({text})"
            )
        if type(err).__name__ in ("CredentialUnavailableError", "ClientAuthenticationError"):
            return PermanentError(f"no token for Event Hubs ({text}); {advice.CREDENTIAL_ADVICE}")
        return RetryableError(f"cannot reach or send to {where}: {text}")

    def _target(self) -> str:
        return target(self._settings)


def target(hub: EventHub) -> str:
    """The event hub as errors name it."""
    if hub.connection_string:
        return f"event hub {hub.name or '(from the connection string)'}"
    return f"event hub {hub.name} in {hub.namespace}"


def grant_advice(hub: EventHub, who: Identity) -> str:
    """What to grant when Event Hubs refuses the sender."""
    if hub.connection_string:
        return "give the connection string's policy the Send right"
    return f"grant {identity.describe(who)} the Azure Event Hubs Data Sender role on the event hub"


def routing(record: SpooledRecord) -> tuple[str, dict[str, Any]]:
    """A record's partition key and the application properties it travels with (both
    transports; docs/contracts.md#record, Delivery)."""
    body = json.loads(record.body)
    key = body.get("VmId") or f"host:{body.get('HostName')}"
    return key, {
        RECORD_TYPE: record.record_type,
        "SchemaVersion": body.get("SchemaVersion"),
        "VmId": body.get("VmId") or "",
        "RecordId": record.record_id,
    }


def _event(record: SpooledRecord) -> tuple[EventData, str]:
    from azure.eventhub import EventData  # noqa: PLC0415

    key, properties = routing(record)
    event = EventData(record.body)
    event.content_type = "application/json"
    event.properties = cast(dict[str | bytes, Any], properties)
    return event, key


def _fits(batch: EventDataBatch, event: EventData) -> bool:
    try:
        batch.add(event)
    except ValueError:  # the SDK's way of saying the batch is full
        return False
    return True


def check_hub(settings: EventHub) -> None:
    """ValueError naming the setting unless `settings` name one event hub and how to reach it."""
    if settings.connection_string:
        if "endpoint=" not in settings.connection_string.lower():
            raise ValueError(
                "eventhubs.connection_string is not a connection string (no Endpoint=)"
            )
        return
    if not (settings.namespace and settings.name):
        raise ValueError(
            "the eventhubs sink needs eventhubs.namespace and eventhubs.name (Entra ID auth), "
            "or eventhubs.connection_string (SE_BRIDGE_EVENTHUBS_NAMESPACE, ..._NAME, "
            "..._CONNECTION_STRING)"
        )
    if "://" in settings.namespace or "/" in settings.namespace:
        raise ValueError(
            f"eventhubs.namespace: give the host name only, such as "
            f"contoso.servicebus.windows.net, got {settings.namespace!r}"
        )

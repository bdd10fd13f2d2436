"""`loganalytics`: records to a Log Analytics table through the Logs Ingestion API.

Each record goes to the data collection rule's stream, shaped to the stream declaration
generated from the record schema (bridge.schema.dcr_stream_declaration). The SDK splits a
batch into gzip chunks of at most 1 MB; a chunk that fails comes back through `on_error`
and its records return to the spool (retried) or, when the service rejects them as
malformed, to the dead-letter table.

A data collection rule takes 12,000 requests a minute. Where Azure shows an event to every VM
of a placement group or availability set, 100 VMs report each one, and an upload per record
burst would need dozens of rules at 100,000 VMs (benchmarks/quotas.md). So after an upload,
what can wait (heartbeats, events that do not affect this VM) waits up to
`loganalytics.send_interval` to go with the next one; this VM's own events, approvals and
hook records go at once, as they did, also because a Spot VM may be gone 30 s after its
Preempt is scheduled.

A request the SDK sends (api-version 2023-01-01):
    POST {endpoint}/dataCollectionRules/dcr-00000000000000000000000000000000/streams/
         Custom-SeBridgeRecords?api-version=2023-01-01
    Authorization: Bearer eyJ0eXAi...      Content-Encoding: gzip
    [{"SchemaVersion": 1, "RecordId": "...", "RecordType": "Event", "TimeGenerated": ...}]
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from bridge import schema
from bridge.cloud import identity
from bridge.cloud.advice import CREDENTIAL_ADVICE
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
from bridge.sinks.base import BaseSink, SpooledRecord

if TYPE_CHECKING:
    from azure.monitor.ingestion import LogsIngestionClient, LogsUploadError


SCOPE = "https://monitor.azure.com/.default"
# The service refuses bodies over 1 MiB, and the SDK's chunking forgets the commas and
# brackets between records, so a full chunk can overshoot: each upload stays well below.
MAX_UPLOAD_BYTES = 900 * 1024


def _parts(batch: Sequence[SpooledRecord]) -> list[list[SpooledRecord]]:
    """Consecutive runs of records whose JSON adds up to at most MAX_UPLOAD_BYTES."""
    parts: list[list[SpooledRecord]] = [[]]
    size = 0
    for record in batch:
        cost = len(record.body.encode("utf-8")) + 2
        if parts[-1] and size + cost > MAX_UPLOAD_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(record)
        size += cost
    return [part for part in parts if part]


class Rule(Protocol):
    """Where the records go (config's `loganalytics` section is one): a data collection rule's
    stream behind a data collection endpoint, and how long what can wait may wait."""

    @property
    def endpoint(self) -> str:
        """The endpoint's https:// URL."""

    @property
    def rule_id(self) -> str:
        """The rule's immutable id (dcr-...)."""

    @property
    def stream(self) -> str:
        """The stream declared in the rule."""

    @property
    def send_interval(self) -> float:
        """Seconds what can wait waits for the next upload (the module's docstring)."""


class LogAnalyticsSink(BaseSink):
    """Uploads batches to one DCR stream; the SDK client is created at the first send."""

    max_batch = 300  # well under one 1 MB chunk, so a failed batch is rarely re-sent in part

    def __init__(self, rule: Rule, identity: Identity) -> None:
        self._settings = rule
        self._identity = identity
        self._columns = {c["name"] for c in schema.dcr_stream_declaration()["columns"]}
        self._client: LogsIngestionClient | None = None
        self.send_interval = self._settings.send_interval

    @property
    def name(self) -> str:
        return "loganalytics"

    # A heartbeat, and a neighbour's event as the agent normalises it:
    #   {"RecordType": "Heartbeat", "HeartbeatReason": "Periodic", ...}
    #   {"RecordType": "Event", "EventId": "...", "AffectsThisVm": false, ...}
    def can_wait(self, record: SpooledRecord) -> bool:
        """Whether `record` may wait for the next upload (see the module's docstring)."""
        if record.record_type == "Heartbeat":
            return True
        if record.record_type != "Event":
            return False
        try:
            body = json.loads(record.body)
        except ValueError:
            return False  # sent at once; the upload says what is wrong with it
        return isinstance(body, dict) and body.get("AffectsThisVm") is False

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        for part in _parts(batch):
            self._upload(part)

    def _upload(self, batch: Sequence[SpooledRecord]) -> None:
        logs: list[MutableMapping[str, Any]] = [self._shaped(record.body) for record in batch]
        failures: list[LogsUploadError] = []
        try:
            self._get_client().upload(
                self._settings.rule_id, self._settings.stream, logs, on_error=failures.append
            )
        except Exception as err:  # raised outside a chunk: credential or client set-up
            raise self._classify(err) from err
        if failures:
            self._raise_for(failures, batch, logs)

    def check(self) -> str:
        """A harmless real round trip: an empty array, accepted and storing nothing."""
        empty = io.BytesIO(gzip.compress(b"[]"))
        try:
            self._get_client().upload(self._settings.rule_id, self._settings.stream, empty)
        except Exception as err:
            raise self._classify(err) from err
        return f"Logs Ingestion API accepted a request for {self._target()}"

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _get_client(self) -> LogsIngestionClient:
        if self._client is None:
            from azure.monitor.ingestion import LogsIngestionClient  # noqa: PLC0415

            # Retries are the delivery loop's, which honours Retry-After with jitter and never
            # gives up; the SDK's own would only add a second, hidden retry layer.
            self._client = LogsIngestionClient(
                self._settings.endpoint,
                identity.credential(self._identity),
                retry_total=0,
                credential_scopes=[SCOPE],
            )
        return self._client

    def _shaped(self, body: str) -> dict[str, object]:
        record: dict[str, object] = json.loads(body)
        # Exactly the declared columns: a column the DCR does not declare would be refused.
        return {k: v for k, v in record.items() if k in self._columns}

    def _raise_for(
        self,
        failures: list[LogsUploadError],
        batch: Sequence[SpooledRecord],
        logs: list[MutableMapping[str, Any]],
    ) -> None:
        errors = [self._classify(failure.error) for failure in failures]
        poison = [e for e in errors if isinstance(e, PoisonRecords)]
        if not poison:
            raise max(errors, key=_severity)
        failed = {
            id(log)
            for f, e in zip(failures, errors, strict=True)
            if e in poison
            for log in f.failed_logs
        }
        suspects = [(r, log) for r, log in zip(batch, logs, strict=True) if id(log) in failed]
        self._isolate(suspects, str(poison[0]))

    def _isolate(
        self, suspects: list[tuple[SpooledRecord, MutableMapping[str, Any]]], reason: str
    ) -> None:
        """Upload a rejected chunk's records one by one to tell poison from a mis-deployed DCR."""
        rejected: list[int] = []
        for record, log in suspects:
            singles: list[LogsUploadError] = []
            self._get_client().upload(
                self._settings.rule_id, self._settings.stream, [log], on_error=singles.append
            )
            if singles:
                if not isinstance(self._classify(singles[0].error), PoisonRecords):
                    raise self._classify(singles[0].error)
                rejected.append(record.seq)
        if len(rejected) == len(suspects) > 1:
            # Every record refused on its own: the DCR does not match, not the records.
            raise PermanentError(reason)
        if not rejected:
            raise RetryableError(
                f"the Logs Ingestion API accepted on retry what it refused: {reason}"
            )
        raise PoisonRecords(reason, rejected)

    def _classify(self, err: BaseException) -> DeliveryError:
        status = getattr(getattr(err, "response", None), "status_code", None) or getattr(
            err, "status_code", None
        )
        text = describe(err, with_type=True)
        if isinstance(status, int):
            return self._for_status(status, err, text)
        if type(err).__name__ in ("CredentialUnavailableError", "ClientAuthenticationError"):
            return PermanentError(
                f"no token for the Logs Ingestion API ({text}); {CREDENTIAL_ADVICE}"
            )
        return RetryableError(f"cannot reach the Logs Ingestion API at {self._target()}: {text}")

    def _for_status(self, status: int, err: BaseException, text: str) -> DeliveryError:
        target = self._target()
        if status == 429:
            headers: Mapping[str, str] = getattr(getattr(err, "response", None), "headers", {})
            retry_after = parse_retry_after(headers.get("Retry-After"))
            return ThrottledError(f"429 from the Logs Ingestion API for {target}", retry_after)
        if status in (400, 413):
            return PoisonRecords(
                f"{status} from the Logs Ingestion API: the records do not fit the stream "
                f"declaration of {target} ({text}); redeploy infra/ from this version of se-bridge",
                [],
            )
        advice = {
            401: f"the token was refused; {CREDENTIAL_ADVICE}",
            403: f"grant {identity.describe(self._identity)} the Monitoring Metrics Publisher "
            f"role on the data collection rule {self._settings.rule_id}",
            404: "check loganalytics.endpoint, loganalytics.rule_id (the DCR's immutable id) and "
            "loganalytics.stream",
        }.get(status)
        if advice:
            return PermanentError(f"{status} from the Logs Ingestion API for {target}: {advice}")
        return RetryableError(f"{status} from the Logs Ingestion API for {target}: {text}")

    def _target(self) -> str:
        s = self._settings
        return f"rule {s.rule_id}, stream {s.stream} at {s.endpoint}"


def _severity(err: DeliveryError) -> int:
    # Report the failure a person must act on before the ones that heal by themselves.
    return 2 if isinstance(err, PermanentError) else 1 if isinstance(err, ThrottledError) else 0


def check_settings(settings: Rule, user: str) -> None:
    """ValueError unless `user` (what uploads) has every Logs Ingestion setting it needs."""
    missing = [k for k in ("endpoint", "rule_id", "stream") if not getattr(settings, k)]
    if missing:
        names = ", ".join(f"loganalytics.{k}" for k in missing)
        env = ", ".join(f"SE_BRIDGE_LOGANALYTICS_{k.upper()}" for k in missing)
        raise ValueError(f"{user} needs {names} ({env})")
    if not settings.endpoint.lower().startswith("https://"):
        raise ValueError(
            f"loganalytics.endpoint must be an https:// URL, got {settings.endpoint!r}"
        )

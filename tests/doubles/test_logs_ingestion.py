"""The Logs Ingestion double, driven by the real SDK (azure-monitor-ingestion 1.1.0 on azure-core's
requests transport) over TLS that the SDK really verifies.

Besides proving the double, these tests pin what the SDK does that se-bridge's Log Analytics
sink relies on: which exception each failure raises, what `on_error` receives, which statuses
azure-core retries for a POST (and that it honours Retry-After), and how it chunks.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import certifi
import pytest
import requests
from azure.core.credentials import AccessToken
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
)
from azure.core.pipeline.transport import RequestsTransport
from azure.monitor.ingestion import LogsIngestionClient, LogsUploadError

from bridge import schema
from tests.doubles.logs_ingestion import API_VERSION, LogsIngestionDouble, value_problem
from tests.support.records import event_record
from tests.support.wait import eventually

RULE = "dcr-00000000000000000000000000000001"
STREAM = schema.DCR_STREAM
PATH = f"/dataCollectionRules/{RULE}/streams/{STREAM}?api-version={API_VERSION}"
MiB = 1024 * 1024

# What LogsIngestionClient.upload is typed to take (a list is invariant: list[dict] is refused).
Logs = list[MutableMapping[str, Any]]


class StaticCredential:
    """A TokenCredential that hands out "token-1", "token-2", ... one per call."""

    def __init__(self) -> None:
        self.calls = 0
        self.scopes: list[tuple[str, ...]] = []

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        self.calls += 1
        self.scopes.append(scopes)
        return AccessToken(f"token-{self.calls}", int(time.time()) + 3600)


@pytest.fixture
def double() -> Iterator[LogsIngestionDouble]:
    with LogsIngestionDouble(RULE, STREAM, schema.dcr_stream_declaration()) as served:
        yield served


@pytest.fixture
def trusted(double: LogsIngestionDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trust the double's CA the way production configuration would: the environment."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(double.ca_bundle))
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


MakeClient = Callable[..., LogsIngestionClient]


@pytest.fixture
def make_client(double: LogsIngestionDouble) -> Iterator[MakeClient]:
    clients: list[LogsIngestionClient] = []

    def make(credential: StaticCredential | None = None, **kwargs: Any) -> LogsIngestionClient:
        # Small back-off keeps the retry tests fast; Retry-After still rules when it is sent.
        kwargs.setdefault("retry_backoff_factor", 0.01)
        client = LogsIngestionClient(double.endpoint, credential or StaticCredential(), **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def records(count: int, **extra: Any) -> Logs:
    return [event_record(rid=f"rec-{i:05d}", **extra) for i in range(count)]


def statuses(double: LogsIngestionDouble) -> list[int]:
    return [request.status for request in double.requests]


# --- what the SDK sends, and the happy path --------------------------------------------------


@pytest.mark.usefixtures("trusted")
def test_valid_records_are_stored_exactly_as_sent(
    double: LogsIngestionDouble, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    credential = StaticCredential()
    sent = [*records(3), event_record(rid="rec-nulls", PreviousStatus=None, ChangedFields=None)]
    make_client(credential).upload(RULE, STREAM, sent)

    assert double.records() == sent
    (request,) = double.requests
    assert (request.method, request.path, request.status) == ("POST", PATH, 204)
    assert request.content_encoding == "gzip"
    assert request.record_count == len(sent)
    assert request.uncompressed_size == len(json.dumps(sent).encode())
    assert request.size < request.uncompressed_size  # really compressed
    assert double.tokens_seen == ["token-1"]
    assert credential.scopes == [("https://monitor.azure.com/.default",)]
    assert "token-1" not in repr(double.requests)  # the request log never holds a token
    assert "token-1" not in caplog.text  # nor does the double's logging


@pytest.mark.usefixtures("trusted")
def test_an_uncompressed_stream_is_accepted_too(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    # An I/O object goes up as it is: plain JSON, no Content-Encoding. The service takes it.
    sent = records(2)
    make_client().upload(RULE, STREAM, io.BytesIO(json.dumps(sent).encode()))
    assert double.records() == sent
    assert double.requests[0].content_encoding is None


@pytest.mark.usefixtures("trusted")
def test_concurrent_uploads_are_all_stored(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    def upload(worker: int) -> None:
        client = make_client()
        for batch in range(5):
            batch_records: Logs = [event_record(rid=f"w{worker}-b{batch}")]
            client.upload(RULE, STREAM, batch_records)

    threads = [threading.Thread(target=upload, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    stored = [record["RecordId"] for record in double.records()]
    assert sorted(stored) == sorted(f"w{w}-b{b}" for w in range(4) for b in range(5))
    for worker in range(4):  # each sender's own order is kept
        mine = [rid for rid in stored if rid.startswith(f"w{worker}-")]
        assert mine == [f"w{worker}-b{b}" for b in range(5)]


@pytest.mark.usefixtures("trusted")
def test_other_streams_and_rules_are_stored_apart(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    declaration = {"columns": [{"name": "TimeGenerated", "type": "datetime"}]}
    double.add_stream(RULE, "Custom-Other", declaration)
    double.add_stream("dcr-second", STREAM, schema.dcr_stream_declaration())
    client = make_client()
    other: Logs = [{"TimeGenerated": "2024-05-01T10:00:00Z"}]
    client.upload(RULE, "Custom-Other", other)
    client.upload("dcr-second", STREAM, records(1))
    client.upload(RULE, STREAM, records(2))

    assert double.records(stream="Custom-Other") == [{"TimeGenerated": "2024-05-01T10:00:00Z"}]
    assert double.records("dcr-second") == records(1)
    assert double.records() == records(2)


# --- records that do not fit the stream declaration -----------------------------------------


@pytest.mark.usefixtures("trusted")
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"Colour": "red"}, "record 1: column 'Colour' is not declared in stream " + STREAM),
        ({"PendingEvents": "3"}, "record 1: column 'PendingEvents': expected long"),
        ({"AffectsThisVm": "true"}, "record 1: column 'AffectsThisVm': expected boolean"),
        ({"TimeGenerated": "yesterday"}, "record 1: column 'TimeGenerated': expected datetime"),
        ({"DocumentIncarnation": 2.5}, "record 1: column 'DocumentIncarnation': expected long"),
    ],
)
def test_a_record_that_does_not_fit_raises_http_400(
    double: LogsIngestionDouble,
    make_client: MakeClient,
    change: dict[str, Any],
    expected: str,
) -> None:
    sent = records(3)
    sent[1].update(change)
    with pytest.raises(HttpResponseError) as caught:
        make_client().upload(RULE, STREAM, sent)

    err = caught.value
    assert type(err) is HttpResponseError
    assert err.status_code == 400
    assert err.error is not None
    assert err.error.code == "InvalidRecords"
    assert expected in str(err.error.message)
    assert double.records() == []  # the whole request is refused, not just the record
    assert statuses(double) == [400]  # 400 is not retried


@pytest.mark.usefixtures("trusted")
def test_on_error_gets_each_failed_chunk_and_the_upload_goes_on(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    # Three chunks of ~half a MiB (two records each); the middle one holds a bad record.
    padding = "x" * (400 * 1024)
    sent = records(6, Description=padding)
    sent[3]["PendingEvents"] = "many"
    failures: list[LogsUploadError] = []

    make_client().upload(RULE, STREAM, sent, on_error=failures.append)  # does not raise

    assert statuses(double) == [204, 400, 204]
    (failure,) = failures
    assert isinstance(failure.error, HttpResponseError)
    assert failure.error.status_code == 400
    assert failure.failed_logs == sent[2:4]
    assert failure.failed_logs[0] is sent[2]  # the caller's own dicts, not copies
    assert double.records() == sent[:2] + sent[4:]


@pytest.mark.usefixtures("trusted")
def test_without_on_error_the_first_failed_chunk_raises_and_later_chunks_are_not_sent(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    padding = "x" * (400 * 1024)
    sent = records(6, Description=padding)
    sent[3]["PendingEvents"] = "many"

    with pytest.raises(HttpResponseError):
        make_client().upload(RULE, STREAM, sent)

    # The first chunk is in: an upload that raises may still have delivered a prefix.
    assert statuses(double) == [204, 400]
    assert double.records() == sent[:2]


@pytest.mark.usefixtures("trusted")
def test_an_upload_over_1_mib_is_chunked_by_the_sdk_and_every_chunk_is_accepted(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    sent = records(60, Description="y" * 50_000)  # ~3 MiB
    make_client().upload(RULE, STREAM, sent)

    assert double.records() == sent
    assert len(double.requests) == 3
    for request in double.requests:
        assert request.status == 204
        assert request.uncompressed_size is not None
        assert request.uncompressed_size <= MiB


@pytest.mark.usefixtures("trusted")
def test_sdk_chunks_of_many_small_records_overshoot_1_mib_and_get_413(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    """azure-monitor-ingestion 1.1.0 budgets a chunk as the sum of each record's JSON size,
    but sends `json.dumps(chunk)`: the "[", "]" and ", " between records (2 bytes per record)
    are not counted. With se-bridge's ~1 KB event records a full chunk is 1,050,240 bytes,
    over the service's 1,048,576: the sink must batch below the SDK's limit itself."""
    sent = records(1500)  # ~1.4 MiB: the SDK's first chunk is a "full" one
    failures: list[LogsUploadError] = []
    make_client().upload(RULE, STREAM, sent, on_error=failures.append)

    first, second = double.requests
    assert first.status == 413
    assert first.uncompressed_size is None  # refused before decoding
    assert second.status == 204
    (failure,) = failures
    assert isinstance(failure.error, HttpResponseError)
    assert failure.error.status_code == 413
    assert failure.error.error is not None
    assert failure.error.error.code == "ContentLengthLimitExceeded"
    assert "Maximum allowed content length: 1048576 bytes" in str(failure.error.error.message)
    chunk = failure.failed_logs
    assert len(json.dumps(chunk).encode()) > MiB
    assert sum(len(json.dumps(record).encode()) for record in chunk) <= MiB


# --- failures and the exception classes the SDK raises ---------------------------------------


@pytest.mark.usefixtures("trusted")
def test_a_rejected_token_is_401_client_authentication_error_and_is_fetched_again(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    double.accept_token = {"token-2"}.__contains__
    credential = StaticCredential()
    client = make_client(credential)

    with pytest.raises(ClientAuthenticationError) as caught:
        client.upload(RULE, STREAM, records(1))
    assert type(caught.value) is ClientAuthenticationError
    assert caught.value.status_code == 401
    assert statuses(double) == [401]  # not retried

    # The policy drops its cached token on a 401, so the next upload asks for a new one.
    client.upload(RULE, STREAM, records(1))
    assert credential.calls == 2
    assert double.tokens_seen == ["token-1", "token-2"]
    assert statuses(double) == [401, 204]


@pytest.mark.usefixtures("trusted")
@pytest.mark.parametrize(
    ("rule", "stream", "code"),
    [("dcr-unknown", STREAM, "NotFound"), (RULE, "Custom-Unknown", "InvalidStream")],
)
def test_an_unknown_rule_or_stream_is_404_resource_not_found_error(
    double: LogsIngestionDouble, make_client: MakeClient, rule: str, stream: str, code: str
) -> None:
    with pytest.raises(ResourceNotFoundError) as caught:
        make_client().upload(rule, stream, records(1))
    assert type(caught.value) is ResourceNotFoundError
    assert caught.value.status_code == 404
    assert caught.value.error is not None
    assert caught.value.error.code == code
    assert statuses(double) == [404]


@pytest.mark.usefixtures("trusted")
def test_a_scripted_403_is_a_plain_http_response_error_with_the_services_words(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    double.script(403, count=None)  # a missing role assignment: every request, until cleared
    client = make_client()
    for _ in range(2):
        with pytest.raises(HttpResponseError) as caught:
            client.upload(RULE, STREAM, records(1))
        err = caught.value
        assert type(err) is HttpResponseError  # not ClientAuthenticationError
        assert err.status_code == 403
        assert err.error is not None
        assert err.error.code == "OperationFailed"
        assert err.error.message == (
            "The authentication token provided does not have access to ingest data for the "
            f"data collection rule with immutable Id '{RULE}'."
        )
    double.clear_script()
    client.upload(RULE, STREAM, records(1))
    assert statuses(double) == [403, 403, 204]


@pytest.mark.usefixtures("trusted")
def test_another_api_version_is_refused_with_400(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    with pytest.raises(HttpResponseError) as caught:
        make_client(api_version="2021-11-01-preview").upload(RULE, STREAM, records(1))
    assert caught.value.status_code == 400
    assert caught.value.error is not None
    assert caught.value.error.code == "InvalidApiVersion"
    assert double.requests[0].path.endswith("?api-version=2021-11-01-preview")


# --- retries: what azure-core does for a POST ------------------------------------------------


@pytest.mark.usefixtures("trusted")
def test_429_with_retry_after_is_retried_after_the_time_it_asks_for(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    double.script(429, retry_after=1)
    started = time.monotonic()
    make_client().upload(RULE, STREAM, records(2))
    elapsed = time.monotonic() - started

    assert statuses(double) == [429, 204]
    assert double.records() == records(2)
    assert 1.0 <= elapsed < 3.0  # Retry-After is honoured (and not capped by the back-off)


@pytest.mark.usefixtures("trusted")
def test_429_without_retry_after_is_not_retried_for_a_post(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    double.script(429)
    with pytest.raises(HttpResponseError) as caught:
        make_client().upload(RULE, STREAM, records(1))
    assert type(caught.value) is HttpResponseError
    assert caught.value.status_code == 429
    assert statuses(double) == [429]


@pytest.mark.usefixtures("trusted")
@pytest.mark.parametrize(
    ("status", "retried"), [(500, True), (502, False), (503, True), (504, True)]
)
def test_which_5xx_azure_core_retries_for_a_post(
    double: LogsIngestionDouble, make_client: MakeClient, status: int, retried: bool
) -> None:
    double.script(status)
    client = make_client()
    if retried:
        client.upload(RULE, STREAM, records(1))
        assert statuses(double) == [status, 204]
    else:
        with pytest.raises(HttpResponseError) as caught:
            client.upload(RULE, STREAM, records(1))
        assert type(caught.value) is HttpResponseError
        assert statuses(double) == [status]


@pytest.mark.usefixtures("trusted")
def test_any_error_status_with_retry_after_is_retried(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    # azure-core retries every status >= 400 that carries Retry-After, whatever the method.
    double.script(502, retry_after="0.05")
    make_client().upload(RULE, STREAM, records(1))
    assert statuses(double) == [502, 204]


@pytest.mark.usefixtures("trusted")
def test_retries_stop_when_retry_total_is_spent(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    double.script(500, count=3)
    with pytest.raises(HttpResponseError) as caught:
        make_client(retry_total=2).upload(RULE, STREAM, records(1))
    assert caught.value.status_code == 500
    assert statuses(double) == [500, 500, 500]  # the try and two retries
    assert double.records() == []


@pytest.mark.usefixtures("trusted")
def test_scripted_answers_are_served_in_order_before_any_check(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    double.script(503, count=2)
    double.script(500)
    make_client().upload(RULE, STREAM, records(1))
    assert statuses(double) == [503, 503, 500, 204]


@pytest.mark.usefixtures("trusted")
def test_down_refuses_connections_and_up_serves_again_on_the_same_endpoint(
    double: LogsIngestionDouble, make_client: MakeClient
) -> None:
    client = make_client()
    client.upload(RULE, STREAM, records(1))  # leaves a keep-alive connection in the pool
    endpoint = double.endpoint

    double.down()
    with pytest.raises(ServiceRequestError) as caught:
        client.upload(RULE, STREAM, records(1))
    assert type(caught.value) is ServiceRequestError  # connection refused; not retried (POST)

    double.up()
    assert double.endpoint == endpoint
    after: Logs = [event_record(rid="after")]
    client.upload(RULE, STREAM, after)
    assert [record["RecordId"] for record in double.records()] == ["rec-00000", "after"]


# --- TLS: the certificate is really verified --------------------------------------------------


@pytest.mark.parametrize("bundle", [None, certifi.where()], ids=["no-bundle", "public-cas"])
def test_without_the_doubles_ca_the_sdk_refuses_the_certificate(
    double: LogsIngestionDouble,
    make_client: MakeClient,
    monkeypatch: pytest.MonkeyPatch,
    bundle: str | None,
) -> None:
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    if bundle is None:
        monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    else:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", bundle)
    with pytest.raises(ServiceRequestError) as caught:
        make_client().upload(RULE, STREAM, records(1))
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    assert double.requests == []
    # The double sees the client abort the handshake (in its own thread, so maybe a bit later).
    eventually(lambda: double.tls_errors, 5, "the double to see the handshake aborted")
    assert any("UNKNOWN_CA" in error.upper() for error in double.tls_errors), double.tls_errors


def test_requests_ca_bundle_works_because_azure_core_keeps_trust_env(
    double: LogsIngestionDouble, make_client: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RequestsTransport sets session.trust_env = use_env_settings (default True); requests then
    # reads REQUESTS_CA_BUNDLE per request. Without trust_env the variable is ignored.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(double.ca_bundle))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    ignoring_env = RequestsTransport(use_env_settings=False)
    with pytest.raises(ServiceRequestError, match="CERTIFICATE_VERIFY_FAILED"):
        make_client(transport=ignoring_env).upload(RULE, STREAM, records(1))

    # The explicit alternative to the environment: connection_verify=<bundle>.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    make_client(connection_verify=str(double.ca_bundle)).upload(RULE, STREAM, records(1))
    assert double.records() == records(1)


# --- the service's checks, driven without the SDK ---------------------------------------------


@pytest.fixture
def http(double: LogsIngestionDouble) -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.verify = str(double.ca_bundle)
        session.trust_env = False
        yield session


def post(
    http: requests.Session,
    double: LogsIngestionDouble,
    body: bytes,
    *,
    path: str = PATH,
    gzipped: bool = True,
    headers: dict[str, str] | None = None,
) -> requests.Response:
    sent = {"Authorization": "Bearer t", "Content-Type": "application/json"}
    if gzipped:
        sent["Content-Encoding"] = "gzip"
        body = gzip.compress(body)
    sent.update(headers or {})
    return http.post(double.endpoint + path, data=body, headers=sent, timeout=10)


def error_of(response: requests.Response) -> tuple[int, str]:
    payload = response.json()
    assert set(payload) == {"error"}
    assert set(payload["error"]) == {"code", "message"}
    assert response.headers["x-ms-error-code"] == payload["error"]["code"]
    return response.status_code, payload["error"]["code"]


VALID = json.dumps(records(1)).encode()
OVER_1_MIB = b"[" + b" " * (MiB - 1) + b"]"


@pytest.mark.parametrize(
    ("body", "options", "expected"),
    [
        pytest.param(VALID, {"headers": {"Authorization": ""}}, 401, id="no-token"),
        pytest.param(VALID, {"headers": {"Authorization": "Basic abc"}}, 401, id="not-bearer"),
        pytest.param(VALID, {"path": PATH.replace("streams", "stream")}, 404, id="bad-path"),
        pytest.param(
            VALID,
            {"path": PATH.replace(RULE, "dcr-unknown"), "headers": {"Authorization": ""}},
            401,
            id="token-checked-before-rule",
        ),
        pytest.param(VALID, {"path": PATH.split("?", maxsplit=1)[0]}, 400, id="no-api-version"),
        pytest.param(VALID, {"headers": {"Content-Type": "text/plain"}}, 415, id="not-json"),
        pytest.param(
            VALID,
            {"gzipped": False, "headers": {"Content-Encoding": "br"}},
            415,
            id="brotli",
        ),
        pytest.param(
            VALID,
            {"gzipped": False, "headers": {"Content-Encoding": "gzip"}},
            400,
            id="not-really-gzip",
        ),
        pytest.param(b'{"RecordId": "x"}', {}, 400, id="object-not-array"),
        pytest.param(b"[NaN]", {}, 400, id="nan"),
        pytest.param(b"\xff[]", {"gzipped": False}, 400, id="not-utf8"),
        pytest.param(b"[1]", {}, 400, id="array-of-non-objects"),
        pytest.param(OVER_1_MIB, {}, 413, id="over-1-mib-uncompressed"),
        pytest.param(OVER_1_MIB, {"gzipped": False}, 413, id="over-1-mib-as-sent"),
    ],
)
def test_each_check_answers_with_the_services_error_shape(
    double: LogsIngestionDouble,
    http: requests.Session,
    body: bytes,
    options: dict[str, Any],
    expected: int,
) -> None:
    status, code = error_of(post(http, double, body, **options))
    assert status == expected
    assert code
    assert double.records() == []
    (request,) = double.requests
    assert request.status == expected


def test_exactly_1_mib_and_plain_json_are_accepted(
    double: LogsIngestionDouble, http: requests.Session
) -> None:
    exactly = b"[" + b" " * (MiB - 2) + b"]"
    assert post(http, double, exactly).status_code == 204
    ok = post(http, double, VALID, gzipped=False)
    assert (ok.status_code, ok.content) == (204, b"")
    assert double.records() == records(1)
    assert double.tokens_seen == ["t"]


def test_only_post_is_allowed(double: LogsIngestionDouble, http: requests.Session) -> None:
    get = http.get(double.endpoint + PATH, headers={"Authorization": "Bearer t"}, timeout=10)
    assert error_of(get) == (405, "MethodNotAllowed")


def test_scripted_answers_come_before_every_check(
    double: LogsIngestionDouble, http: requests.Session
) -> None:
    double.script(429, retry_after=7)
    throttled = post(http, double, b"not even JSON", headers={"Authorization": ""})
    assert error_of(throttled) == (429, "TooManyRequests")
    assert throttled.headers["Retry-After"] == "7"
    assert error_of(post(http, double, b"not even JSON")) == (400, "InvalidJson")


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("string", ""),
        ("int", 2**31 - 1),
        ("long", -(2**63)),
        ("real", 1),
        ("real", 2.5),
        ("boolean", False),
        ("datetime", "2024-02-29T23:59:59.1234567Z"),
        ("datetime", "2024-02-29T23:59:59+02:00"),
        ("datetime", "2024-02-29T23:59"),
        ("datetime", "2024-02-29"),
        ("dynamic", {"a": [1, None]}),
        ("dynamic", "text"),
        *((kind, None) for kind in ("string", "int", "long", "real", "boolean", "datetime")),
    ],
)
def test_values_that_fit_their_column(kind: str, value: Any) -> None:
    assert value_problem(kind, value) is None


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("string", 1),
        ("string", ["a"]),
        ("int", 2**31),
        ("int", True),
        ("long", 2**63),
        ("long", 1.0),
        ("real", "1.5"),
        ("real", False),
        ("boolean", 0),
        ("datetime", "2024-02-30T00:00:00Z"),
        ("datetime", "2024-01-01 00:00:00"),
        ("datetime", "2024-01-01T25:00:00Z"),
        ("datetime", "2024-01-01T00:00:00+24:00"),
        ("datetime", "Mon, 11 Apr 2022 22:26:58 GMT"),
        ("datetime", 1_700_000_000),
    ],
)
def test_values_that_do_not_fit_their_column(kind: str, value: Any) -> None:
    assert value_problem(kind, value) is not None


def test_a_declaration_with_an_unknown_type_is_refused() -> None:
    with pytest.raises(ValueError, match="guid"):
        LogsIngestionDouble(RULE, STREAM, {"columns": [{"name": "Id", "type": "guid"}]})

"""The Event Hubs sink over HTTPS (the REST send) against the test broker, which stores what it
is sent as the service does and serves it to AMQP receivers like any other event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from bridge.cloud import identity
from bridge.config import Config, EventHubsSettings, IdentitySettings
from bridge.retry import PermanentError, PoisonRecords, RetryableError, ThrottledError
from bridge.sinks import eventhubs, eventhubs_https, kinds
from bridge.sinks.eventhubs import EventHubsSink
from bridge.sinks.eventhubs_https import EventHubsHttpsSink, sas_token
from tests.component.sinks.test_eventhubs import assert_routed, spooled, vm_id
from tests.doubles.eventhubs_broker import SERVER_BUSY, EventHubsBroker
from tests.doubles.tls import make_server_certificate
from tests.support.wait import eventually


@pytest.fixture
def sink(broker: EventHubsBroker) -> Iterator[EventHubsHttpsSink]:
    s = EventHubsHttpsSink(
        EventHubsSettings(connection_string=broker.connection_string), IdentitySettings()
    )
    yield s
    s.close()


def arrived(broker: EventHubsBroker) -> list[str]:
    return [json.loads(e.body)["RecordId"] for e in broker.events()]


def test_records_arrive_in_order_with_routing_properties_where_amqp_puts_them(
    sink: EventHubsHttpsSink, broker: EventHubsBroker
) -> None:
    batch = [*spooled(3, vm="vm-a"), *spooled(2, start=4, vm="vm-b")]
    sink.send(batch)
    events = assert_routed(broker, batch)
    amqp = EventHubsSink(EventHubsSettings(connection_string=broker.connection_string),
                         IdentitySettings())  # fmt: skip
    try:
        amqp.send(spooled(1, start=6, vm="vm-a"))
    finally:
        amqp.close()
    by_key: dict[str | None, set[str]] = {}
    for event in broker.events():
        by_key.setdefault(event.partition_key, set()).add(event.partition)
    assert by_key[vm_id("vm-a")] == {events[0].partition}  # one VM, one partition, either way


def test_a_send_after_a_quiet_spell_opens_no_amqp_connection(
    broker: EventHubsBroker, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Issue 35: the first record of an event waited ~0.46 s for azure-eventhub to reopen the
    AMQP connection the idle agent had closed. By default it is one HTTPS request."""
    sink = kinds.build(
        "eventhubs", Config(eventhubs=EventHubsSettings(connection_string=broker.connection_string))
    )
    request.addfinalizer(sink.close)
    sink.send(spooled(1))
    assert broker.http_connections == 1
    again = sink.idle()
    assert again is not None
    assert 0 < again <= eventhubs.IDLE_CLOSE
    monkeypatch.setattr(eventhubs, "IDLE_CLOSE", 0.0)
    assert sink.idle() is None  # the kept-alive connection is let go
    eventually(lambda: broker.http_connections == 0, what="the idle sink to close its connection")
    sink.send(spooled(1, start=2))
    assert arrived(broker) == ["r1", "r2"]
    assert broker.connection_count == 0  # no AMQP connection, ever
    assert [t.token_type for t in broker.tokens] == ["servicebus.windows.net:sastoken"] * 2
    assert {t.status for t in broker.tokens} == {202}


def test_a_run_larger_than_a_request_is_split_in_order_and_each_vm_goes_in_its_own(
    sink: EventHubsHttpsSink, broker: EventHubsBroker
) -> None:
    big = spooled(150, Description="x" * 4000)  # over 640 KB: three or four requests
    sink.send(big)
    assert arrived(broker) == [r.record_id for r in big]
    assert len(broker.tokens) in (3, 4)
    requests_before = len(broker.tokens)
    interleaved = [
        record
        for n in range(10)
        for record in (spooled(1, 1000 + 3 * n, vm="vm-a") + spooled(1, 1001 + 3 * n, vm="vm-b")
                       + spooled(1, 1002 + 3 * n, vm="vm-c"))
    ]  # fmt: skip
    sink.send(interleaved)
    assert len(broker.tokens) == requests_before + 3  # one request per VM, not per record
    for vm in ("vm-a", "vm-b", "vm-c"):
        got = [json.loads(e.body)["RecordId"] for e in broker.events()
               if e.partition_key == vm_id(vm)]  # fmt: skip
        assert got == [r.record_id for r in interleaved if json.loads(r.body)["VmId"] == vm_id(vm)]


def test_a_record_larger_than_a_request_is_poison_and_nothing_else_is_sent(
    sink: EventHubsHttpsSink, broker: EventHubsBroker
) -> None:
    huge = spooled(1, start=2, Description="x" * eventhubs_https.MAX_POST_BYTES)
    with pytest.raises(PoisonRecords) as info:
        sink.send([*spooled(1), *huge, *spooled(1, start=3)])
    assert info.value.seqs == [2]
    assert broker.events() == []  # so the retry of the rest sends none of them twice
    sink.send([*spooled(1), *spooled(1, start=3)])
    assert arrived(broker) == ["r1", "r3"]


def test_a_broker_down_is_retryable_and_the_send_after_it_comes_back_works(
    sink: EventHubsHttpsSink, broker: EventHubsBroker
) -> None:
    sink.send(spooled(1))
    broker.stop()
    with pytest.raises(RetryableError) as info:
        sink.send(spooled(1, start=2))
    assert not isinstance(info.value, PermanentError)
    assert "takes AMQP only" in str(info.value)  # an emulator string: the likely cause
    broker.start()
    sink.send(spooled(1, start=2))
    assert arrived(broker) == ["r1", "r2"]


def test_a_busy_hub_is_throttled_with_its_retry_after(
    sink: EventHubsHttpsSink, broker: EventHubsBroker
) -> None:
    broker.fail_sends(1, SERVER_BUSY)
    with pytest.raises(ThrottledError) as info:
        sink.send(spooled(1))
    assert info.value.retry_after == 1.0
    broker.fail_sends(1, "amqp:internal-error")
    with pytest.raises(RetryableError) as internal:
        sink.send(spooled(1))
    assert not isinstance(internal.value, (PermanentError, ThrottledError))
    sink.send(spooled(1))
    assert arrived(broker) == ["r1"]


def test_a_refused_token_a_wrong_key_and_a_missing_hub_are_permanent_with_advice(
    sink: EventHubsHttpsSink, broker: EventHubsBroker
) -> None:
    broker.reject_tokens(1)
    with pytest.raises(PermanentError, match="the Send right") as refused:
        sink.send(spooled(1))
    assert "HTTP 401" in str(refused.value)
    wrong = broker.connection_string.replace(broker.key, "d3Jvbmc=")
    with pytest.raises(PermanentError, match="the Send right") as info:
        EventHubsHttpsSink(EventHubsSettings(connection_string=wrong), IdentitySettings()).send(
            spooled(1)
        )
    assert "d3Jvbmc=" not in str(info.value)
    other = EventHubsSettings(connection_string=broker.connection_string, name="nothere")
    with pytest.raises(PermanentError, match="does not exist"):
        EventHubsHttpsSink(other, IdentitySettings()).send(spooled(1))
    assert broker.events() == []


def test_a_sas_token_is_reused_until_it_nears_its_expiry() -> None:
    now = [1_700_000_000.0]
    hub = EventHubsSettings(
        connection_string="Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=send;"
        "SharedAccessKey=a2V5;EntityPath=records"
    )
    sink = EventHubsHttpsSink(hub, IdentitySettings(), clock=lambda: now[0])
    first = sink._authorization()
    assert first == sas_token(
        "https://contoso.servicebus.windows.net/records", "send", "a2V5", 1_700_003_600
    )
    now[0] += eventhubs_https.SAS_LIFETIME - eventhubs_https.TOKEN_SPARE - 1
    assert sink._authorization() == first
    now[0] += 2
    assert sink._authorization() != first


class _Credential:
    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **_: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.scopes.append(scopes)
        return AccessToken("entra-token", 1_900_000_000)


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[EventHubsBroker, Path]]:
    certificate = make_server_certificate(tmp_path)
    with EventHubsBroker(hub="records", tls=certificate) as running:
        yield running, certificate.ca_bundle


def test_namespace_and_name_send_over_tls_with_an_entra_token(
    tls_broker: tuple[EventHubsBroker, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, ca_bundle = tls_broker
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_bundle))
    credential = _Credential()
    monkeypatch.setattr(identity, "credential", lambda _: credential)
    hub = EventHubsSettings(namespace=f"127.0.0.1:{broker.port}", name="records")
    sink = EventHubsHttpsSink(hub, IdentitySettings(kind="managed"))
    try:
        sink.send(spooled(1))
        sink.send(spooled(1, start=2))
    finally:
        sink.close()
    assert arrived(broker) == ["r1", "r2"]
    assert credential.scopes == [("https://eventhubs.azure.net/.default",)]  # cached
    assert [(t.token_type, t.token) for t in broker.tokens] == [("jwt", "entra-token")] * 2


def test_a_certificate_the_vm_does_not_trust_is_retried_not_sent_in_clear(
    tls_broker: tuple[EventHubsBroker, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, _ = tls_broker
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.setattr(identity, "credential", lambda _: _Credential())
    hub = EventHubsSettings(namespace=f"127.0.0.1:{broker.port}", name="records")
    sink = EventHubsHttpsSink(hub, IdentitySettings(kind="managed"))
    try:
        with pytest.raises(RetryableError, match="SSLError"):
            sink.send(spooled(1))
    finally:
        sink.close()
    assert broker.events() == []
    assert broker.tokens == []


def test_the_transport_setting_picks_the_sink_and_amqp_is_the_old_one(
    broker: EventHubsBroker,
) -> None:
    https = Config(eventhubs=EventHubsSettings(connection_string=broker.connection_string))
    amqp = Config(
        eventhubs=EventHubsSettings(connection_string=broker.connection_string, transport="amqp")
    )
    assert isinstance(kinds.build("eventhubs", https), EventHubsHttpsSink)
    old = kinds.build("eventhubs", amqp)
    assert isinstance(old, EventHubsSink)
    old.close()
    no_hub = Config(
        eventhubs=EventHubsSettings(connection_string="Endpoint=sb://h/;SharedAccessKey=k")
    )
    with pytest.raises(Exception, match="EntityPath"):
        kinds.check_config(no_hub, ["eventhubs"])
    kinds.check_config(
        Config(
            eventhubs=EventHubsSettings(
                connection_string="Endpoint=sb://h/;SharedAccessKey=k", transport="amqp"
            )
        ),
        ["eventhubs"],
    )  # the SDK may take the hub from elsewhere: only the REST send needs it here


def test_check_makes_a_harmless_round_trip_and_sends_nothing(
    sink: EventHubsHttpsSink, broker: EventHubsBroker
) -> None:
    found = sink.check()
    assert "accepted a sender" in found
    assert "HTTPS" in found
    assert broker.events() == []


def test_a_hostile_answer_is_read_only_so_far(
    sink: EventHubsHttpsSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Endless:
        status_code = 500

        @property
        def headers(self) -> dict[str, str]:
            return {}

        def __enter__(self) -> Endless:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def iter_content(self, size: int) -> Iterator[bytes]:
            while True:
                yield b"x" * size

    monkeypatch.setattr(requests.Session, "post", lambda *_, **__: Endless())
    with pytest.raises(RetryableError) as info:
        sink.send(spooled(1))
    assert "HTTP 500" in str(info.value)
    assert len(str(info.value)) < 2000


def test_no_token_is_permanent_with_advice_and_a_passing_failure_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class CredentialUnavailableError(Exception):
        pass

    failures: list[Exception] = [CredentialUnavailableError("no managed identity"), OSError("x")]

    class Failing:
        def get_token(self, *_: str, **__: Any) -> Any:
            raise failures.pop(0)

    monkeypatch.setattr(identity, "credential", lambda _: Failing())
    hub = EventHubsSettings(namespace="contoso.servicebus.windows.net", name="records")
    sink = EventHubsHttpsSink(hub, IdentitySettings(kind="managed"))
    with pytest.raises(PermanentError, match="no token for Event Hubs"):
        sink.send(spooled(1))
    with pytest.raises(RetryableError) as info:
        sink.send(spooled(1))
    assert not isinstance(info.value, PermanentError)
    sink.close()


def test_a_redirect_is_not_followed_with_the_token(
    sink: EventHubsHttpsSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[dict[str, Any]] = []

    class Moved:
        status_code = 307

        @property
        def headers(self) -> dict[str, str]:
            return {"Location": "https://elsewhere.example/records/messages"}

        def __enter__(self) -> Moved:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def iter_content(self, size: int) -> Iterator[bytes]:
            return iter(())

    def post(*_: Any, **kwargs: Any) -> Moved:
        asked.append(kwargs)
        return Moved()

    monkeypatch.setattr(requests.Session, "post", post)
    with pytest.raises(PermanentError, match="HTTP 307"):
        sink.send(spooled(1))
    assert asked[0]["allow_redirects"] is False


def test_a_hub_that_finds_a_request_too_large_gets_halves_down_to_the_record_it_refuses(
    broker: EventHubsBroker,
) -> None:
    """A tier whose limit, as the hub counts it, is below MAX_POST_BYTES (Basic: 256 KB)."""
    broker.max_message_size = 40_000
    sink = EventHubsHttpsSink(
        EventHubsSettings(connection_string=broker.connection_string), IdentitySettings()
    )
    try:
        sink.send(spooled(20, Description="x" * 3000))  # about 80 KB: halved, then halved again
        assert arrived(broker) == [f"r{n}" for n in range(1, 21)]
        with pytest.raises(PoisonRecords) as info:
            sink.send([*spooled(1, start=21), *spooled(1, start=22, Description="x" * 50_000)])
        assert info.value.seqs == [22]
        assert arrived(broker)[-1] == "r21"
    finally:
        sink.close()

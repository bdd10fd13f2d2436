"""TableStore specifics against Azurite and a scripted HTTP server: layout, recovery, errors."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from azure.data.tables import TableClient
from azure.identity import CredentialUnavailableError

from bridge.cloud import advice, identity
from bridge.config import Config, ConsumerSettings, StorageSettings
from bridge.consumer import documents as fs
from bridge.consumer.state import Doc
from bridge.consumer.state.kinds import table_store
from bridge.consumer.state.sqlite import SqliteStore
from bridge.consumer.state.tables import CHUNK_CHARS, TableStore
from bridge.consumer.wiring import build_store as build
from bridge.retry import PermanentError, RetryableError, ThrottledError
from tests.support.azurite import ACCOUNT, KEY, Azurite
from tests.support.state import tables_config, unique_table

WRONG_KEY = "c2VjcmV0LWJ1dC13cm9uZy1rZXktMDEyMzQ1Njc4OWFiY2RlZg=="


@pytest.fixture
def table_name() -> str:
    return unique_table()


@pytest.fixture
def store(azurite: Azurite, table_name: str) -> Iterator[TableStore]:
    opened = table_store(tables_config(azurite.connection_string), table_name)
    yield opened
    opened.close()


@pytest.fixture
def raw(azurite: Azurite, table_name: str) -> Iterator[TableClient]:
    """The same table through the SDK directly, to see what the store really wrote."""
    with TableClient.from_connection_string(azurite.connection_string, table_name) as client:
        yield client


def test_values_are_chunked_under_the_property_limit_and_keys_escaped(
    store: TableStore, raw: TableClient
) -> None:
    value = {"blob": "y" * 200_000}
    store.write("vms/all", Doc("vm/1?#", value))

    entity = raw.get_entity("vms%2Fall", "vm%2F1%3F%23")
    bodies = [entity[f"Body{i}"] for i in range(entity["Chunks"])]
    assert entity["Chunks"] == 7
    assert all(len(body) <= CHUNK_CHARS for body in bodies)
    assert json.loads("".join(bodies)) == value
    assert set(entity) == {"PartitionKey", "RowKey", "Chunks", *(f"Body{i}" for i in range(7))}


def test_shrinking_a_value_leaves_no_stale_chunks(store: TableStore, raw: TableClient) -> None:
    big = store.write("ledger", Doc("k", {"blob": "z" * 100_000}))
    store.write("ledger", Doc("k", {"n": 1}, big.etag))
    entity = raw.get_entity("ledger", "k")
    assert set(entity) == {"PartitionKey", "RowKey", "Chunks", "Body0"}


def test_an_entity_not_written_by_se_bridge_is_a_permanent_error(
    store: TableStore, raw: TableClient
) -> None:
    store.scan("vms")  # creates the table
    raw.create_entity({"PartitionKey": "vms", "RowKey": "alien", "Colour": "green"})
    with pytest.raises(PermanentError, match="not written by se-bridge"):
        store.read("vms", "alien")


def test_a_table_deleted_under_the_store_is_made_again(store: TableStore, raw: TableClient) -> None:
    store.write("vms", Doc("vm-1", {"n": 1}))
    raw.delete_table()
    with pytest.raises(RetryableError, match="does not exist"):
        store.read("vms", "vm-1")
    assert store.read("vms", "vm-1") is None
    assert store.write("vms", Doc("vm-1", {"n": 2})).value == {"n": 2}


def test_build_names_either_store(azurite: Azurite, tmp_path: Path, table_name: str) -> None:
    config = Config(
        storage=StorageSettings(connection_string=azurite.connection_string),
        consumer=ConsumerSettings(table_name=table_name),
    )
    tables = build("tables", config)
    local = build(f"sqlite:{tmp_path / 'fleet.db'}", config)
    try:
        assert isinstance(tables, TableStore)
        assert tables.table_name == table_name
        assert tables.check() == f"Table Storage serves table {table_name} in account {ACCOUNT}"
        assert isinstance(local, SqliteStore)
        for store in (tables, local):
            store.write("vms", Doc("vm-1", {"via": "build"}))
            assert [d.value for d in store.scan("vms")] == [{"via": "build"}]
    finally:
        tables.close()
        local.close()
    with pytest.raises(ValueError, match="unknown fleet state"):
        build("redis", config)


def test_a_spread_collection_lives_in_its_partitions(
    azurite: Azurite, raw: TableClient, table_name: str
) -> None:
    store = table_store(tables_config(azurite.connection_string), table_name, spread={"vm": 4})
    for n in range(20):
        store.write("vm", Doc(f"vm-{n}", {"n": n}))
    store.write("ledger", Doc("k", {"n": 1}))
    partitions = {str(e["PartitionKey"]) for e in raw.list_entities()}
    assert {"vm-00", "vm-01", "vm-02", "vm-03"} >= partitions - {"ledger"}
    assert len(partitions - {"ledger"}) > 1
    assert [d.key for d in store.scan("vm")] == sorted(f"vm-{n}" for n in range(20))
    with pytest.raises(ValueError, match="one partition"):
        store.write_all("vm", [Doc(f"vm-{n}", {}) for n in range(20)])
    store.close()


def test_the_consumer_spreads_vm_and_event_and_keeps_the_ledger_in_one(
    azurite: Azurite, table_name: str
) -> None:
    config = Config(
        storage=StorageSettings(connection_string=azurite.connection_string),
        consumer=ConsumerSettings(table_name=table_name),
    )
    tables = build("tables", config)
    assert isinstance(tables, TableStore)
    assert tables.spread == fs.PARTITIONS
    assert fs.LEDGER not in tables.spread
    tables.close()


def test_what_a_release_before_the_spread_left_in_one_partition_is_moved(
    azurite: Azurite, raw: TableClient, table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = tables_config(azurite.connection_string)
    before = table_store(config, table_name)  # an earlier release: one partition a collection
    for key in ("a", "b", "c"):
        before.write("vm", Doc(key, {"v": 1}))
    now = table_store(config, table_name, spread={"vm": 4})
    moved = now.read("vm", "a")  # the first use moves them all
    assert moved is not None
    assert moved.value == {"v": 1}
    assert [e["RowKey"] for e in raw.query_entities("PartitionKey eq 'vm'")] == []
    assert {d.key: d.value for d in now.scan("vm")} == {k: {"v": 1} for k in "abc"}
    # A consumer of the earlier release still running writes where it always did: the
    # newest version of each document stays, wherever it was written.
    time.sleep(0.05)
    before.write("vm", Doc("b", {"v": 2}))  # newer than the moved b
    before.write("vm", Doc("c", {"v": 2}))
    time.sleep(0.05)
    held = now.read("vm", "c")
    assert held is not None
    now.write("vm", Doc("c", {"v": 3}, held.etag))  # newer than the old release's c
    before.write("vm", Doc("d", {"v": 2}))
    with caplog.at_level(logging.WARNING):
        found = {d.key: d.value["v"] for d in now.scan("vm")}
    assert found == {"a": 1, "b": 2, "c": 3, "d": 2}
    assert "a consumer of a release before the spread writes there" in caplog.text
    assert [e["RowKey"] for e in raw.query_entities("PartitionKey eq 'vm'")] == []
    before.close()
    now.close()


# --- settings and errors ------------------------------------------------------------------


def test_bad_settings_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"consumer\.table_name"):
        table_store(tables_config("UseDevelopmentStorage=true"), "no-dashes")
    with pytest.raises(ValueError, match=r"storage\.account or storage\.connection_string"):
        table_store(Config())


class _NoToken:
    """A credential that has no token, as on a VM without a managed identity."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise CredentialUnavailableError("no managed identity endpoint")

    get_token_info = get_token


def test_entra_id_without_a_token_is_permanent_with_advice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(identity, "credential", lambda settings: _NoToken())
    store = table_store(Config(storage=StorageSettings(account="acct")), unique_table())
    with pytest.raises(PermanentError, match="no token for table ") as caught:
        store.read("vms", "vm-1")
    assert advice.CREDENTIAL_ADVICE in str(caught.value)
    store.close()


def test_a_malformed_connection_string_is_named_not_quoted() -> None:
    secret = "AccountKey=s3cr3t-value"
    store = table_store(tables_config(f"nonsense;{secret}"), unique_table())
    with pytest.raises(PermanentError, match=r"storage\.connection_string") as caught:
        store.read("vms", "vm-1")
    assert "s3cr3t" not in str(caught.value)


def test_a_wrong_account_key_is_permanent_and_the_key_never_shown(
    azurite: Azurite, table_name: str
) -> None:
    wrong = azurite.connection_string.replace(KEY, WRONG_KEY)
    store = table_store(tables_config(wrong), table_name)
    with pytest.raises(PermanentError) as caught:
        store.write("vms", Doc("vm-1", {"n": 1}))
    message = str(caught.value)
    assert re.match(r"403( \w+)? from table ", message)
    assert "storage.connection_string" in message
    for secret in (WRONG_KEY, KEY, WRONG_KEY[:12], KEY[:12], wrong):
        assert secret not in message
    store.close()


def test_an_unreachable_endpoint_is_retryable() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connection_string = (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"TableEndpoint=http://127.0.0.1:{port}/{ACCOUNT};"
    )
    store = table_store(tables_config(connection_string), unique_table())
    with pytest.raises(RetryableError, match="cannot reach") as caught:
        store.read("vms", "vm-1")
    assert not isinstance(caught.value, ThrottledError)
    assert KEY not in str(caught.value)
    store.close()


class _Scripted(BaseHTTPRequestHandler):
    """Answers every request with the status and headers the test put on the server."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, headers = self.server.script  # type: ignore[attr-defined]
        body = json.dumps({"odata.error": {"code": "Scripted", "message": {"value": "no"}}})
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_MERGE = _answer  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize(
    ("status", "headers", "kind", "retry_after"),
    [
        (503, {"Retry-After": "7", "x-ms-error-code": "ServerBusy"}, ThrottledError, 7.0),
        (429, {}, ThrottledError, None),
        (500, {}, RetryableError, None),
        (408, {}, RetryableError, None),
        (409, {"x-ms-error-code": "TableBeingDeleted"}, RetryableError, None),
        (403, {"x-ms-error-code": "AuthorizationPermissionMismatch"}, PermanentError, None),
        (401, {}, PermanentError, None),
        (400, {}, PermanentError, None),
    ],
)
def test_service_answers_map_onto_retry_kinds(
    scripted: ThreadingHTTPServer,
    status: int,
    headers: dict[str, str],
    kind: type[Exception],
    retry_after: float | None,
) -> None:
    scripted.script = (status, headers)  # type: ignore[attr-defined]
    port = scripted.server_address[1]
    connection_string = (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"TableEndpoint=http://127.0.0.1:{port}/{ACCOUNT};"
    )
    store = table_store(tables_config(connection_string), unique_table())
    with pytest.raises(kind) as caught:
        store.write("vms", Doc("vm-1", {"n": 1}))
    assert type(caught.value) is kind
    assert re.match(rf"{status}( \w+)? from table ", str(caught.value))
    assert getattr(caught.value, "retry_after", None) == retry_after
    assert KEY not in str(caught.value)
    store.close()

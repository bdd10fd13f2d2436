"""The `storagequeue` command channel against Azurite: the shared contract, then error mapping."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import HttpResponseError
from azure.storage.queue import QueueClient

from bridge import channels
from bridge.channels import CommandInbox, CommandSender
from bridge.channels.storagequeue import (
    StorageQueueInbox,
    StorageQueueSender,
    queue_name,
)
from bridge.cloud import identity
from bridge.config import CommandsSettings, Config, StorageSettings
from bridge.retry import PermanentError, RetryableError, ThrottledError
from tests.support.azurite import ACCOUNT, KEY, Azurite
from tests.support.channel_contract import ChannelContract, command, new_vm


def queue_sender(config: Config, *, cache_size: int = 1024) -> StorageQueueSender:
    return StorageQueueSender(
        config.storage, config.identity, config.commands.queue_prefix, cache_size=cache_size
    )


def queue_inbox(config: Config, vm_id: str, visibility_timeout: float) -> StorageQueueInbox:
    prefix = config.commands.queue_prefix
    return StorageQueueInbox(config.storage, config.identity, prefix, vm_id, visibility_timeout)


class QueueHarness:
    def __init__(self, connection_string: str) -> None:
        # Each test has its own queues: Azurite is shared by the whole session.
        prefix = f"t{uuid.uuid4().hex[:8]}-"
        self.config = Config(
            storage=StorageSettings(connection_string=connection_string),
            commands=CommandsSettings(queue_prefix=prefix),
        )
        self._open: list[CommandSender | CommandInbox] = []

    def sender(self) -> CommandSender:
        self._open.append(queue_sender(self.config))
        return self._open[-1]  # type: ignore[return-value]

    def inbox(self, vm_id: str, visibility_timeout: float = 30.0) -> CommandInbox:
        self._open.append(queue_inbox(self.config, vm_id, visibility_timeout))
        return self._open[-1]  # type: ignore[return-value]

    def send_raw(self, vm_id: str, text: str) -> None:
        name = queue_name(self.config.commands.queue_prefix, vm_id)
        with QueueClient.from_connection_string(
            self.config.storage.connection_string, name
        ) as client:
            with contextlib.suppress(Exception):
                client.create_queue()
            client.send_message(text)

    def pass_time(self, seconds: float) -> None:
        time.sleep(seconds)  # the queue's time is the server's

    def close(self) -> None:
        for end in self._open:
            end.close()


@pytest.fixture
def harness(azurite: Azurite) -> Iterator[QueueHarness]:
    made = QueueHarness(azurite.connection_string)
    yield made
    made.close()


class TestStorageQueueChannelContract(ChannelContract):
    pass


def test_the_first_command_creates_the_vm_queue_named_from_prefix_and_vm_id(
    harness: QueueHarness,
) -> None:
    vm = new_vm().upper()
    sent = command(vm)
    harness.sender().send(sent, 60)
    name = harness.config.commands.queue_prefix + vm.lower()
    with QueueClient.from_connection_string(harness.config.storage.connection_string, name) as q:
        [message] = q.peek_messages()
    assert message.content == sent.to_json()  # plain text, no base64


def test_a_sender_caches_a_bounded_number_of_queue_clients(azurite: Azurite) -> None:
    config = QueueHarness(azurite.connection_string).config
    sender = queue_sender(config, cache_size=2)
    try:
        vms = [new_vm() for _ in range(3)]
        for vm in vms:
            sender.send(command(vm), 60)
        assert list(sender._clients) == [
            queue_name(config.commands.queue_prefix, v) for v in vms[1:]
        ]
    finally:
        sender.close()


def test_the_builders_make_queue_channels_from_the_spec(harness: QueueHarness) -> None:
    vm = new_vm()
    sender = channels.sender("storagequeue", harness.config)
    inbox = channels.inbox("storagequeue", harness.config, vm)
    sent = command(vm)  # once: two calls a second apart differ in IssuedAt
    try:
        sender.send(sent, 60)
        [message] = inbox.receive(5)
        assert message.text == sent.to_json()
    finally:
        sender.close()
        inbox.close()


def wrong_key(connection_string: str) -> tuple[str, str]:
    key = base64.b64encode(b"not the account key" * 3).decode()
    return connection_string.replace(KEY, key), key


def test_a_wrong_key_is_permanent_and_never_quoted(azurite: Azurite) -> None:
    connection_string, key = wrong_key(azurite.connection_string)
    config = dataclasses.replace(
        QueueHarness(connection_string).config,
        storage=StorageSettings(connection_string=connection_string),
    )
    sender, inbox = queue_sender(config), queue_inbox(config, new_vm(), 1)
    try:
        with pytest.raises(PermanentError) as sent:
            sender.send(command(new_vm()), 60)
        with pytest.raises(PermanentError) as read:
            inbox.receive(1)
    finally:
        sender.close()
        inbox.close()
    for failure in (sent.value, read.value):
        text = str(failure)
        assert "403" in text
        assert "storage.connection_string" in text
        for secret in (key, KEY, "AccountKey"):
            assert secret not in text


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def config_for(queue_endpoint: str) -> Config:
    connection_string = (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"QueueEndpoint={queue_endpoint};"
    )
    return Config(storage=StorageSettings(connection_string=connection_string))


def test_an_unreachable_endpoint_is_retryable() -> None:
    config = config_for(f"http://127.0.0.1:{closed_port()}/{ACCOUNT}")
    sender, inbox = queue_sender(config), queue_inbox(config, new_vm(), 1)
    try:
        with pytest.raises(RetryableError) as sent:
            sender.send(command(new_vm()), 60)
        with pytest.raises(RetryableError) as read:
            inbox.receive(1)
    finally:
        sender.close()
        inbox.close()
    for failure in (sent.value, read.value):
        assert not isinstance(failure, ThrottledError)
        assert KEY not in str(failure)


class _Scripted(BaseHTTPRequestHandler):
    """Answers every request with the status, error code and headers the test scripted."""

    reply: tuple[int, str, dict[str, str]] = (500, "InternalError", {})

    def _answer(self) -> None:
        status, code, headers = self.reply
        body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>m</Message></Error>"
        self.send_response(status)
        self.send_header("x-ms-error-code", code)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body.encode())

    def do_GET(self) -> None:
        self._answer()

    def do_PUT(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def do_DELETE(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[tuple[type[_Scripted], str]]:
    handler = type("Handler", (_Scripted,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/{ACCOUNT}"
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.mark.parametrize(
    ("reply", "kind", "retry_after"),
    [
        ((503, "ServerBusy", {"Retry-After": "7"}), ThrottledError, 7.0),
        ((429, "TooManyRequests", {}), ThrottledError, None),
        ((500, "InternalError", {}), RetryableError, None),
        ((503, "ServiceUnavailable", {}), RetryableError, None),
        ((403, "AuthorizationPermissionMismatch", {}), PermanentError, None),
        ((400, "InvalidQueryParameterValue", {}), PermanentError, None),
    ],
)
def test_service_answers_map_onto_retry_kinds(
    scripted: tuple[type[_Scripted], str],
    reply: tuple[int, str, dict[str, str]],
    kind: type[Exception],
    retry_after: float | None,
) -> None:
    handler, endpoint = scripted
    handler.reply = reply
    inbox = queue_inbox(config_for(endpoint), new_vm(), 1)
    try:
        with pytest.raises(kind) as raised:
            inbox.receive(1)
    finally:
        inbox.close()
    assert type(raised.value) is kind
    assert str(reply[0]) in str(raised.value)
    assert reply[1] in str(raised.value)
    if isinstance(raised.value, ThrottledError):
        assert raised.value.retry_after == retry_after


class _NoToken:
    """Stands in for the managed identity; these tests send no request with it."""

    def get_token(self, *scopes: str, **kwargs: object) -> AccessToken:
        raise AssertionError("no token should be needed")


def test_a_refused_identity_is_told_which_role_it_needs(
    scripted: tuple[type[_Scripted], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    handler, endpoint = scripted
    handler.reply = (403, "AuthorizationPermissionMismatch", {})
    monkeypatch.setattr(identity, "credential", lambda settings: _NoToken())
    config = Config(storage=StorageSettings(account="acct"))
    connection_string = config_for(endpoint).storage.connection_string
    with (
        QueueClient.from_connection_string(connection_string, "q") as client,
        pytest.raises(HttpResponseError) as refused,
    ):
        client.send_message("x")
    inbox, sender = queue_inbox(config, new_vm(), 1), queue_sender(config)
    try:
        agent = inbox._edge.classify(refused.value, "q")
        consumer = sender._edges[""].classify(refused.value, "q")
    finally:
        inbox.close()
        sender.close()
    assert isinstance(agent, PermanentError)
    assert isinstance(consumer, PermanentError)
    assert "Storage Queue Data Message Processor" in str(agent)
    assert "Storage Queue Data Message Sender" in str(consumer)
    assert "https://acct.queue.core.windows.net" in str(agent)


@pytest.mark.parametrize("prefix", ["Se-", "se--", "-se-", "se_", "x" * 30])
def test_a_prefix_that_makes_a_bad_queue_name_is_refused_naming_the_setting(prefix: str) -> None:
    config = Config(
        storage=StorageSettings(
            connection_string=config_for("http://127.0.0.1:1/a").storage.connection_string
        ),
        commands=CommandsSettings(queue_prefix=prefix),
    )
    with pytest.raises(ValueError, match=r"commands\.queue_prefix"):
        channels.sender("storagequeue", config)
    with pytest.raises(ValueError, match=r"commands\.queue_prefix"):
        channels.inbox("storagequeue", config, new_vm())


def test_missing_storage_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"storage\.account or storage\.connection_string"):
        channels.inbox("storagequeue", Config(), new_vm())
    bad = Config(storage=StorageSettings(connection_string="AccountKey=secretvalue"))
    with pytest.raises(ValueError, match=r"storage\.connection_string") as raised:
        channels.sender("storagequeue", bad)
    assert "secretvalue" not in str(raised.value)


def test_a_command_for_a_vm_id_no_queue_can_be_named_for_is_permanent(
    harness: QueueHarness,
) -> None:
    with pytest.raises(PermanentError, match="VmId"):
        harness.sender().send(command("not a vm id!"), 60)

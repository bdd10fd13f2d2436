"""`storagequeue`: one Azure Storage Queue per VM, named commands.queue_prefix + VmId.

Messages are the command's JSON as plain text: the SDK's default, with no base64 encode
or decode policy. The text is readable as is in the portal and in `az storage message
peek`, and it is valid inside the service's XML because json.dumps escapes every control
character. A producer that base64-encodes (an Azure Functions queue output binding does
by default) therefore yields text the agent refuses as not JSON: never acted on.

The agent's identity needs "Storage Queue Data Message Processor" on its own queue only;
the consumer's needs "Storage Queue Data Message Sender", or "Storage Queue Data
Contributor" to create a VM's queue on its first command. A fleet past one account's
request quota spreads the queues over several (commands.queue_accounts, `queue_account`):
each agent is set up with its own account, the consumer with all of them. A message as
the agent reads it:

    id: 6e9b...   pop_receipt: AgAAAAMAAAAAAAAA...   dequeue_count: 1
    content: {"SchemaVersion":1,"CommandId":"3d0c...","Type":"Approve","VmId":"1b1f...",...}
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bridge.channels.base import Received
from bridge.cloud import storage, storageerrors
from bridge.cloud.identity import Identity
from bridge.cloud.storage import StorageAccount
from bridge.retry import (
    DeliveryError,
    PermanentError,
)

if TYPE_CHECKING:
    from azure.storage.queue import QueueClient

    from bridge.commands.message import Command

# Azure's rule: 3-63 characters, lowercase letters, digits and single hyphens, starting
# and ending with a letter or digit.
_QUEUE_NAME = re.compile(r"^(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_ACCOUNT_NAME = re.compile(r"^[a-z0-9]{3,24}$")
_SAMPLE_VM_ID = "00000000-0000-0000-0000-000000000000"
MAX_PER_REQUEST = 32  # the service's limit for one Get Messages call
AGENT_ROLE = "Storage Queue Data Message Processor"
CONSUMER_ROLE = (
    "Storage Queue Data Message Sender (Storage Queue Data Contributor to create queues)"
)


def queue_name(prefix: str, vm_id: str) -> str:
    """The queue of `vm_id`; ValueError naming commands.queue_prefix when it is not valid."""
    name = prefix + vm_id.strip().lower()
    if not _QUEUE_NAME.match(name):
        raise ValueError(
            f"commands.queue_prefix {prefix!r} with VmId {vm_id!r} gives queue name {name!r}, "
            "which Azure refuses: 3-63 lowercase letters, digits and single hyphens, starting "
            "and ending with a letter or digit"
        )
    return name


def queue_accounts(setting: str, account: StorageAccount) -> list[str]:
    """commands.queue_accounts (`setting`) as a list ([] when not set); ValueError naming what is
    wrong."""
    text = setting.strip()
    if not text:
        return []
    accounts = [a.strip() for a in text.split(",")]
    bad = [a for a in accounts if not _ACCOUNT_NAME.match(a)]
    if bad:
        raise ValueError(
            f"commands.queue_accounts: {', '.join(map(repr, bad))} is not a storage account "
            "name (3-24 lowercase letters and digits); give the names, comma-separated"
        )
    if len(set(accounts)) != len(accounts):
        raise ValueError("commands.queue_accounts names an account twice")
    if account.connection_string:
        raise ValueError(
            "commands.queue_accounts needs Entra ID (storage.account), not "
            "storage.connection_string, which names one account"
        )
    return accounts


def queue_account(vm_id: str, accounts: Sequence[str]) -> str:
    """The account of `vm_id`'s queue: the one at index (the first 8 hex digits of its VmId)
    modulo their number, as docs/deploying.md has each VM pick it. ValueError for a VmId
    that does not start with 8 hex digits."""
    if len(accounts) == 1:
        return accounts[0]
    digits = vm_id.strip()[:8]
    try:
        return accounts[int(digits, 16) % len(accounts)]
    except ValueError:
        raise ValueError(f"VmId {vm_id!r} does not start with 8 hex digits") from None


@dataclass(frozen=True)
class StorageQueueChannel:
    """The queues in `account` (or in the `accounts` of commands.queue_accounts) named
    `prefix` + VmId; an inbox hides what it reads for `visibility_timeout` s."""

    account: StorageAccount
    identity: Identity
    prefix: str
    accounts: str
    visibility_timeout: float

    def sender(self) -> StorageQueueSender:
        accounts = queue_accounts(self.accounts, self.account)  # bad names stop it at start
        return StorageQueueSender(self.account, self.identity, self.prefix, accounts)

    def inbox(self, vm_id: str) -> StorageQueueInbox:
        return StorageQueueInbox(
            self.account, self.identity, self.prefix, vm_id, self.visibility_timeout
        )

    def check_inbox(self) -> None:
        """Nothing to check: the service decides who may read a queue."""


class StorageQueueSender:
    """The consumer's end: one queue client per VM, the most recently used `cache_size` kept."""

    def __init__(
        self,
        account: StorageAccount,
        identity: Identity,
        prefix: str,
        accounts: Sequence[str] = (),
        *,
        cache_size: int = 1024,
    ) -> None:
        """`prefix`: commands.queue_prefix; `accounts`: commands.queue_accounts (`queue_accounts`),
        none for storage.account (or the connection string's)."""
        self._prefix = prefix
        queue_name(self._prefix, _SAMPLE_VM_ID)  # a bad prefix stops the process at start
        self._accounts = list(accounts) or [""]
        self._edges = {
            a: _Edge(account, identity, CONSUMER_ROLE, account_name=a) for a in self._accounts
        }
        self._clients: OrderedDict[str, QueueClient] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def send(self, command: Command, time_to_live: float) -> None:
        try:
            name = queue_name(self._prefix, command.vm_id)
            edge = self._edges[queue_account(command.vm_id, self._accounts)]
        except ValueError as err:
            raise PermanentError(str(err)) from err
        client = self._client(name, edge)
        try:
            _send(client, command.to_json(), max(1, int(time_to_live)))
        except Exception as err:
            raise edge.classify(err, name) from err

    def close(self) -> None:
        with self._lock:
            self._clients.clear()
        for edge in self._edges.values():
            edge.close()

    def _client(self, name: str, edge: _Edge) -> QueueClient:
        with self._lock:
            client = self._clients.pop(name, None) or edge.queue(name)
            self._clients[name] = client
            if len(self._clients) > self._cache_size:
                # Clients share the service client's connections: dropping one closes nothing.
                self._clients.popitem(last=False)
            return client


def _send(client: QueueClient, text: str, time_to_live: int) -> None:
    from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError  # noqa: PLC0415

    try:
        client.send_message(text, time_to_live=time_to_live)
    except ResourceNotFoundError:
        # A VM's queue is created with its first command, so idle VMs cost nothing.
        with contextlib.suppress(ResourceExistsError):  # another consumer created it first
            client.create_queue()
        client.send_message(text, time_to_live=time_to_live)


class StorageQueueInbox:
    """One agent's end: the queue of its own VmId."""

    def __init__(
        self,
        account: StorageAccount,
        identity: Identity,
        prefix: str,
        vm_id: str,
        visibility_timeout: float,
    ) -> None:
        self._name = queue_name(prefix, vm_id)
        self._edge = _Edge(account, identity, AGENT_ROLE)
        self._client = self._edge.queue(self._name)
        # The service takes whole seconds, at least one.
        self._visibility_timeout = max(1, math.ceil(visibility_timeout))

    def receive(self, max_messages: int) -> list[Received]:
        from azure.core.exceptions import ResourceNotFoundError  # noqa: PLC0415

        if max_messages < 1:
            return []
        try:
            messages = list(
                self._client.receive_messages(
                    messages_per_page=min(max_messages, MAX_PER_REQUEST),
                    max_messages=max_messages,
                    visibility_timeout=self._visibility_timeout,
                )
            )
        except ResourceNotFoundError:
            return []  # no command was ever sent to this VM
        except Exception as err:
            raise self._edge.classify(err, self._name) from err
        return [_received(message) for message in messages[:max_messages]]

    def delete(self, message: Received) -> None:
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError  # noqa: PLC0415

        if not isinstance(message.handle, tuple) or len(message.handle) != 2:
            raise TypeError("not a message of a Storage Queue command channel")
        try:
            self._client.delete_message(*message.handle)
        except ResourceNotFoundError:
            pass  # deleted already
        except HttpResponseError as err:
            if storageerrors.error_code(err) != "PopReceiptMismatch":
                raise self._edge.classify(err, self._name) from err
            # A later read holds it now, after our visibility timeout ran out: theirs to delete.
        except Exception as err:
            raise self._edge.classify(err, self._name) from err

    def close(self) -> None:
        self._client.close()
        self._edge.close()


def _received(message: Any) -> Received:
    content = message.content
    text = content if isinstance(content, str) else "" if content is None else str(content)
    return Received(
        text=text,
        handle=(message.id, message.pop_receipt),
        dequeue_count=message.dequeue_count or 1,
    )


class _Edge:
    """The account connection one end uses, and how its failures map onto bridge.retry."""

    def __init__(
        self, account: StorageAccount, identity: Identity, role: str, *, account_name: str = ""
    ) -> None:
        from azure.storage.queue import QueueServiceClient  # noqa: PLC0415

        # Retries are the caller's loop (jittered, honouring Retry-After): none hidden in the SDK.
        options: dict[str, Any] = {"retry_total": 0, "logging_enable": False}
        self._service = storage.connect(
            account,
            identity,
            "queue",
            "the storagequeue channel",
            account=account_name,
            by_string=lambda text: QueueServiceClient.from_connection_string(text, **options),
            by_identity=lambda url, token: QueueServiceClient(url, credential=token, **options),
        )
        self._advice = storage.refused(account, identity, role, "the queue")
        # Errors name the endpoint without its query, which could hold a SAS signature.
        parts = urlsplit(self._service.url)
        self._endpoint = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"

    def queue(self, name: str) -> QueueClient:
        return self._service.get_queue_client(name)

    def close(self) -> None:
        self._service.close()

    def classify(self, err: BaseException, queue: str) -> DeliveryError:
        target = f"queue {queue} at {self._endpoint}"
        return storageerrors.classify(err, target=target, auth_advice=self._advice)

"""How the queues of the command channels and the tables of the fleet state reach their storage
account: by its name and an Entra ID identity, or by a connection string (a key or a SAS).

Both services are reached the same way, and a refusal gets the same advice:

    https://acct.queue.core.windows.net   (storage.account = acct, the queue service)
    https://acct.table.core.windows.net   (the table service)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from bridge.cloud import identity
from bridge.cloud.identity import Identity

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

C = TypeVar("C")


class StorageAccount(Protocol):
    """Which account, and how (config's `storage` section is one)."""

    @property
    def account(self) -> str:
        """The account's name, reached with Entra ID; "" when a connection string is given."""

    @property
    def connection_string(self) -> str:
        """A connection string (a key or a SAS) instead of Entra ID; "" for none."""

    @property
    def endpoint_suffix(self) -> str:
        """The cloud's storage DNS suffix, as in core.windows.net."""


def connect(
    storage: StorageAccount,
    who: Identity,
    service: str,
    user: str,
    *,
    by_string: Callable[[str], C],
    by_identity: Callable[[str, TokenCredential], C],
    account: str = "",
) -> C:
    """A client of `service` ("queue", "table") on `account` (storage.account unless given), made
    by `by_identity(url, credential)`, or on the connection string's account by
    `by_string(connection_string)`; ValueError naming the setting `user` (what connects) lacks,
    or the one that is unusable.
    """
    if storage.connection_string:
        try:
            return by_string(storage.connection_string)
        except ValueError:  # its message could quote the string; say which setting instead
            raise ValueError(
                "storage.connection_string is not a valid storage connection string"
            ) from None
    name = account or storage.account
    if not name:
        raise ValueError(f"{user} needs storage.account or storage.connection_string")
    return by_identity(
        f"https://{name}.{service}.{storage.endpoint_suffix}", identity.credential(who)
    )


def refused(storage: StorageAccount, who: Identity, role: str, scope: str) -> str:
    """What to do when the service refuses the credential (401, 403): grant `role` on `scope`."""
    if storage.connection_string:
        return "the key or SAS in storage.connection_string was refused (wrong, or rotated)"
    return f"grant {identity.describe(who)} the {role} role on {scope}"

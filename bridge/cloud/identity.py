"""Entra ID credentials for the cloud components; azure-identity loads only when one needs it.

On a VM the managed identity (system-assigned, or user-assigned by `identity.client_id`):
`kind = "managed"` reads it from IMDS with bridge.cloud.managedidentity, or with
azure-identity where the environment names another managed-identity host; elsewhere
DefaultAzureCredential (environment, workload identity, Azure CLI, ...). Never a shared key
unless a connection string is configured explicitly. Tokens are cached and never logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential


class Identity(Protocol):
    """Who a cloud component acts as (config's `identity` section is one)."""

    @property
    def kind(self) -> str:
        """`managed`: the VM's managed identity only; otherwise DefaultAzureCredential."""

    @property
    def client_id(self) -> str:
        """A user-assigned managed identity's client id; "" for the system-assigned one."""


def credential(settings: Identity) -> TokenCredential:
    if settings.kind == "managed":
        from bridge.cloud import managedidentity  # noqa: PLC0415 - loads azure.core

        if managedidentity.applies():
            # The plain VM: ours, without the ~10 MB azure-identity, msal and cryptography cost.
            return managedidentity.ImdsManagedIdentity(settings.client_id)
    from azure.identity import (  # noqa: PLC0415 - only when a cloud component is configured
        DefaultAzureCredential,
        ManagedIdentityCredential,
    )

    client_id = settings.client_id or None
    if settings.kind == "managed":
        return ManagedIdentityCredential(client_id=client_id)
    return DefaultAzureCredential(
        managed_identity_client_id=client_id, exclude_interactive_browser_credential=True
    )


def describe(settings: Identity) -> str:
    """Which identity the components act as, for advice a person can act on."""
    if settings.client_id:
        return f"the user-assigned managed identity {settings.client_id}"
    if settings.kind == "managed":
        return "the VM's system-assigned managed identity"
    return "the identity DefaultAzureCredential finds (the VM's managed identity on Azure)"

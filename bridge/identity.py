"""Entra ID credentials for the cloud sinks; azure-identity loads only when a sink needs it.

On a VM the managed identity (system-assigned, or user-assigned by `identity.client_id`);
elsewhere DefaultAzureCredential (environment, workload identity, Azure CLI, ...). Never a
shared key unless a connection string is configured explicitly. Tokens are cached by the
SDK and never logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.config import IdentitySettings

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential


# What to do when no credential yields a token: said in every cloud sink's error.
CREDENTIAL_ADVICE = (
    "on a VM enable its managed identity (set identity.client_id for a user-assigned one); "
    "elsewhere sign in with `az login` or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET"
)


def credential(settings: IdentitySettings) -> TokenCredential:
    from azure.identity import (  # noqa: PLC0415 - only when a cloud sink is configured
        DefaultAzureCredential,
        ManagedIdentityCredential,
    )

    client_id = settings.client_id or None
    if settings.kind == "managed":
        return ManagedIdentityCredential(client_id=client_id)
    return DefaultAzureCredential(
        managed_identity_client_id=client_id, exclude_interactive_browser_credential=True
    )


def describe(settings: IdentitySettings) -> str:
    """Which identity the sinks act as, for advice a person can act on."""
    if settings.client_id:
        return f"the user-assigned managed identity {settings.client_id}"
    if settings.kind == "managed":
        return "the VM's system-assigned managed identity"
    return "the identity DefaultAzureCredential finds (the VM's managed identity on Azure)"

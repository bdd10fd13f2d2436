"""Reading one Key Vault secret with the process's identity: the consumer's signing key, a
notification target's webhook URL.

The secret's value is never in an error: a caller names the setting it read it for.
"""

from __future__ import annotations

from bridge.cloud.advice import CREDENTIAL_ADVICE
from bridge.cloud.identity import Identity, credential


class KeyVaultError(ValueError):
    """The secret cannot be read; the message says why and never holds its value."""


def read_secret(url: str, identity: Identity) -> str:
    """The value of the secret at `url` (https://VAULT.vault.azure.net/secrets/NAME[/VERSION])."""
    from azure.core.exceptions import AzureError  # noqa: PLC0415 - only with Key Vault
    from azure.keyvault.secrets import KeyVaultSecretIdentifier, SecretClient  # noqa: PLC0415

    try:
        secret_id = KeyVaultSecretIdentifier(url)
    except ValueError as err:
        raise KeyVaultError(
            f"{url!r} is not a Key Vault secret URL such as "
            "https://NAME.vault.azure.net/secrets/NAME"
        ) from err
    if not secret_id.vault_url.lower().startswith("https://"):
        raise KeyVaultError(f"the Key Vault URL must be https://, got {url!r}")
    client = SecretClient(secret_id.vault_url, credential(identity))
    try:
        value = client.get_secret(secret_id.name, secret_id.version).value
    except AzureError as err:
        raise KeyVaultError(
            f"cannot read secret {secret_id.name} from {secret_id.vault_url} "
            f"({type(err).__name__}: {err}); the identity needs the Key Vault "
            f"Secrets User role; {CREDENTIAL_ADVICE}"
        ) from None
    finally:
        client.close()
    if not value:
        raise KeyVaultError(f"secret {secret_id.name} is empty")
    return value

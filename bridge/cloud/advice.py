"""What to do when no credential yields a token: said in every cloud component's error.

A module of its own so that bridge.cloud.managedidentity, which bridge.cloud.identity builds,
says it without importing identity back.
"""

CREDENTIAL_ADVICE = (
    "on a VM enable its managed identity (set identity.client_id for a user-assigned one); "
    "elsewhere sign in with `az login` or set AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET"
)

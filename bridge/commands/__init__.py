"""The command message a consumer sends down one VM's channel, and the Ed25519 signatures that
make it trustworthy (docs/contracts.md#command)."""

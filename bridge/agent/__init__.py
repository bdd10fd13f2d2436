"""The agent: one process per VM. It polls IMDS, turns each new Scheduled Events document into
records, keeps them in the outbox, runs local hooks, and applies approvals from its own channel.

`command` is the entry point (`se-bridge agent`, `se-bridge check`); `loop` ties the stages
together."""

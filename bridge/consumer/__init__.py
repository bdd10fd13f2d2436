"""The consumer: reads the fleet's records, keeps fleet state, applies the approval policy with
its budgets, and sends signed approvals down each VM's channel.

`service` is the standalone worker (`se-bridge consume`), `functionapp` the Azure Functions
app; `wiring` builds the consumer core (`core`) from the configuration for both."""

"""The IMDS simulator (`se-bridge simulate`): a fleet of simulated VMs, each with its own
Scheduled Events document, served over HTTP with faults and a control API for tests and demos."""

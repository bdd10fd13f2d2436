"""Helpers the tests share (none of them a test, none collected by pytest).

records          the record schema validator, the seed documents, event records, a scripted sink
fleetrecords     records of a whole fleet for the consumer's tests
processes        se-bridge processes started by a test (the `procs` fixture) and their output
cloud            the agent's settings for the Event Hubs broker and the Logs Ingestion double
azurite          Azurite, the Azure Storage emulator (one per pytest worker, on free ports)
state            the fleet state tests' Azurite settings and a store that hands calls on
channel_contract the contract every command channel passes
consumer_cloud   the consumer against Azurite and the broker
agentharness     an in-process agent against the simulator
approvals        an agent with a command listener, and signed approvals for it
killtools        the kill -9 durability test's script and checks
bicep, kql       reading infra/ (Bicep files, KQL texts through the Kusto analyser)
lock             the lock and its exports
"""

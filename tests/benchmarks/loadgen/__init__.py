"""The fleet load generator (issue 15): N model agents' exact record stream, played into local
hubs or the Event Hubs test broker for real `se-bridge consume` processes, and what the
consumers made of it.

`python -m tests.benchmarks.loadgen --help` says how to run it. The parts, bottom up:

- `fleet`: a seeded fleet description (subscriptions, resource groups, scale sets in
  placement groups, availability sets, standalone and Spot VMs, zones, fault domains, tags);
- `policy`: the policy file the consumers run, and an independent reading of its rules and
  budget groups to check their decisions against;
- `agents`: one model agent per VM, making records with the agent's own builders and its own
  normaliser, so schema, RecordIds and transitions are the real ones;
- `waves`: the named, seeded scenarios (freeze, spot-storm, rolling-reboot, scale-in, steady);
- `sim`: the fleet in fleet time: heartbeats, events appearing, approvals answered, events
  starting and ending, VMs deleted or silent;
- `play`: the live run: local hubs or the broker (records in through the azure-eventhub
  producer, lag read from the consumers' blob checkpoints), consumer processes, the command
  directory, samples of lag, memory and state size;
- `measure`: pure arithmetic over what was recorded: lag, decision latency, budget
  violations, wrong approvals, and the report;
- `lagging`: a wave in fleet time through in-process consumer cores, one of them held back
  on one partition past `alive_within`: the slots it releases against a caught-up twin's
  (issue 27; `python -m tests.benchmarks.loadgen.lagging`).

It is a benchmark, never collected by pytest (tests/benchmarks/conftest.py); its own check on
a tiny fleet is tests/benchmarks/test_loadgen.py.
"""

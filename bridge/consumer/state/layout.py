"""The consumer's collections of fleet state, and how the `tables` store spreads them: the
consumer's documents (bridge.consumer.documents) name them from here, and the store kinds
(bridge.consumer.state.kinds) give a TableStore the spread, so a store needs nothing above it.
"""

from __future__ import annotations

VM, EVENT, LEDGER = "vm", "event", "ledger"
# What people decided (bridge.consumer.people.operatorlog): few documents, each signed by the
# consumer.
OPERATOR = "operator"
# VMs as resource health reports them (issue 36): one document per VM Azure reported on.
HEALTH = "health"
# Update Manager's patch runs (issue 40): one document per run, kept until a day after it ends.
PATCHRUN = "patchrun"
# The week ahead (issue 40): one document, the newest pass's summary, bounded in size.
WEEKAHEAD = "weekahead"
# Table Storage partitions of each collection (bridge.consumer.state.tables): where every VM
# of a placement group reports each event, a Spot eviction storm asks several times one
# partition's target of `event` and `vm` (the figures are in
# docs/capacity.md#figures-behind-the-codes-choices). Not more partitions than that needs
# twice over: a batch's documents fall on up to this many partitions, a request each.
# The ledger stays in one: its writes are entity-group transactions. Every consumer of a
# table must agree on these (changing them needs them all stopped).
PARTITIONS = {VM: 16, EVENT: 16}

"""The ledger storm benchmark (tests/benchmarks/ledger_storm.py) on a small fleet, so that
its counts can be trusted: every Preempt the policy allows is approved once, and what it
charges the ledger's table partition adds up."""

from __future__ import annotations

import pytest

from tests.benchmarks.ledger_storm import render, run


@pytest.mark.slow
def test_two_consumers_in_a_small_storm_approve_once_and_their_reads_add_up() -> None:
    result = run(3000, 2, seed=1, say=lambda _: None)
    p = result.load
    assert result.events == 300
    assert result.approvals > 0
    assert result.approved_twice == 0
    assert result.actions["Approve"] >= result.approvals
    # At most a look at each re-evaluation pass (every 5 fleet seconds each), and no other: a
    # batch decides on the ledger kept, and a conflict reads what it changed, not the ledger.
    # A pass after one that found nothing open skips its look until the feed interval passed
    # (issue 35), so a storm's quiet moments cost fewer.
    assert result.passes >= 2 * result.seconds / 5
    assert 0 < p.looks <= result.passes
    assert p.look_entities >= p.looks  # a look returns its consumer's previous writes at least
    assert p.written_entities >= 2 * result.approvals  # an entry and a lock at least
    # What the partition served: the looks, the reads by key, and the writes. None failed:
    # played one after another, nothing writes between an approval's read of its groups'
    # locks and its write, and only such a write makes it conflict.
    assert p.conflicts == 0
    ledger = sum(n for (home, _), n in p.per_second.items() if home == "ledger")
    assert ledger == p.look_entities + p.fetched + p.written_entities
    assert p.fetched >= 3 * result.approvals  # at least a lock and the shard, and a release
    assert 0 < p.busiest("ledger")[1] <= ledger / 10
    # The other collections are spread: their busiest partition is one of 16.
    home, rate = p.busiest("event")
    assert home.startswith("event-")
    assert rate > 0
    assert p.busiest("vm")[0].startswith("vm-")
    assert "| 2 consumers |" in render([result], "test")

"""`policy replay` of a large file begins before the file is read (issue 40: a million records
in under a minute): what `replay_chunks` returns is always what `replay` returns of every
chunk's records, in order or not, with the Decision records read ahead or not."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from datetime import timedelta
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.config import ConsumerSettings
from bridge.consumer import replay as replaying
from bridge.consumer.replay import History, Replay, Replayer, replay, replay_chunks
from bridge.policy.file import loads
from bridge.policy.model import Policy
from tests.benchmarks.bench_replay import POLICY, START, history


def policy(changed: bool = False) -> Policy:
    """Benchmark 13's policy, or one that holds what it approved."""
    text = POLICY.replace("action: approve", "action: hold") if changed else POLICY
    return loads(text, "policy.yaml")


@cache
def recorded() -> tuple[dict[str, Any], ...]:
    """A fleet's records in time order, then the Decision records a consumer took of them:
    a file as benchmark 13 writes it (2,000 records)."""
    agents = history(2_000)
    recorder = Replayer(policy(), ConsumerSettings(), START)
    recorder.feed(History.of(agents).agents)
    recorder.close()
    assert len(recorder.decisions) > 5
    return (*agents, *(dict(d) for d in recorder.decisions))


def cut(records: Sequence[dict[str, Any]], sizes: Sequence[int]) -> list[list[dict[str, Any]]]:
    """`records` in chunks of `sizes` (the last size again until none is left)."""
    chunks, at, n = [], 0, 0
    while at < len(records):
        size = sizes[min(n, len(sizes) - 1)]
        chunks.append(list(records[at : at + size]))
        at, n = at + size, n + 1
    return chunks


def ahead(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("RecordType") == "Decision"]


def whole(records: Sequence[dict[str, Any]], changed: bool = False) -> Replay:
    return replay(records, policy(changed), ConsumerSettings())


@pytest.fixture
def replayers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each Replayer made was fed, in order (a second: replayed again).
    Records are handed on once one a minute newer is read (the history spans ten)."""
    monkeypatch.setattr(replaying, "ORDER_SLACK", timedelta(minutes=1))
    fed: list[int] = []
    made = Replayer.__init__
    process = Replayer._process

    def counting(self: Replayer, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        fed.append(0)

    def folding(self: Replayer, batch: list[Any], at: Any) -> None:
        fed[-1] += len(batch)
        process(self, batch, at)

    monkeypatch.setattr(Replayer, "__init__", counting)
    monkeypatch.setattr(replaying.Replayer, "_process", folding)
    return fed


@pytest.mark.parametrize("sizes", [[1], [7], [500], [1_999, 1], [3, 900, 50]])
def test_a_history_replayed_as_it_is_read_is_the_whole_historys_replay(
    sizes: list[int], replayers: list[int]
) -> None:
    records = recorded()
    expected = whole(records)
    assert expected.decisions > 5
    assert not expected.differing
    replayers.clear()
    got = replay_chunks(cut(records, sizes), ahead(records), policy(), ConsumerSettings())
    assert got == expected
    assert len(replayers) == 1  # replayed once, as it was read


def test_the_first_chunks_are_replayed_before_the_last_is_read(replayers: list[int]) -> None:
    records = recorded()
    fed_before_last: list[int] = []

    def read() -> Iterator[list[dict[str, Any]]]:
        chunks = cut(records, [250])
        yield from chunks[:-1]
        fed_before_last.append(replayers[-1])
        yield chunks[-1]

    got = replay_chunks(read(), ahead(records), policy(changed=True), ConsumerSettings())
    assert got == whole(records, changed=True)
    assert got.differing  # what the changed policy holds, found as in the whole history
    assert fed_before_last[0] > 1_000, fed_before_last


def test_records_a_little_out_of_time_order_are_replayed_once(replayers: list[int]) -> None:
    records = list(recorded())
    # Each VM's clock, the order records arrived in: a few seconds apart, across chunks' ends.
    for at in range(399, 1_999, 400):
        records[at - 3 : at + 3] = records[at - 3 : at + 3][::-1]
    expected = whole(records)
    replayers.clear()
    got = replay_chunks(cut(records, [400]), ahead(records), policy(), ConsumerSettings())
    assert got == expected
    assert replayers == [2_000]  # replayed once, every record


def test_chunks_out_of_time_order_are_replayed_again_as_a_whole(
    replayers: list[int],
) -> None:
    records = recorded()
    chunks = cut(records, [400])
    chunks[0], chunks[2] = chunks[2], chunks[0]  # a later hour first, as an export may be
    shuffled = [r for chunk in chunks for r in chunk]
    expected = whole(shuffled)
    replayers.clear()
    assert replay_chunks(chunks, ahead(shuffled), policy(), ConsumerSettings()) == expected
    assert len(replayers) == 2, replayers  # begun, then again with every record


@pytest.mark.parametrize("told", ["none", "one fewer", "one more", "another order"])
def test_decisions_read_ahead_that_are_not_the_chunks_are_replayed_again_as_a_whole(
    told: str, replayers: list[int]
) -> None:
    records = recorded()
    decisions = ahead(records)
    wrong = {
        "none": [],
        "one fewer": decisions[1:],
        "one more": [*decisions, decisions[0]],
        "another order": decisions[::-1],
    }[told]
    expected = whole(records)
    replayers.clear()
    assert replay_chunks(cut(records, [300]), wrong, policy(), ConsumerSettings()) == expected
    assert len(replayers) == 2


def test_a_history_of_decisions_alone_or_of_nothing_is_the_whole_historys() -> None:
    decisions = ahead(recorded())
    for records in (decisions, []):
        got = replay_chunks(cut(records, [5]), ahead(records), policy(), ConsumerSettings())
        assert got == whole(records)


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 800), min_size=1, max_size=5),
    swaps=st.lists(st.tuples(st.integers(0, 1_999), st.integers(0, 1_999)), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_any_chunks_of_any_order_replay_as_the_whole(
    sizes: list[int], swaps: list[tuple[int, int]], seed: int
) -> None:
    records = list(recorded())
    for a, b in swaps:  # records out of place, or not
        records[a], records[b] = records[b], records[a]
    told = ahead(records) if random.Random(seed).random() < 0.8 else []
    with pytest.MonkeyPatch.context() as patch:  # the history spans ten minutes
        patch.setattr(replaying, "ORDER_SLACK", timedelta(seconds=seed % 120))
        got = replay_chunks(cut(records, sizes), told, policy(), ConsumerSettings())
    assert got == whole(records)

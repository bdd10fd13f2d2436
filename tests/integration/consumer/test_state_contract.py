"""The fleet state contract, run against every store: SQLite, Table Storage (Azurite) and memory."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bridge.consumer.state import (
    MAX_VALUE_CHARS,
    Conflict,
    Doc,
    Store,
    tables,
    update_many,
)
from bridge.consumer.state.kinds import table_store
from bridge.consumer.state.memory import MemoryStore
from bridge.consumer.state.sqlite import SqliteStore
from bridge.consumer.state.tables import TableStore
from tests.support.azurite import Azurite
from tests.support.state import DelegatingStore, increment, tables_config, unique_table

# Every character Table Storage refuses in a key, `%` (the escape character itself, and
# a literal escape sequence that must not collide with "/"), and text beyond the BMP.
AWKWARD_KEYS = [
    "vm/1",
    "vm%2F1",
    "back\\slash",
    "#hash",
    "what?",
    "100%",
    "tab\there",
    "ctl\x00\x1f\x7f\x85\x9f",
    'quote\'d "both"',
    "Zürich ✓ 😀",
    "",
]


# The collections the contract uses, each spread over partitions in the third store (as the
# consumer spreads `vm` and `event`, bridge.consumer.documents.PARTITIONS); `ledger` is
# written in transactions and stays in one.
SPREAD = {"vms": 4, "events": 3, "vm": 5}


AZURITE = pytest.mark.azurite


@pytest.fixture(
    params=[
        "sqlite",
        "memory",
        pytest.param("tables", marks=AZURITE),
        pytest.param("tables-spread", marks=AZURITE),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store
    if request.param == "sqlite":
        opened = SqliteStore(tmp_path / "fleet.db")
    elif request.param == "memory":
        opened = MemoryStore()
    else:
        azurite = request.getfixturevalue("azurite")
        spread = SPREAD if request.param == "tables-spread" else None
        opened = table_store(
            tables_config(azurite.connection_string), unique_table(), spread=spread
        )
    yield opened
    opened.close()


def test_a_missing_document_reads_as_none(store: Store) -> None:
    assert store.read("vms", "nobody") is None
    assert store.scan("vms") == []


def test_create_read_update_with_etags(store: Store) -> None:
    created = store.write("vms", Doc("vm-1", {"Status": "Scheduled", "N": [1, 2]}))
    assert created.etag is not None
    read = store.read("vms", "vm-1")
    assert read == Doc("vm-1", {"Status": "Scheduled", "N": [1, 2]}, created.etag)

    read.value["Status"] = "Started"
    updated = store.write("vms", read)
    assert updated.etag not in (None, created.etag)
    assert store.read("vms", "vm-1") == Doc("vm-1", read.value, updated.etag)
    assert read.value == {"Status": "Started", "N": [1, 2]}


def test_a_stale_etag_is_a_conflict_and_changes_nothing(store: Store) -> None:
    first = store.write("vms", Doc("vm-1", {"n": 1}))
    second = store.write("vms", Doc("vm-1", {"n": 2}, first.etag))
    with pytest.raises(Conflict):
        store.write("vms", Doc("vm-1", {"n": 3}, first.etag))
    assert store.read("vms", "vm-1") == Doc("vm-1", {"n": 2}, second.etag)


def test_creating_twice_is_a_conflict(store: Store) -> None:
    store.write("vms", Doc("vm-1", {"by": "a"}))
    with pytest.raises(Conflict):
        store.write("vms", Doc("vm-1", {"by": "b"}))
    current = store.read("vms", "vm-1")
    assert current is not None
    assert current.value == {"by": "a"}


def test_updating_a_deleted_document_is_a_conflict(store: Store) -> None:
    doc = store.write("vms", Doc("vm-1", {"n": 1}))
    store.delete("vms", doc)
    with pytest.raises(Conflict):
        store.write("vms", Doc("vm-1", {"n": 2}, doc.etag))
    assert store.read("vms", "vm-1") is None


def test_an_etag_from_before_a_delete_never_matches_the_document_created_after(
    store: Store,
) -> None:
    old = store.write("vms", Doc("vm-1", {"gen": 1}))
    store.delete("vms", old)
    new = store.write("vms", Doc("vm-1", {"gen": 2}))
    with pytest.raises(Conflict):
        store.write("vms", Doc("vm-1", {"gen": 3}, old.etag))
    with pytest.raises(Conflict):
        store.delete("vms", old)
    assert store.read("vms", "vm-1") == Doc("vm-1", {"gen": 2}, new.etag)


def test_delete_is_conditional_and_quiet_when_already_gone(store: Store) -> None:
    first = store.write("events", Doc("e1", {"n": 1}))
    second = store.write("events", Doc("e1", {"n": 2}, first.etag))
    with pytest.raises(Conflict):
        store.delete("events", first)
    assert store.read("events", "e1") == Doc("e1", {"n": 2}, second.etag)

    store.delete("events", second)
    assert store.read("events", "e1") is None
    store.delete("events", second)  # already gone: what the caller wanted
    store.delete("events", Doc("never-stored"))


def test_deleting_a_document_read_as_absent_conflicts_once_it_exists(store: Store) -> None:
    store.write("events", Doc("e1", {"n": 1}))
    with pytest.raises(Conflict):
        store.delete("events", Doc("e1"))
    assert store.read("events", "e1") is not None


def test_scan_returns_one_collection_in_key_order(store: Store) -> None:
    keys = [*AWKWARD_KEYS, "a", "b", "vm-10", "vm-2", "vm0"]
    for key in random.Random(7).sample(keys, len(keys)):
        store.write("vms", Doc(key, {"key": key}))
    store.write("events", Doc("vm-2", {"other": True}))

    scanned = store.scan("vms")
    assert [d.key for d in scanned] == sorted(keys)
    assert all(d.value == {"key": d.key} for d in scanned)
    assert all(d == store.read("vms", d.key) for d in scanned)  # etags usable as read
    assert [d.value for d in store.scan("events")] == [{"other": True}]


@pytest.mark.parametrize("key", AWKWARD_KEYS)
def test_keys_and_collections_with_forbidden_characters_round_trip(store: Store, key: str) -> None:
    collection = f"c/{key}"
    doc = store.write(collection, Doc(key, {"key": key}))
    assert store.read(collection, key) == doc
    assert store.scan(collection) == [doc]
    updated = store.write(collection, Doc(key, {"key": key, "v": 2}, doc.etag))
    store.delete(collection, updated)
    assert store.read(collection, key) is None


def test_large_values_round_trip_and_shrink(store: Store) -> None:
    rng = random.Random(1)
    big = {"blob": "".join(rng.choice("abcdefgh\u00e9\u2713") for _ in range(200_000)), "n": 1}
    written = store.write("ledger", Doc("big", big))
    assert store.read("ledger", "big") == written
    assert written.value == big

    small = store.write("ledger", Doc("big", {"n": 2}, written.etag))
    assert store.read("ledger", "big") == Doc("big", {"n": 2}, small.etag)


def test_a_value_too_large_for_table_storage_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match=f"at most {MAX_VALUE_CHARS}"):
        store.write("ledger", Doc("huge", {"blob": "x" * MAX_VALUE_CHARS}))
    assert store.read("ledger", "huge") is None


def test_a_value_that_is_not_a_json_object_is_refused(store: Store) -> None:
    with pytest.raises(TypeError):
        store.write("ledger", Doc("nan", {"x": float("nan")}))
    with pytest.raises(TypeError):
        store.write("ledger", Doc("set", {"x": {1, 2}}))
    assert store.scan("ledger") == []


class ReadTogether(DelegatingStore):
    """Each thread's first read returns only once the other thread has read too: both then
    hold the same version, and one write must conflict, however the threads are scheduled
    (a store as quick as memory let one thread finish before the other began)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.both = threading.Barrier(2)
        self.done = threading.local()

    def read(self, collection: str, key: str) -> Doc | None:
        doc = self.inner.read(collection, key)
        if not getattr(self.done, "read", False):
            self.done.read = True
            self.both.wait()
        return doc


def test_two_threads_incrementing_one_counter_lose_no_update(store: Store) -> None:
    times = 30
    conflicts: list[int] = []
    together = ReadTogether(store)

    def run() -> None:
        conflicts.append(increment(together, "counters", "c", times))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counter = store.read("counters", "c")
    assert counter is not None
    assert counter.value == {"n": 2 * times}
    assert sum(conflicts) > 0  # they did contend: the Conflicts were what kept the count exact


# --- many documents at once (bridge.consumer.state.update_many) ---------------------------


def test_read_many_returns_the_stored_documents_among_the_keys(store: Store) -> None:
    written = {key: store.write("vms", Doc(key, {"k": key})) for key in AWKWARD_KEYS}
    store.write("other", Doc("vm/1", {"not": "this"}))
    found = store.read_many("vms", [*AWKWARD_KEYS, "nobody", "vm/1"])
    assert found == written


def test_write_many_writes_what_is_current_and_names_every_stale_key(store: Store) -> None:
    old = store.write("vms", Doc("stale", {"n": 1}))
    store.write("vms", Doc("stale", {"n": 2}, old.etag))
    kept = store.write("vms", Doc("kept", {"n": 1}))
    docs = [
        Doc("new", {"n": 1}),
        Doc("kept", {"n": 2}, kept.etag),
        Doc("stale", {"n": 3}, old.etag),
    ]
    stored, conflicted = store.write_many("vms", docs)
    # A store may refuse a whole transaction for one stale document (Table Storage does).
    assert "stale" in conflicted
    assert sorted(d.key for d in stored) == sorted({"new", "kept"} - set(conflicted))
    for doc in stored:
        assert store.read("vms", doc.key) == doc
    assert store.read("vms", "stale").value == {"n": 2}  # type: ignore[union-attr]


def test_write_many_writes_more_than_one_transaction_holds(store: Store) -> None:
    docs = [Doc(f"vm{i:03d}", {"n": i}) for i in range(150)]
    stored, conflicted = store.write_many("vms", docs)
    assert conflicted == []
    assert [d.value["n"] for d in store.scan("vms")] == list(range(150))
    assert {d.key: d.etag for d in stored} == {d.key: d.etag for d in store.scan("vms")}


def test_update_many_lands_every_mutation_on_the_newest_version(store: Store) -> None:
    """Two threads adding to the same 20 counters many at a time lose no addition."""
    keys, rounds = [f"c{i}" for i in range(20)], 6
    start = threading.Barrier(2)

    def add(value: dict[str, Any]) -> bool:
        value["n"] = value.get("n", 0) + 1
        return True

    def run() -> None:
        start.wait()
        for _ in range(rounds):
            update_many(store, "counters", dict.fromkeys(keys, add))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {d.key: d.value["n"] for d in store.scan("counters")} == dict.fromkeys(keys, 2 * rounds)


def test_update_many_writes_nothing_for_mutations_that_change_nothing(store: Store) -> None:
    there = store.write("vms", Doc("there", {"n": 1}))
    result = update_many(store, "vms", {"there": lambda _: False, "absent": lambda _: False})
    assert result == {"there": there, "absent": None}
    assert store.read("vms", "absent") is None


def test_write_all_stores_every_document_or_none(store: Store) -> None:
    a = store.write("ledger", Doc("a", {"n": 1}))
    b = store.write("ledger", Doc("b", {"n": 1}))
    written = store.write_all(
        "ledger", [Doc("a", {"n": 2}, a.etag), Doc("b", {"n": 2}, b.etag), Doc("c", {"n": 1})]
    )
    assert [d.key for d in written] == ["a", "b", "c"]
    assert {d.key: d.value["n"] for d in store.scan("ledger")} == {"a": 2, "b": 2, "c": 1}
    # One stale ETag (b's first version), one document created meanwhile: nothing is written.
    for stale in (Doc("b", {"n": 3}, b.etag), Doc("c", {"n": 3})):
        with pytest.raises(Conflict):
            store.write_all("ledger", [Doc("a", {"n": 3}, written[0].etag), stale])
        assert {d.key: d.value["n"] for d in store.scan("ledger")} == {"a": 2, "b": 2, "c": 1}
    again = store.write_all("ledger", [Doc("a", {"n": 4}, written[0].etag)])
    assert store.read("ledger", "a") == Doc("a", {"n": 4}, again[0].etag)


def test_write_all_refuses_more_than_one_transaction_holds(store: Store) -> None:
    with pytest.raises(ValueError, match="transaction"):
        store.write_all("ledger", [Doc(f"k{n}", {}) for n in range(101)])
    assert store.scan("ledger") == []


def another_client(store: Store) -> Store:
    """A second client of the same fleet state, as another consumer process holds."""
    if isinstance(store, SqliteStore):
        return SqliteStore(store.path)
    if isinstance(store, MemoryStore):
        return store.another()
    assert isinstance(store, TableStore)
    config = tables_config(store._storage.connection_string)
    return table_store(config, store.table_name, spread=store.spread)


def test_scan_changes_returns_what_any_client_wrote_since_the_mark(store: Store) -> None:
    # The consumers' view of the fleet and of the ledger follows this feed, on both stores
    # (Table Storage's from the Timestamps it writes): what another consumer wrote comes,
    # and with the versions held passed back, nothing else.
    theirs = another_client(store)
    first = store.write("vm", Doc("a", {"n": 1}))
    store.write("event", Doc("e", {"n": 1}))
    everything, mark = store.scan_changes("vm", None)
    assert everything == [first]
    held = {first.key: first}
    assert store.scan_changes("vm", mark, held)[0] == []
    theirs.write("vm", Doc("b", {"n": 1}))
    _, conflicted = theirs.write_many("vm", [Doc("a", {"n": 2}, first.etag), Doc("c", {})])
    theirs.write("event", Doc("f", {"n": 1}))  # another collection's writes are not this one's
    changed, later = store.scan_changes("vm", mark, held)
    assert conflicted == []
    assert [(d.key, d.value) for d in changed] == [("a", {"n": 2}), ("b", {"n": 1}), ("c", {})]
    assert changed == store.scan("vm")
    assert later >= mark
    held.update((d.key, d) for d in changed)
    assert store.scan_changes("vm", later, held)[0] == []
    theirs.close()


class Interleaved:
    """A table client whose queries come one entity a page, with `between` run once after
    the first page: another consumer writing while a look reads its pages."""

    def __init__(self, inner: Any, between: Callable[[], None]) -> None:
        self.inner, self.between = inner, between

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def query_entities(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for index, entity in enumerate(
            self.inner.query_entities(*args, **{**kwargs, "results_per_page": 1})
        ):
            yield entity
            if index == 0:
                self.between()


@pytest.mark.parametrize("spread", [None, {"vm": 2}], ids=["one-partition", "spread"])
def test_a_look_misses_no_document_written_while_its_pages_were_read(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch, spread: dict[str, int] | None
) -> None:
    # A look of several pages is no snapshot: `a` is rewritten after its page was read and
    # `z` after it, on a later page. The next look must still bring `a`'s new version, even
    # with no overlap at all; a mark at the newest Timestamp seen (z's) lost it.
    monkeypatch.setattr(tables, "CHANGE_OVERLAP", timedelta(0))
    config = tables_config(azurite.connection_string)
    ours = table_store(config, unique_table(), spread=spread)
    theirs = table_store(config, ours.table_name, spread=spread)
    # The look starts from a mark older than the three writes: a mark is the service's Date,
    # to the second, and one taken after the writes left a and b out of the look whenever a
    # second began between them and it (seen once in CI).
    _, mark = ours.scan_changes("vm", None)
    a, _, z = (ours.write("vm", Doc(key, {"n": 1})) for key in ("a", "b", "z"))

    def meanwhile() -> None:
        theirs.write("vm", Doc("a", {"n": 2}, a.etag))
        time.sleep(0.05)
        theirs.write("vm", Doc("z", {"n": 2}, z.etag))

    table = ours._table()
    monkeypatch.setattr(ours, "_table", lambda *_: Interleaved(table, meanwhile))
    seen, later = ours.scan_changes("vm", mark)
    assert {d.key: d.value["n"] for d in seen} == {"a": 1, "b": 1, "z": 2}
    monkeypatch.setattr(ours, "_table", lambda *_: table)
    again, _ = ours.scan_changes("vm", later, {d.key: d for d in seen})
    assert {d.key: d.value["n"] for d in again} == {"a": 2}
    ours.close()
    theirs.close()

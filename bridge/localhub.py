"""The local hub: Event Hubs on one machine, for the demo and for setups without Azure.

A directory holding one SQLite database (WAL, so readers never block the writer, and a busy
timeout, so several agent processes can append at once). Like Event Hubs it has a fixed
number of partitions; a record's partition is a stable hash of its partition key (the VmId),
so one VM's records stay in order. Offsets count up from 0 within each partition. Consumer
groups keep a checkpoint per partition: the offset of the last message handled.

Records are never deleted: the hub is meant for demos and single machines, where what the
agents write in a day is small.

    hub = LocalHub(Path("/var/lib/se-bridge/hub"))
    hub.append([("vm-1", '{"RecordId": ...}')])      # -> [(partition, offset)]
    hub.read(partition=2, after_offset=-1, limit=100)  # -> [(offset, body), ...]

The hub sink (bridge.sinks.hub) writes here; the consumer reads it
(bridge.consumer.sources.hub), so the store sits below both.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from bridge import sqlitewal
from bridge.records import iso, utc_now

log = logging.getLogger(__name__)

PARTITIONS = 4
DB_NAME = "hub.db"
BUSY_TIMEOUT_MS = 5000
NOTHING = -1  # the checkpoint of a partition nothing has been handled from yet

_SCHEMA = (
    'CREATE TABLE IF NOT EXISTS records ("partition" INTEGER NOT NULL, "offset" INTEGER NOT NULL,'
    " partition_key TEXT NOT NULL, body TEXT NOT NULL, enqueued_time TEXT NOT NULL,"
    ' PRIMARY KEY ("partition", "offset")) WITHOUT ROWID',
    "CREATE TABLE IF NOT EXISTS checkpoints (consumer_group TEXT NOT NULL,"
    ' "partition" INTEGER NOT NULL, "offset" INTEGER NOT NULL, updated TEXT NOT NULL,'
    ' PRIMARY KEY (consumer_group, "partition"))',
)
_LAST_OFFSETS = 'SELECT "partition", MAX("offset") FROM records GROUP BY "partition"'
_INSERT = (
    'INSERT INTO records ("partition", "offset", partition_key, body, enqueued_time)'
    " VALUES (?, ?, ?, ?, ?)"
)
_READ = (
    'SELECT "offset", body, partition_key FROM records WHERE "partition" = ? AND "offset" > ?'
    ' ORDER BY "offset" LIMIT ?'
)
_CHECKPOINT = (
    'INSERT INTO checkpoints (consumer_group, "partition", "offset", updated) VALUES (?, ?, ?, ?)'
    ' ON CONFLICT (consumer_group, "partition") DO UPDATE SET "offset" = excluded."offset",'
    " updated = excluded.updated"
)


def partition_for(key: str) -> int:
    """The partition of partition key `key`: the same in every process and on every run."""
    return zlib.crc32(key.encode("utf-8")) % PARTITIONS


class LocalHub:
    """One process's connection to a hub directory; safe to share between its threads."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / DB_NAME
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # An agent forgets a record once the hub took it: a commit must be on disk.
        self._conn = sqlitewal.connect(
            self.path, synchronous="FULL", busy_timeout_ms=BUSY_TIMEOUT_MS
        )
        try:
            with self._transaction():
                for statement in _SCHEMA:
                    self._conn.execute(statement)
        except BaseException:
            self._conn.close()
            raise

    def append(self, messages: Sequence[tuple[str, str]]) -> list[tuple[int, int]]:
        """Store (partition key, body) `messages` in one transaction: their (partition, offset)."""
        enqueued = iso(utc_now())
        placed: list[tuple[int, int]] = []
        with self._transaction():
            last = dict(self._conn.execute(_LAST_OFFSETS).fetchall())
            for key, body in messages:
                partition = partition_for(key)
                offset = last.get(partition, NOTHING) + 1
                last[partition] = offset
                self._conn.execute(_INSERT, (partition, offset, key, body, enqueued))
                placed.append((partition, offset))
        return placed

    def read(self, partition: int, after_offset: int, limit: int) -> list[tuple[int, str]]:
        """Up to `limit` (offset, body) of `partition` after `after_offset`, in order."""
        return [
            (offset, body) for offset, body, _ in self.read_sent(partition, after_offset, limit)
        ]

    def read_sent(
        self, partition: int, after_offset: int, limit: int
    ) -> list[tuple[int, str, str]]:
        """As `read`, with each message's partition key: who the sender says it is."""
        with self._lock:
            rows = self._conn.execute(_READ, (partition, after_offset, limit)).fetchall()
        return [(int(offset), str(body), str(key)) for offset, body, key in rows]

    def checkpoint(self, group: str, partition: int, offset: int) -> None:
        """Record that `group` has handled `partition` up to and including `offset`."""
        with self._transaction():
            self._conn.execute(_CHECKPOINT, (group, partition, offset, iso(utc_now())))

    def checkpoints(self, group: str) -> dict[int, int]:
        """Every partition's checkpoint for `group` (NOTHING where none was made yet)."""
        with self._lock:
            rows = self._conn.execute(
                'SELECT "partition", "offset" FROM checkpoints WHERE consumer_group = ?', (group,)
            ).fetchall()
        found = {int(partition): int(offset) for partition, offset in rows}
        return {partition: found.get(partition, NOTHING) for partition in range(PARTITIONS)}

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> LocalHub:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            # IMMEDIATE takes the write lock up front, so two appenders never both read the same
            # last offset; the busy timeout makes the second one wait its turn.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

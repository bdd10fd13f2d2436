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

`run_local` is the consumer loop over a hub: the counterpart of `run_eventhubs`.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType

from bridge.consumer.sources.batches import (
    BatchRetry,
    Message,
    PoisonHandler,
    RecordHandler,
    log_poison,
)
from bridge.outbox import sqlitewal
from bridge.redact import describe
from bridge.retry import Backoff

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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
        enqueued = _now()
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
            self._conn.execute(_CHECKPOINT, (group, partition, offset, _now()))

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


def run_local(
    hub_dir: Path | str,
    handler: RecordHandler,
    stop: threading.Event,
    *,
    group: str = "$Default",
    batch_size: int = 100,
    poll_interval: float = 0.2,
    poison: PoisonHandler = log_poison,
    backoff_factory: Callable[[], Backoff] = Backoff,
) -> None:
    """Hand every record of the hub to `handler`, batch by batch, until `stop` is set.

    Each partition resumes after `group`'s checkpoint, which moves only after the handler
    returned. One consumer per group: two in the same group would both handle everything.
    """
    retry = BatchRetry(handler, poison, stop, f"local hub {hub_dir}", backoff_factory())
    _LocalConsumer(Path(hub_dir), group, batch_size, retry, backoff_factory()).run(poll_interval)


class _LocalConsumer:
    def __init__(
        self, directory: Path, group: str, batch_size: int, retry: BatchRetry, backoff: Backoff
    ) -> None:
        self._directory, self._group, self._batch_size = directory, group, batch_size
        self._retry, self._backoff = retry, backoff
        self._hub: LocalHub | None = None
        self._failures = 0

    def run(self, poll_interval: float) -> None:
        try:
            while not self._retry.stop.is_set():
                try:
                    busy = self._round()
                except Exception as err:  # the loop never dies: a broken hub is reopened
                    self._trouble(err)
                    continue
                self._recovered()
                if not busy:
                    self._retry.wait(poll_interval)
        finally:
            self._drop()

    def _round(self) -> bool:
        """One batch from each partition with records to handle: whether there was any."""
        if self._hub is None:
            self._hub = LocalHub(self._directory)
        busy = False
        for partition, done in self._hub.checkpoints(self._group).items():
            rows = self._hub.read_sent(partition, done, self._batch_size)
            if not rows:
                continue
            messages = [Message(str(offset), body, key) for offset, body, key in rows]
            if not self._retry.deliver(str(partition), messages):
                return False  # stopped: this batch stays unhandled and comes again next run
            self._hub.checkpoint(self._group, partition, rows[-1][0])
            busy = True
        return busy

    def _trouble(self, err: Exception) -> None:
        self._failures += 1
        self._drop()
        delay = self._backoff.delay_for(err)
        if self._failures == 1:
            log.warning(
                "cannot read or checkpoint the local hub in %s: %s; retrying in %.1f s "
                "(records handled since the last checkpoint are handled again)",
                *(self._directory, describe(err, with_type=True), delay),
            )
        else:
            log.debug("local hub in %s failed again: %s", self._directory, describe(err))
        self._retry.wait(delay)

    def _recovered(self) -> None:
        if self._failures:
            log.warning(
                "the local hub in %s works again after %d failed attempts",
                *(self._directory, self._failures),
            )
        self._failures = 0
        self._backoff.reset()

    def _drop(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            try:
                hub.close()
            except sqlite3.Error as err:  # closing a broken connection: nothing is lost
                log.debug("closing the local hub failed: %s", describe(err))

"""The consumer's loop over a local hub (bridge.localhub): the counterpart of the Event Hubs
source, for the demo and for setups without Azure.

Each partition resumes after its consumer group's checkpoint, which moves only after the
handler returned, so a crash only hands a batch over again. A read that returns fewer
records than it asked for has reached the end of its partition: the handler is told the
partition is read up to when the read began (bridge/consumer/reading.py), with those
records or with none.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from bridge.consumer.reading import Position, local_partition
from bridge.consumer.sources.batches import (
    BatchRetry,
    BodyHandler,
    Message,
    PoisonHandler,
    RecordHandler,
    log_poison,
)
from bridge.localhub import LocalHub
from bridge.records import utc_now
from bridge.redact import describe
from bridge.retry import Backoff, FailureStreak

log = logging.getLogger(__name__)


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
    on_done: Callable[[str, list[dict[str, object]]], None] | None = None,
    bodies: BodyHandler | None = None,
) -> None:
    """Hand every record of the hub to `handler`, batch by batch, until `stop` is set.

    Each partition resumes after `group`'s checkpoint, which moves only after the handler
    returned. One consumer per group: two in the same group would both handle everything.
    `bodies`: the messages are not records (Event Grid's deliveries): their bodies go there.
    """
    retry = BatchRetry(
        handler, poison, stop, f"local hub {hub_dir}", backoff_factory(), on_done, bodies=bodies
    )
    _LocalConsumer(Path(hub_dir), group, batch_size, retry, backoff_factory()).run(poll_interval)


class _LocalConsumer:
    def __init__(
        self, directory: Path, group: str, batch_size: int, retry: BatchRetry, backoff: Backoff
    ) -> None:
        self._directory, self._group, self._batch_size = directory, group, batch_size
        self._retry, self._streak = retry, FailureStreak(backoff)
        self._hub: LocalHub | None = None
        self._name = str(directory.resolve())

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
            began = utc_now()  # what was appended before this is in what the read returns
            rows = self._hub.read_sent(partition, done, self._batch_size)
            end = began if len(rows) < self._batch_size else None
            messages = [Message(str(offset), body, key) for offset, body, key in rows]
            position = Position(local_partition(self._name, partition), end)
            if not self._retry.deliver(str(partition), messages, position):
                return False  # stopped: this batch stays unhandled and comes again next run
            if rows:
                self._hub.checkpoint(self._group, partition, rows[-1][0])
                busy = True
        return busy

    def _trouble(self, err: Exception) -> None:
        self._drop()
        first, delay = self._streak.failed(err)
        if first:
            log.warning(
                "cannot read or checkpoint the local hub in %s: %s; retrying in %.1f s "
                "(records handled since the last checkpoint are handled again)",
                *(self._directory, describe(err, with_type=True), delay),
            )
        else:
            log.debug("local hub in %s failed again: %s", self._directory, describe(err))
        self._retry.wait(delay)

    def _recovered(self) -> None:
        if ended := self._streak.succeeded():
            log.warning(
                "the local hub in %s works again after %d failed attempts", self._directory, ended
            )

    def _drop(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            try:
                hub.close()
            except sqlite3.Error as err:  # closing a broken connection: nothing is lost
                log.debug("closing the local hub failed: %s", describe(err))

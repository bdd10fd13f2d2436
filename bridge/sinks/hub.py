"""`hub:DIR`: records to a local hub (bridge.localhub), the one-machine stand-in for Event Hubs.

Partition key = VmId (the host name until the VmId is known), as for the eventhubs sink, so
one VM's records stay in order. A batch is stored in one transaction: all of it or nothing.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

from bridge.localhub import DB_NAME, LocalHub
from bridge.retry import PermanentError, RetryableError
from bridge.sinks.base import BaseSink, SpooledRecord, could_write


class HubSink(BaseSink):
    """Appends batches to the hub in `directory`, opening it at the first send."""

    def __init__(self, directory: Path, *, max_batch: int = 500) -> None:
        self.directory = Path(directory)
        self._max_batch = max_batch
        self._hub: LocalHub | None = None

    @property
    def name(self) -> str:
        return f"hub:{self.directory}"

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def send(self, batch: Sequence[SpooledRecord]) -> None:
        messages = [(_partition_key(record.body), record.body) for record in batch]
        try:
            self._get_hub().append(messages)
        except sqlite3.OperationalError as err:
            # "database is locked" past the busy timeout (other agents appending), disk full,
            # a directory not yet mounted: all may pass. The batch comes back after a backoff.
            self._drop()
            raise RetryableError(
                f"cannot append to the local hub in {self.directory}: {err}"
            ) from err
        except (sqlite3.Error, OSError) as err:
            self._drop()
            raise PermanentError(
                f"the local hub in {self.directory} is unusable ({err}); check that it is a "
                f"directory this user can write to, or move {self.directory / DB_NAME} aside"
            ) from err

    def check(self) -> str:
        """Whether a send could open the hub and append, found without creating or opening it."""
        said = could_write(self.directory / DB_NAME)
        # SQLite writes its log and shared memory beside the database.
        if self.directory.is_dir() and not os.access(self.directory, os.W_OK | os.X_OK):
            raise PermanentError(
                f"cannot write in the local hub {self.directory}: permission denied"
            )
        return f"the local hub in {self.directory}: {said}" if self.directory.is_dir() else said

    def close(self) -> None:
        self._drop()

    def _get_hub(self) -> LocalHub:
        if self._hub is None:
            self._hub = LocalHub(self.directory)
        return self._hub

    def _drop(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            hub.close()


def _partition_key(body: str) -> str:
    # A body that is not a record still goes to the hub, where the consumer sets it aside as
    # poison: dropping it here would lose it without a trace.
    try:
        record = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(record, dict):
        return ""
    return str(record.get("VmId") or f"host:{record.get('HostName')}")

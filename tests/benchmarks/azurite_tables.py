"""What Azurite's table service costs per request as a table grows (issue 15).

`python -m tests.benchmarks.azurite_tables` fills one partition (`vm`) of a table in Azurite,
the emulator the load generator's `--state tables` runs, with 1,000, then 10,000, then 100,000
entities of a VM document's size, and times, against a small partition beside it (`ledger`,
100 entities, as the approval ledger's shards and locks), what the consumer asks of the fleet
state for each decision: a point read, a query of the partition, a query of the partition
for what changed since a Timestamp (the change feed), and a conditional write. Table Storage
serves a partition's requests from that partition; if the emulator's times grow with the
entities elsewhere in the table, what a load run on Azurite shows at 100,000 VMs is the
emulator's limit, not the consumer's. Prints a table; takes a few minutes.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from azure.core import MatchConditions
from azure.data.tables import TableClient, TableEntity, UpdateMode

from tests.support.azurite import Azurite

SIZES = (1_000, 10_000, 100_000)
LEDGER = 100
REPEATS = 30
BODY = "x" * 400  # about a VM document's JSON


def timed(action: Callable[[], object]) -> float:
    """Median milliseconds of REPEATS calls."""
    times = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        action()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def fill(table: TableClient, start: int, stop: int) -> None:
    for first in range(start, stop, 100):
        table.submit_transaction(
            [
                ("upsert", {"PartitionKey": "vm", "RowKey": f"{n:08d}", "Body0": BODY})
                for n in range(first, min(stop, first + 100))
            ]
        )


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory(prefix="azurite-tables-") as tmp:
        azurite = Azurite(Path(tmp)).start()
        try:
            table = TableClient.from_connection_string(azurite.connection_string, "scaling")
            table.create_table()
            for n in range(LEDGER):
                table.create_entity({"PartitionKey": "ledger", "RowKey": f"{n:03d}", "Body0": BODY})
            filled = 0
            for size in SIZES:
                fill(table, filled, size)
                filled = size
                since = datetime.now(timezone.utc) - timedelta(seconds=10)
                held = [table.get_entity("ledger", "050")]
                rows.append((size, measure(table, since, held)))
                print(f"{size:,} entities in the other partition: done", file=sys.stderr)
        finally:
            azurite.stop()
    names = list(rows[0][1])
    print("| Entities in partition `vm` | " + " | ".join(f"{n} (ms)" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for size, found in rows:
        print(f"| {size:,} | " + " | ".join(f"{found[n]:.1f}" for n in names) + " |")
    return 0


def measure(table: TableClient, since: datetime, held: list[TableEntity]) -> dict[str, float]:
    """Median milliseconds of each request the consumer makes per decision."""

    def write() -> None:
        # A conditional replace, as every fleet state write is; the new ETag read back.
        table.update_entity(
            held[0],
            mode=UpdateMode.REPLACE,
            etag=held[0].metadata["etag"],
            match_condition=MatchConditions.IfNotModified,
        )
        held[0] = table.get_entity("ledger", "050")

    return {
        "point read": timed(lambda: table.get_entity("ledger", "007")),
        "partition query (100)": timed(lambda: list(table.query_entities(
            "PartitionKey eq @pk", parameters={"pk": "ledger"}))),
        "changes since (Timestamp)": timed(lambda: list(table.query_entities(
            "PartitionKey eq @pk and Timestamp ge @t", parameters={"pk": "ledger", "t": since}))),
        "conditional write + read": timed(write),
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

"""The kinds of fleet state a `consumer.state` SPEC may name: the one module of
bridge.consumer.state that reads the configuration. A new store is a module with its Store and
one line in KINDS.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.config import Config
from bridge.consumer.state import Store, layout
from bridge.consumer.state.sqlite import SqliteStore
from bridge.specs import Kind, Kinds

if TYPE_CHECKING:
    from bridge.consumer.state.tables import TableStore


def table_store(
    config: Config, table_name: str | None = None, *, spread: Mapping[str, int] | None = None
) -> TableStore:
    """The fleet state in Table Storage: the table `table_name` (consumer.table_name unless
    given) of the storage account; ValueError naming a setting that makes it unusable."""
    # Loaded on first use: the tables module brings azure-core and the Tables SDK.
    from bridge.consumer.state.tables import TableStore  # noqa: PLC0415

    name = table_name or config.consumer.table_name
    return TableStore(config.storage, config.identity, name, spread=spread)


def _sqlite(path: str, config: Config) -> Store:
    return SqliteStore(Path(path).expanduser())


def _tables(argument: str, config: Config) -> Store:
    # The consumer's busiest collections, spread over partitions.
    return table_store(config, spread=layout.PARTITIONS)


KINDS: Kinds[Store] = Kinds(
    "fleet state",
    Kind("sqlite", "/var/lib/se-bridge/fleet.db", _sqlite),
    Kind("tables", None, _tables),
)

"""`tables`: the fleet state in Azure Table Storage, shared by every consumer instance.

One table (`consumer.table_name`): PartitionKey = collection, RowKey = key, each with the
characters Table Storage forbids in keys (/ \\ # ? and control characters) and `%` itself
percent-encoded. A collection given a `spread` of N is kept in N partitions instead,
`collection-00` to `collection-NN`, a document in the one its key hashes to: a partition
serves about 2,000 entities a second, and where every VM of a placement group reports each
event, one `event` partition would take ten times that in a Spot eviction storm (issue 15).
A collection written in entity-group transactions (`write_all`) must stay in one. Documents
that a release before the spread left in the collection's one partition are moved at first
use (and looked for again at every `scan`: consumers of one table must run one layout).
The value is JSON text cut into string properties `Body0`, `Body1`, ...
(a string property holds at most 64 KiB of UTF-16) with their count in `Chunks`. Writes
are conditional on the entity's ETag, so concurrent consumers meet as a 412 (Conflict),
never as a lost update. The table is created at first use.

Table Storage keeps no revision counter, but sets every entity's `Timestamp` when it writes
it: `scan_changes` asks for the entities of a partition whose Timestamp is at or after the
moment the previous look began, as the service's `Date` header said at its first page, less
CHANGE_OVERLAP (clocks that differ between the service's servers; documents already held come
back and are left out by their ETag). Not the newest Timestamp seen: a query of several pages
is no snapshot, and a document written after its page was read may be older than one written
on a later page. The mark is only ever the service's time, never this machine's. Without
it a consumer read every VM document again to see what other consumers wrote: at 100,000 VMs,
100,000 entities per look, past the partition's 2,000 entities/s target (issue 15's load
generator: a consumer spent 79% of its time in those scans, and Azurite a whole core).

bridge.consumer.state.kinds imports this module only when `tables` is configured;
azure-data-tables loads at first use.

An entity as stored:
    PartitionKey: "events"   RowKey: "vm%2F1"   Chunks: 1   Body0: '{"Status":"Scheduled"}'
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError

from bridge.cloud import storage, storageerrors
from bridge.cloud.identity import Identity
from bridge.cloud.storage import StorageAccount
from bridge.consumer.state import (
    TRANSACTION_DOCS,
    Conflict,
    Doc,
    bucket,
    decode_value,
    encode_value,
)
from bridge.retry import (
    DeliveryError,
    PermanentError,
    RetryableError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

if TYPE_CHECKING:
    from azure.core.pipeline import PipelineResponse
    from azure.data.tables import TableClient, TableEntity

# An entity-group transaction holds at most 100 operations and 4 MiB; a query's filter at
# most 15 comparisons (one is the PartitionKey).
TRANSACTION_CHARS = 1_500_000  # of ASCII JSON: 3 MB as UTF-16, under the 4 MiB limit
FILTER_KEYS = 14
CHUNK_CHARS = 30_000  # ASCII JSON: 60 000 bytes of UTF-16, under the 64 KiB property limit
# How far before the previous look began a look for changes starts again (see above).
CHANGE_OVERLAP = timedelta(seconds=10)
MAX_SPREAD = 100  # partitions a collection may be spread over: two digits in its names
PARALLEL = 8  # requests to different partitions of one read_many or write_many at a time
_TABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]{2,62}")
_FORBIDDEN = re.compile(r"[%/\\#?\x00-\x1f\x7f-\x9f]")


def escape_key(text: str) -> str:
    """`text` with every character Table Storage refuses in a key (and `%`) percent-encoded."""
    return _FORBIDDEN.sub(lambda m: "".join(f"%{b:02X}" for b in m[0].encode()), text)


def unescape_key(text: str) -> str:
    return unquote(text, errors="strict")


def collection_of(partition: str) -> str:
    """The collection a stored PartitionKey belongs to (`vm-07` is one of `vm`'s partitions)."""
    return re.sub(r"-[0-9]{2}$", "", unescape_key(partition))


class TableStore:
    """Documents in one table; the SDK client is created, and the table made, at first use."""

    # Each look for changes is a query over HTTP that returns, besides the new documents,
    # those of the last CHANGE_OVERLAP: a reader that can do with an older view looks at
    # most this often (bridge.consumer.views.FleetCache).
    feed_interval = 15.0

    def __init__(
        self,
        account: StorageAccount,
        identity: Identity,
        table_name: str,
        *,
        spread: Mapping[str, int] | None = None,
    ) -> None:
        self._storage = account
        self._identity = identity
        self.table_name = table_name
        if not _TABLE_NAME.fullmatch(self.table_name):
            raise ValueError(
                f"table name {self.table_name!r} (consumer.table_name) must be 3 to 63 letters "
                "and digits, starting with a letter"
            )
        if not (self._storage.connection_string or self._storage.account):
            raise ValueError(
                "fleet state `tables` needs storage.account or storage.connection_string"
            )
        self.spread = dict(spread or {})
        for collection, count in self.spread.items():
            if not 1 <= count <= MAX_SPREAD:
                raise ValueError(f"{collection}: {count} partitions (1 to {MAX_SPREAD})")
        self._lock = threading.Lock()
        self._client: TableClient | None = None
        self._ready = False
        self._pool: ThreadPoolExecutor | None = None
        self._settling = threading.Lock()
        self._settled: set[str] = set()  # spread collections whose old partition was emptied

    def read(self, collection: str, key: str) -> Doc | None:
        table = self._table(collection)
        try:
            entity = table.get_entity(self._partition(collection, key), escape_key(key))
        except AzureError as err:  # only the service's answers: anything else is a bug
            if storageerrors.status_of(err) == 404 and not _table_missing(err):
                return None
            raise self._classify(err) from err
        return self._doc(collection, entity)

    def write(self, collection: str, doc: Doc) -> Doc:
        text = encode_value(collection, doc)
        table = self._table(collection)
        entity = _entity(self._partition(collection, doc.key), doc.key, text)
        try:
            if doc.etag is None:
                meta = table.create_entity(entity)
            else:
                meta = _replace(table, entity, doc.etag)
        except AzureError as err:
            # 409: created by somebody else; 412: changed since read; 404: deleted since read.
            raise self._conflict_or_classify(err, collection, doc.key, (409, 412, 404)) from err
        return Doc(doc.key, doc.value, str(meta["etag"]))

    def read_many(self, collection: str, keys: Sequence[str]) -> dict[str, Doc]:
        table = self._table(collection)
        by_partition: dict[str, list[str]] = {}
        for key in sorted(set(keys)):
            by_partition.setdefault(self._partition(collection, key), []).append(key)
        queries = [
            (partition, unique[start : start + FILTER_KEYS])
            for partition, unique in sorted(by_partition.items())
            for start in range(0, len(unique), FILTER_KEYS)
        ]

        def query(partition: str, chunk: list[str]) -> list[TableEntity]:
            params = {f"k{i}": escape_key(key) for i, key in enumerate(chunk)}
            rows = " or ".join(f"RowKey eq @{name}" for name in params)
            try:
                return list(
                    table.query_entities(
                        f"PartitionKey eq @pk and ( {rows} )",  # the SDK splits on spaces
                        parameters={"pk": partition, **params},
                    )
                )
            except AzureError as err:
                raise self._classify(err) from err

        found: dict[str, Doc] = {}
        for entities in self._each(query, queries):
            found.update((d.key, d) for d in (self._doc(collection, e) for e in entities))
        return found

    def write_many(self, collection: str, docs: Sequence[Doc]) -> tuple[list[Doc], list[str]]:
        """Entity-group transactions (one partition each), all or none each."""

        def transact(group: list[tuple[Doc, str]]) -> tuple[list[Doc], list[str]]:
            try:
                return self._transact(collection, group), []
            except Conflict:
                return [], [doc.key for doc, _ in group]

        stored: list[Doc] = []
        conflicted: list[str] = []
        for done, failed in self._each(transact, [(g,) for g in self._groups(collection, docs)]):
            stored += done
            conflicted += failed
        return stored, conflicted

    def _each(self, call: Callable[..., T], calls: Sequence[tuple[Any, ...]]) -> list[T]:
        """`call` for each argument tuple of `calls`, in order. Requests to several partitions
        (a batch's documents of a spread collection fall on many) go up to PARALLEL at a time: one
        after another they cost a round trip each, 16 for a batch of heartbeats. The SDK's
        clients are safe to share between threads (the Azure SDK design guidelines)."""
        if len(calls) < 2:
            return [call(*args) for args in calls]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="se-bridge tables")
            pool = self._pool
        return list(pool.map(lambda args: call(*args), calls))

    def write_all(self, collection: str, docs: Sequence[Doc]) -> list[Doc]:
        """One entity-group transaction: the service writes all or none."""
        groups = self._groups(collection, docs)
        if len(groups) > 1:
            raise ValueError(
                f"{len(docs)} documents of {collection} do not fit one transaction "
                f"(one partition, {TRANSACTION_DOCS} entities, {TRANSACTION_CHARS} characters)"
            )
        return self._transact(collection, groups[0]) if groups else []

    def _groups(self, collection: str, docs: Sequence[Doc]) -> list[list[tuple[Doc, str]]]:
        """`docs` with their JSON text, in runs that fit one entity-group transaction each
        (one partition; in the order given within each)."""
        by_partition: dict[str, list[Doc]] = {}
        for doc in docs:
            by_partition.setdefault(self._partition(collection, doc.key), []).append(doc)
        return [run for mine in by_partition.values() for run in _runs(collection, mine)]

    def _transact(self, collection: str, group: list[tuple[Doc, str]]) -> list[Doc]:
        from azure.data.tables import UpdateMode  # noqa: PLC0415

        operations: list[Any] = []
        for doc, text in group:
            entity = _entity(self._partition(collection, doc.key), doc.key, text)
            if doc.etag is None:
                operations.append(("create", entity))
            else:
                conditions = {"etag": doc.etag, "match_condition": MatchConditions.IfNotModified}
                operations.append(("update", entity, {"mode": UpdateMode.REPLACE, **conditions}))
        try:
            answers = self._table(collection).submit_transaction(operations)
        except AzureError as err:
            # 409: created by somebody else; 412: changed since read; 404: deleted since read.
            failed = group[min(int(getattr(err, "index", 0) or 0), len(group) - 1)][0].key
            raise self._conflict_or_classify(err, collection, failed, (409, 412, 404)) from err
        return [
            Doc(doc.key, doc.value, str(meta["etag"]))
            for (doc, _), meta in zip(group, answers, strict=True)
        ]

    def delete(self, collection: str, doc: Doc) -> None:
        if doc.etag is None:
            if self.read(collection, doc.key) is not None:
                raise Conflict(f"{collection}/{doc.key} was created since it was read")
            return
        table = self._table(collection)
        pk, rk = self._partition(collection, doc.key), escape_key(doc.key)
        try:  # the SDK treats 404 (already gone) as success
            table.delete_entity(
                pk, rk, etag=doc.etag, match_condition=MatchConditions.IfNotModified
            )
        except AzureError as err:
            raise self._conflict_or_classify(err, collection, doc.key, (412,)) from err

    def scan(self, collection: str) -> list[Doc]:
        table = self._table(collection)
        self._settle(collection, again=True)
        query, params = self._every_partition(collection)
        try:
            entities = list(table.query_entities(query, parameters=params))
        except AzureError as err:
            raise self._classify(err) from err
        # Sorted here: escaping changes the service's order (`%` sorts before most characters).
        return sorted((self._doc(collection, e) for e in entities), key=lambda d: d.key)

    def scan_changes(
        self, collection: str, since: int | None, known: Mapping[str, Doc] | None = None
    ) -> tuple[list[Doc], int]:
        """See ChangeFeed. Marks are Timestamps the service wrote, in microseconds since
        1970; documents written a little before the mark come again (held ones left out)."""
        table = self._table(collection)
        query, every = self._every_partition(collection)
        params: dict[str, str | datetime] = {**every}
        if since is not None:
            start = datetime.fromtimestamp(since / 1e6, timezone.utc) - CHANGE_OVERLAP
            query, params = query + " and Timestamp ge @since", {**params, "since": start}
        began: list[datetime] = []  # the service's time at the first page

        def first_date(response: PipelineResponse[Any, Any]) -> None:
            date = response.http_response.headers.get("Date")
            if not began and date:
                began.append(parsedate_to_datetime(date))

        try:
            entities = list(
                table.query_entities(query, parameters=params, raw_response_hook=first_date)
            )
        except AzureError as err:
            raise self._classify(err) from err
        # Never back: a server whose clock is behind the last one's starts the next look where
        # this one started (a superset); without a Date (the service always sends one), too.
        mark = max(round(began[0].timestamp() * 1e6) if began else 0, since or 0)
        held = known or {}
        fresh = []
        for entity in entities:
            key = unescape_key(str(entity["RowKey"]))
            had = held.get(key)
            # A version the caller holds is not decoded again.
            if had is None or had.etag != str(entity.metadata["etag"]):
                fresh.append(self._doc(collection, entity))
        return sorted(fresh, key=lambda d: d.key), mark

    def check(self) -> str:
        """A harmless real round trip: make sure the table exists and can be read."""
        self.scan("check")
        return f"Table Storage serves {self._target()}"

    def defer_sync(self, collections: Iterable[str]) -> None:
        """Nothing to defer: a write the service acknowledged is durable."""

    def flush(self) -> None:
        """Nothing to flush (see `defer_sync`)."""

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            if self._client is not None:
                self._client.close()
                self._client = None

    def _table(self, collection: str | None = None) -> TableClient:
        """The client, the table made; `collection`'s documents where this release keeps
        them (see `_settle`)."""
        with self._lock:
            if self._client is None:
                self._client = self._open()
            if not self._ready:
                self._create_table(self._client)
                self._ready = True
            client = self._client
        if collection is not None and collection in self.spread and collection not in self._settled:
            self._settle(collection)
        return client

    def _partition(self, collection: str, key: str) -> str:
        """The PartitionKey of document `key` of `collection`."""
        count = self.spread.get(collection)
        if count is None:
            return escape_key(collection)
        return f"{escape_key(collection)}-{bucket(key, count):02d}"

    def _every_partition(self, collection: str) -> tuple[str, dict[str, str]]:
        """A filter for every partition of `collection`, and its parameters."""
        if collection not in self.spread:
            return "PartitionKey eq @pk", {"pk": escape_key(collection)}
        # `-` then two digits: every one of them sorts after "c-" and before "c.".
        first = escape_key(collection)
        return "PartitionKey ge @first and PartitionKey lt @after", {
            "first": f"{first}-",
            "after": f"{first}.",
        }

    def _settle(self, collection: str, *, again: bool = False) -> None:
        """Move the documents a release before the spread kept in `collection`'s one
        partition into their partitions (once a process; `again`: look once more).

        Where a document is in both, the version the service wrote last stays. Each move
        is conditional on the ETags read: a document changed meanwhile is left for the
        next look.
        """
        if collection not in self.spread:
            return
        with self._settling:
            if collection in self._settled and not again:
                return
            table = self._table()
            old = escape_key(collection)
            try:
                entities = list(table.query_entities("PartitionKey eq @pk", parameters={"pk": old}))
                moved = sum(self._move(table, collection, entity) for entity in entities)
            except AzureError as err:
                raise self._classify(err) from err
            if entities and collection in self._settled:
                log.warning(
                    "%d documents of %s appeared in its old partition of %s since this process "
                    "moved them: a consumer of a release before the spread writes there; stop "
                    "it (every consumer of one table must run one layout). Moved %d.",
                    len(entities),
                    collection,
                    self._target(),
                    moved,
                )
            elif entities:
                log.info(
                    "moved %d of %d documents of %s in %s into %d partitions",
                    moved,
                    len(entities),
                    collection,
                    self._target(),
                    self.spread[collection],
                )
            self._settled.add(collection)

    def _move(self, table: TableClient, collection: str, entity: TableEntity) -> bool:
        """One document from the old partition into its own; False if left (changed)."""
        from azure.data.tables import UpdateMode  # noqa: PLC0415

        key = unescape_key(str(entity["RowKey"]))
        body = {k: v for k, v in entity.items() if k == "Chunks" or k.startswith("Body")}
        moved = {"PartitionKey": self._partition(collection, key), "RowKey": entity["RowKey"]}
        try:
            table.create_entity({**moved, **body})
        except ResourceExistsError:
            there = table.get_entity(moved["PartitionKey"], moved["RowKey"])
            if _written(there) < _written(entity):
                try:
                    table.update_entity(
                        {**moved, **body},
                        mode=UpdateMode.REPLACE,
                        etag=there.metadata["etag"],
                        match_condition=MatchConditions.IfNotModified,
                    )
                except AzureError as err:
                    if storageerrors.status_of(err) in (404, 412):
                        return False
                    raise
        try:
            table.delete_entity(
                entity["PartitionKey"],
                entity["RowKey"],
                etag=entity.metadata["etag"],
                match_condition=MatchConditions.IfNotModified,
            )
        except AzureError as err:
            if storageerrors.status_of(err) == 412:
                return False
            raise
        return True

    def _create_table(self, client: TableClient) -> None:
        try:
            client.create_table()
        except ResourceExistsError:
            pass
        except AzureError as err:
            if (
                storageerrors.status_of(err) == 409
            ):  # TableBeingDeleted: the service frees the name in ~40 s
                raise RetryableError(
                    f"409 from {self._target()}: being deleted, it can be made again soon"
                ) from err
            raise self._classify(err) from err

    def _open(self) -> TableClient:
        from azure.data.tables import TableClient  # noqa: PLC0415

        # Retries are the caller's: an SDK retry of a write whose answer was lost would
        # report the caller's own success as a Conflict.
        options: dict[str, Any] = {"retry_total": 0, "connection_timeout": 10, "read_timeout": 30}
        name = self.table_name
        try:
            return storage.connect(
                self._storage,
                self._identity,
                "table",
                "fleet state `tables`",
                by_string=lambda text: TableClient.from_connection_string(text, name, **options),
                by_identity=lambda url, token: TableClient(url, name, credential=token, **options),
            )
        except ValueError as err:  # found at first use: a person must fix the setting
            raise PermanentError(str(err)) from None

    def _doc(self, collection: str, entity: TableEntity) -> Doc:
        key = unescape_key(str(entity["RowKey"]))
        try:
            text = "".join(entity[f"Body{i}"] for i in range(int(entity["Chunks"])))
        except (KeyError, TypeError, ValueError):
            raise PermanentError(
                f"{collection}/{key} in {self._target()} was not written by se-bridge; "
                "give the fleet state a table of its own (consumer.table_name)"
            ) from None
        return Doc(key, decode_value(text), str(entity.metadata["etag"]))

    def _conflict_or_classify(
        self, err: BaseException, collection: str, key: str, statuses: tuple[int, ...]
    ) -> Exception:
        status = storageerrors.status_of(err)
        if status in statuses and not _table_missing(err):
            return Conflict(f"{collection}/{key} changed since it was read ({status})")
        return self._classify(err)

    def _classify(self, err: BaseException) -> DeliveryError:
        if _table_missing(err):
            self._ready = False  # deleted under us: made again at the next attempt
            return RetryableError(f"{self._target()} does not exist; it is created again next time")
        return storageerrors.classify(
            err,
            target=self._target(),
            auth_advice=self._auth_advice(),
            not_found="account or endpoint not found; check storage.account and "
            "storage.endpoint_suffix, or the connection string's TableEndpoint",
        )

    def _auth_advice(self) -> str:
        scope = f"the storage account {self._storage.account}"
        return storage.refused(
            self._storage, self._identity, "Storage Table Data Contributor", scope
        )

    def _target(self) -> str:
        # The account name is no secret; the connection string around it may be.
        account = self._storage.account or getattr(self._client, "account_name", None)
        return f"table {self.table_name} in account {account or '(from the connection string)'}"


def _entity(partition: str, key: str, text: str) -> dict[str, Any]:
    chunks = [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)]
    entity: dict[str, Any] = {
        "PartitionKey": partition,
        "RowKey": escape_key(key),
        "Chunks": len(chunks),
    }
    entity.update({f"Body{i}": chunk for i, chunk in enumerate(chunks)})
    return entity


def _runs(collection: str, docs: Sequence[Doc]) -> list[list[tuple[Doc, str]]]:
    """`docs` (of one partition) with their JSON text, in runs that fit one entity-group
    transaction each."""
    groups: list[list[tuple[Doc, str]]] = []
    size = 0
    for doc in docs:
        text = encode_value(collection, doc)
        if (
            not groups
            or len(groups[-1]) == TRANSACTION_DOCS
            or size + len(text) > TRANSACTION_CHARS
        ):
            groups.append([])
            size = 0
        groups[-1].append((doc, text))
        size += len(text)
    return groups


def _replace(table: TableClient, entity: dict[str, Any], etag: str) -> dict[str, Any]:
    from azure.data.tables import UpdateMode  # noqa: PLC0415

    return table.update_entity(
        entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified
    )


def _written(entity: TableEntity) -> datetime:
    """When the service last wrote `entity` (its Timestamp)."""
    return entity.metadata.get("timestamp") or datetime.min.replace(tzinfo=timezone.utc)


def _table_missing(err: BaseException) -> bool:
    # get/update decode the service's error code; create_entity leaves it in the body.
    return storageerrors.status_of(err) == 404 and "TableNotFound" in str(err)

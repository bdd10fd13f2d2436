"""The counting proxy the quota benchmark reads (tests/benchmarks/countingproxy.py), in front
of Azurite's table service and used by the real SDK: requests and entities are counted per
partition as the quota model needs them."""

from __future__ import annotations

from azure.data.tables import TableClient

from tests.benchmarks.countingproxy import CountingProxy
from tests.support.azurite import ACCOUNT, KEY, Azurite
from tests.support.state import unique_table


def test_requests_and_entities_are_counted_per_partition(azurite: Azurite) -> None:
    with CountingProxy(azurite.endpoints["table"]) as proxy:
        table = TableClient.from_connection_string(
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"TableEndpoint={proxy.url}/{ACCOUNT};",
            unique_table(),
        )
        with table:
            table.create_table()
            table.submit_transaction(
                [("create", {"PartitionKey": "vm", "RowKey": f"r{i}", "N": i}) for i in range(3)]
            )
            table.create_entity({"PartitionKey": "ledger", "RowKey": "a", "N": 1})
            assert table.get_entity("vm", "r1")["N"] == 1
            found = list(table.query_entities("PartitionKey eq @pk", parameters={"pk": "vm"}))
            assert len(found) == 3
            table.delete_entity("vm", "r0")
            # A spread collection's partitions, queried together: counted as the collection.
            table.create_entity({"PartitionKey": "event-07", "RowKey": "e", "N": 1})
            spread = table.query_entities(
                "PartitionKey ge @first and PartitionKey lt @after",
                parameters={"first": "event-", "after": "event."},
            )
            assert len(list(spread)) == 1
    # The table made counts no entity; the batch three; the query what it returned.
    assert proxy.partitions == {"": 1, "vm": 4, "ledger": 1, "event-07": 1, "event": 1}
    assert proxy.entities == {"vm": 3 + 1 + 3 + 1, "ledger": 1, "event-07": 1, "event": 1}

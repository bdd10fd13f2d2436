"""Records as a Log Analytics export holds them: the rows of SeBridgeRecords_CL that
`az monitor log-analytics query -o json` prints for a query keeping `columns`.

Every record is a row with every column of the table (the schema's; a column of another
RecordType empty), and az prints each value as Python's `str` of what the query API gave
(azure-cli's transform_log_analytics_query_output): text stays text, dynamic columns come as
their JSON text, a null as "None", true as "True"; Kusto has no null string, so an empty one is
"". It adds TableName, and the table adds its standard columns TenantId and Type. A row:

    {"TableName": "PrimaryResult", "TenantId": "...", "SchemaVersion": "1",
     "TimeGenerated": "2022-04-11T22:10:00.0000000Z", "Resources": "[\\"WestNO_0\\"]",
     "PlatformFaultDomain": "None", "AffectsThisVm": "True", "HookOutput": "", ...}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from bridge import schema
from bridge.records import parse_time

TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"


def az_rows(records: Iterable[dict[str, Any]], columns: Sequence[str]) -> list[dict[str, str]]:
    kinds = dict(schema.columns())
    standard = {"TenantId": TENANT, "Type": "SeBridgeRecords_CL"}
    rows = []
    for record in records:
        row = {"TableName": "PrimaryResult"}
        for name in columns:
            if name in standard:
                row[name] = standard[name]
            else:
                row[name] = _as_az(record.get(name), kinds[name])
        rows.append(row)
    return rows


def _as_az(value: Any, kind: str) -> str:
    if kind == "string":
        return "" if value is None else str(value)
    if value is None:
        return "None"
    if kind == "datetime":
        moment = parse_time(value)
        assert moment is not None, value
        # The query API's datetime: seven digits of the second's fraction, and a Z.
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}0Z"
    if kind == "dynamic":
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def every_column() -> list[str]:
    """What `SeBridgeRecords_CL` returns without a `project`: the standard columns too."""
    return ["TenantId", *(name for name, _ in schema.columns()), "Type"]

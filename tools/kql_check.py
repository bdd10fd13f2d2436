"""Checks every KQL text in infra/ with Microsoft's Kusto parser (tools/kql/check.js).

The texts: infra/kql/**/*.kql, every KqlItem query of the workbooks in infra/workbook/, and
any KQL written inline in a .bicep file (`query:` or `transformKql:` values that are not
loaded from a file). Queries run against `SeBridgeRecords_CL` with the record schema's
columns; the DCR transformation runs against `source` with the stream declaration's columns,
and may only use what Azure Monitor transformations support (DCR_ALLOWED below).

    python -m tools.kql_check          # prints every problem, exits 1 if there is one
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bridge import schema
from tools.kql import bicep as kql_bicep

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT / "tools" / "kql" / "check.js"
TABLE = "SeBridgeRecords_CL"
DCR_TRANSFORM = "infra/kql/dcr-transform.kql"
Schema = Literal["workspace", "dcr", "resourcegraph"]

# The Resource Graph tables the consumer queries (the reconciler, patch runs, the week ahead),
# each with the columns every Resource Graph table has ("Understand the Azure Resource Graph
# query language", learn.microsoft.com/azure/governance/resource-graph/concepts/query-language:
# a row is a resource as ARM returns it, plus its subscription and resource group).
RESOURCE_GRAPH_COLUMNS = {
    "id": "string", "name": "string", "type": "string", "tenantId": "string", "kind": "string",
    "location": "string", "resourceGroup": "string", "subscriptionId": "string",
    "managedBy": "string", "sku": "dynamic", "plan": "dynamic", "properties": "dynamic",
    "tags": "dynamic", "identity": "dynamic", "zones": "dynamic", "extendedLocation": "dynamic",
}  # fmt: skip
RESOURCE_GRAPH_TABLES = (
    "resources", "computeresources", "maintenanceresources", "healthresources",
    "servicehealthresources", "containerserviceeventresources",
)  # fmt: skip

# "Supported KQL features in Azure Monitor transformations" (learn.microsoft.com,
# azure-monitor/data-collection/data-collection-transformations-kql): only what it lists works
# in a DCR's transformKql. Logical and/or are not listed but its own examples filter with them.
DCR_ALLOWED_OPERATORS = frozenset(
    {"extend", "project", "print", "where", "parse", "project-away", "project-rename", "datatable"}
)
DCR_ALLOWED_SCALAR_OPERATORS = frozenset(
    {"+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "=~", "!~", "and", "or"}
    | {"contains", "!contains", "contains_cs", "!contains_cs", "has", "!has", "has_cs"}
    | {"!has_cs", "startswith", "!startswith", "startswith_cs", "!startswith_cs", "endswith"}
    | {"!endswith", "endswith_cs", "!endswith_cs", "matches regex", "in", "!in"}
)
DCR_ALLOWED_FUNCTIONS = frozenset(
    {"binary_and", "binary_or", "binary_not", "binary_shift_left", "binary_shift_right"}
    | {"binary_xor", "tobool", "todatetime", "todouble", "toreal", "toguid", "toint", "tolong"}
    | {"tostring", "totimespan", "ago", "datetime_add", "datetime_diff", "datetime_part"}
    | {"dayofmonth", "dayofweek", "dayofyear", "endofday", "endofmonth", "endofweek"}
    | {"endofyear", "getmonth", "monthofyear", "getyear", "hourofday", "make_datetime"}
    | {"make_timespan", "now", "startofday", "startofmonth", "startofweek", "startofyear"}
    | {"weekofyear", "array_concat", "array_length", "pack", "pack_array", "parse_json"}
    | {"parse_xml", "zip", "abs", "bin", "floor", "ceiling", "exp", "exp10", "exp2"}
    | {"isfinite", "isinf", "isnan", "log", "log10", "log2", "pow", "round", "sign", "case"}
    | {"iif", "max_of", "min_of", "base64_encodestring", "base64_decodestring", "countof"}
    | {"extract", "extract_all", "indexof", "isempty", "isnotempty", "replace", "split"}
    | {"strcat", "strcat_delim", "strlen", "substring", "tolower", "toupper", "hash_sha256"}
    | {"gettype", "isnotnull", "isnull", "columnifexists", "parse_cef_dictionary"}
    | {"geo_location"}
)
DCR_ALLOWED_SOURCES = frozenset({"source"})


@dataclass(frozen=True)
class KqlText:
    name: str  # where it comes from, for messages: a path, with #item for workbook items
    text: str
    schema: Schema = "workspace"


@dataclass(frozen=True)
class Diagnostic:
    severity: str
    code: str
    message: str
    line: int
    column: int


@dataclass(frozen=True)
class Result:
    name: str
    diagnostics: list[Diagnostic]
    columns: list[str] = field(default_factory=list)  # the result's "name:type"
    operators: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    scalar_operators: list[str] = field(default_factory=list)
    let_names: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "Error"]


def schemas() -> dict[Schema, dict[str, dict[str, str]]]:
    """The tables each kind of KQL text sees, from the one record schema."""
    stream = schema.dcr_stream_declaration()["columns"]
    return {
        "workspace": {TABLE: dict(schema.columns())},
        "dcr": {"source": {c["name"]: c["type"] for c in stream}},
        "resourcegraph": {t: dict(RESOURCE_GRAPH_COLUMNS) for t in RESOURCE_GRAPH_TABLES},
    }


def collect(root: Path = ROOT) -> list[KqlText]:
    """Every KQL text under root/infra, in a stable order."""
    infra = root / "infra"
    texts = [_kql_file(path, root) for path in sorted(infra.glob("kql/**/*.kql"))]
    for path in sorted(infra.glob("workbook/*.json")):
        texts.extend(workbook_queries(path, root))
    for path in sorted(infra.glob("**/*.bicep")):
        texts.extend(KqlText(name, text) for name, text in kql_bicep.inline_kql(path, root))
    return texts


def _kql_file(path: Path, root: Path) -> KqlText:
    name = path.relative_to(root).as_posix()
    return KqlText(
        name, path.read_text(encoding="utf-8"), "dcr" if name == DCR_TRANSFORM else "workspace"
    )


def workbook_queries(path: Path, root: Path) -> list[KqlText]:
    """Every KqlItem query of a workbook's serializedData, nested groups included."""
    content = json.loads(path.read_text(encoding="utf-8"))
    name = path.relative_to(root).as_posix()
    return [
        KqlText(f"{name}#{item_name}", query) for item_name, query in _kql_items(content["items"])
    ]


def _kql_items(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for item in items:
        content = item.get("content", {})
        if str(content.get("version", "")).startswith("KqlItem/"):
            found.append((item.get("name", "?"), content["query"]))
        found.extend(_kql_items(content.get("items", [])))
    return found


def run(texts: list[KqlText]) -> list[Result]:
    """Analyse every text in one Node process (loading the parser takes seconds)."""
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not on PATH: install Node.js 18 or later to check KQL")
    request = {
        "schemas": schemas(),
        "queries": [{"name": t.name, "schema": t.schema, "text": t.text} for t in texts],
    }
    proc = subprocess.run(
        [node, str(CHECKER)], input=json.dumps(request), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"tools/kql/check.js failed ({proc.returncode}): {proc.stderr.strip()}")
    return [_result(raw) for raw in json.loads(proc.stdout)]


def _result(raw: dict[str, Any]) -> Result:
    return Result(
        name=raw["name"],
        diagnostics=[Diagnostic(**d) for d in raw["diagnostics"]],
        columns=raw["columns"],
        operators=raw["operators"],
        functions=raw["functions"],
        scalar_operators=raw["scalarOperators"],
        let_names=raw["letNames"],
        sources=raw["sources"],
    )


def dcr_violations(result: Result) -> list[str]:
    """What a transformation uses that Azure Monitor transformations do not support."""
    own = set(result.let_names)
    problems = [f"operator {op!r}" for op in result.operators if op not in DCR_ALLOWED_OPERATORS]
    problems += [
        f"function {fn!r}" for fn in result.functions if fn not in DCR_ALLOWED_FUNCTIONS | own
    ]
    problems += [
        f"scalar operator {op!r}"
        for op in result.scalar_operators
        if op not in DCR_ALLOWED_SCALAR_OPERATORS
    ]
    problems += [f"data source {s!r}" for s in result.sources if s not in DCR_ALLOWED_SOURCES]
    return problems


def problems(texts: list[KqlText], results: list[Result]) -> list[str]:
    """Every problem as a line a person can act on: file, line, column, what is wrong."""
    out = [f"{r.name}:{d.line}:{d.column}: {d.code} {d.message}" for r in results for d in r.errors]
    for text, result in zip(texts, results, strict=True):
        if text.schema == "dcr":
            out += [
                f"{result.name}: {v} is not supported in a DCR transformation"
                for v in dcr_violations(result)
            ]
    return out


def main() -> int:
    texts = collect()
    found = problems(texts, run(texts))
    for line in found:
        print(line)
    print(f"{len(texts)} KQL texts checked, {len(found)} problems", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

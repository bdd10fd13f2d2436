"""The Log Analytics table, the DCR stream declaration and the record schema agree."""

from __future__ import annotations

import json
from typing import Any

from bridge import schema
from tests.support import bicep
from tools import gen_infra

GENERATED = bicep.INFRA / "generated" / "schema.json"
WORKSPACE = bicep.INFRA / "modules" / "workspace.bicep"
INGESTION = bicep.INFRA / "modules" / "ingestion.bicep"


def _generated() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(GENERATED.read_text(encoding="utf-8"))
    return loaded


def test_generated_file_is_up_to_date() -> None:
    assert GENERATED.read_text(encoding="utf-8") == gen_infra.render(), (
        f"{GENERATED} is out of date with bridge/record.schema.json: run `{gen_infra.REGENERATE}`"
    )


def test_check_mode_reports_a_stale_file(tmp_path: Any, monkeypatch: Any) -> None:
    stale = tmp_path / "schema.json"
    stale.write_text("{}\n", encoding="utf-8")
    monkeypatch.setattr(gen_infra, "OUTPUT", stale)
    assert gen_infra.main(["--check"]) == 1
    assert gen_infra.main([]) == 0
    assert gen_infra.main(["--check"]) == 0


def test_table_columns_stream_declaration_and_schema_agree() -> None:
    generated = _generated()
    stream = [(c["name"], c["type"]) for c in generated["streamDeclaration"]["columns"]]
    table = [(c["name"], c["type"]) for c in generated["tableColumns"]]
    assert stream == schema.columns()
    assert [name for name, _ in table] == list(schema.properties())
    for (name, stream_type), (_, table_type) in zip(stream, table, strict=True):
        expected = "dateTime" if stream_type == "datetime" else stream_type
        assert table_type == expected, name
    # Log Analytics requires TimeGenerated, a datetime, in every table.
    assert ("TimeGenerated", "dateTime") in table
    assert generated["streamDeclaration"] == schema.dcr_stream_declaration()


def _rule() -> dict[str, Any]:
    """The data collection rule, as each of the `ruleCount` copies is declared."""
    rules = bicep.resources(INGESTION, "Microsoft.Insights/dataCollectionRules")["rules"]
    assert rules["config"]["loop_type"]["detail"]["count"] == "ruleCount"
    declared: dict[str, Any] = rules["config"]["config"]
    return declared


def test_names_agree_with_the_agent_and_the_bicep() -> None:
    generated = _generated()
    assert generated["stream"] == schema.DCR_STREAM
    properties = _rule()["properties"]
    declared = {key.strip("'"): value for key, value in properties["streamDeclarations"].items()}
    assert list(declared) == [schema.DCR_STREAM]
    flow = properties["dataFlows"][0]
    assert flow["streams"] == [schema.DCR_STREAM]
    assert flow["outputStream"] == generated["outputStream"] == "Custom-" + generated["table"]
    table = bicep.resources(WORKSPACE, "Microsoft.OperationalInsights/workspaces/tables")["table"]
    assert table["config"]["name"] == generated["table"]
    assert table["config"]["properties"]["schema"]["name"] == generated["table"]


def test_bicep_takes_columns_and_declaration_from_the_generated_file() -> None:
    def accessor(value: Any) -> tuple[str, str]:
        operands = value["operator"]["operands"]
        return operands["operand_1"], operands["operand_2"]

    (declaration,) = _rule()["properties"]["streamDeclarations"].values()
    assert accessor(declaration) == ("generated", "streamDeclaration")
    table = bicep.resources(WORKSPACE, "Microsoft.OperationalInsights/workspaces/tables")["table"]
    columns = table["config"]["properties"]["schema"]["columns"]
    assert accessor(columns) == ("generated", "tableColumns")
    for path in (INGESTION, WORKSPACE):
        assert GENERATED.resolve() in bicep.loaded_files(path)
        loader = bicep.variables(path)["generated"]["function"]
        assert loader["type"] == "load_json_content"

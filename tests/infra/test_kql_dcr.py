"""The DCR transformation: valid against the stream, shaped like the table, DCR-safe KQL only."""

from __future__ import annotations

import pytest

from bridge import schema
from tests.support.kql import DCR_PROBES, session
from tools import kql_check
from tools.kql_check import DCR_TRANSFORM


def _kusto_type(log_analytics_type: str) -> str:
    return {"boolean": "bool"}.get(log_analytics_type, log_analytics_type)


def test_transform_is_checked_against_the_stream_declaration() -> None:
    texts = {t.name: t for t in kql_check.collect()}
    assert texts[DCR_TRANSFORM].schema == "dcr"
    assert session().result(DCR_TRANSFORM).errors == []
    assert session().result(DCR_TRANSFORM).sources == ["source"]


def test_transform_output_is_exactly_the_table() -> None:
    # The Logs Ingestion API drops what the table lacks, so a lost column would be silent.
    expected = [f"{name}:{_kusto_type(kind)}" for name, kind in schema.columns()]
    assert session().result(DCR_TRANSFORM).columns == expected


def test_transform_uses_only_what_dcr_transformations_support() -> None:
    assert kql_check.dcr_violations(session().result(DCR_TRANSFORM)) == []


@pytest.mark.parametrize(
    ("probe", "refused"),
    [
        ("summarize", "operator 'summarize'"),
        ("join", "operator 'join'"),
        ("function", "function 'format_datetime'"),
        ("scalar-operator", "scalar operator 'has_any'"),
    ],
)
def test_dcr_check_refuses_what_transformations_cannot_run(probe: str, refused: str) -> None:
    assert refused in kql_check.dcr_violations(session().result(f"dcr:{probe}"))


def test_a_transformation_sees_only_source() -> None:
    errors = session().result("dcr:table").errors
    assert "SeBridgeRecords_CL" in errors[0].message


def test_summarize_and_join_are_valid_kql_yet_refused_in_a_transformation() -> None:
    for probe in ("summarize", "join"):
        assert session().result(f"dcr:{probe}").errors == []


def test_dcr_check_accepts_supported_operators_functions_and_let() -> None:
    result = session().result("dcr:allowed")
    assert result.errors == []
    assert kql_check.dcr_violations(result) == []
    assert "Tag" in result.let_names


def test_problems_reports_a_dcr_violation_against_its_file() -> None:
    text = kql_check.KqlText("x.kql", DCR_PROBES["summarize"], "dcr")
    lines = kql_check.problems([text], [session().result("dcr:summarize")])
    assert "dcr:summarize: operator 'summarize' is not supported in a DCR transformation" in lines

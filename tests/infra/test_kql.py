"""Every KQL text in infra/ passes Microsoft's Kusto analyser against the record schema."""

from __future__ import annotations

import re

import pytest

from bridge import schema
from tests.support.kql import BAD, PARAMETERS, REQUIRED, T, session
from tools import kql_check

INFRA_NAMES = [t.name for t in kql_check.collect()]
WORKSPACE_NAMES = [t.name for t in kql_check.collect() if t.schema == "workspace"]


@pytest.mark.parametrize("path", REQUIRED)
def test_file_other_helpers_load_exists(path: str) -> None:
    assert (kql_check.ROOT / path).is_file()


def test_every_kql_file_and_workbook_query_is_collected() -> None:
    names = set(INFRA_NAMES)
    assert {p for p in REQUIRED if p.endswith(".kql")} <= names
    workbook = [n for n in names if n.startswith("infra/workbook/se-bridge.workbook.json#")]
    assert len(workbook) >= 8


@pytest.mark.parametrize("name", INFRA_NAMES)
def test_kql_has_no_errors(name: str) -> None:
    errors = session().result(name).errors
    assert errors == [], "\n".join(f"{name}:{e.line}:{e.column}: {e.message}" for e in errors)


@pytest.mark.parametrize("name", WORKSPACE_NAMES)
def test_query_reads_only_the_table(name: str) -> None:
    assert session().result(name).sources == [T]


@pytest.mark.parametrize("name", WORKSPACE_NAMES)
def test_no_result_column_was_renamed_by_a_name_clash(name: str) -> None:
    # Two arg_max() or a join with a shared column silently yield TimeGenerated1, EventId1.
    columns = [c.split(":")[0] for c in session().result(name).columns]
    known = set(columns) | {n for n, _ in schema.columns()}
    clashes = [c for c in columns if (m := re.fullmatch(r"(.+\D)\d+", c)) and m.group(1) in known]
    assert clashes == []


@pytest.mark.parametrize(("path", "param"), PARAMETERS.items())
def test_parameterised_alert_has_its_one_parameter_on_line_one(
    path: str, param: tuple[str, str]
) -> None:
    lines = (kql_check.ROOT / path).read_text(encoding="utf-8").splitlines()
    assert re.fullmatch(r"let \w+ = .+;", lines[0])
    assert lines[0] == param[0]
    name = lines[0].split()[1]
    assert not any(re.match(rf"\s*let {name}\b", line) for line in lines[1:])
    assert any(re.search(rf"\b{name}\b", line) for line in lines[1:]), "parameter unused"


@pytest.mark.parametrize("path", PARAMETERS)
def test_alert_still_checks_with_another_parameter_value(path: str) -> None:
    assert session().result(f"param:{path}").errors == []


def test_unparameterised_alerts_do_not_start_with_a_let() -> None:
    # Bicep replaces line 1 of parameterised alerts only; a let elsewhere on line 1 is a mistake.
    for path in sorted((kql_check.ROOT / "infra/kql/alerts").glob("*.kql")):
        rel = path.relative_to(kql_check.ROOT).as_posix()
        if rel not in PARAMETERS:
            assert not path.read_text(encoding="utf-8").startswith("let "), rel


@pytest.mark.parametrize(("probe", "line"), [(k, v[1]) for k, v in BAD.items()])
def test_checker_reports_a_bad_query(probe: str, line: int) -> None:
    errors = session().result(f"bad:{probe}").errors
    assert errors
    assert errors[0].line == line


def test_checker_names_the_unknown_column_and_the_type_errors() -> None:
    messages = {k: " ".join(e.message for e in session().result(f"bad:{k}").errors) for k in BAD}
    assert "VmNmae" in messages["unknown-column"]
    assert "datetime and string" in messages["datetime-vs-string"]
    assert "summable" in messages["sum-of-string"]


def test_problems_lists_file_line_and_column() -> None:
    texts = [kql_check.KqlText("bad:unknown-column", BAD["unknown-column"][0])]
    lines = kql_check.problems(texts, [session().result("bad:unknown-column")])
    assert len(lines) == 1
    assert lines[0].startswith("bad:unknown-column:2:9: KS142 ")


def test_kql_written_inline_in_bicep_is_found_and_checked() -> None:
    found = {n: r for n, r in session().results.items() if n.startswith("bicep:")}
    assert list(found) == ["bicep:infra/modules/alerts.bicep:4"]
    assert "VmNmae" in found["bicep:infra/modules/alerts.bicep:4"].errors[0].message


# What a person acting on each alert of issues 29 and 30 needs in front of them.
ALERT_COLUMNS = {
    "infra/kql/alerts/ask-pending.kql": {
        "EventId": "string",
        "AskedAt": "datetime",
        "MinutesPending": "real",
        "AskedTarget": "string",
        "AskDeadline": "datetime",
        "NotBefore": "datetime",
        "NotifyFailing": "dynamic",
    },
    "infra/kql/alerts/budget-override.kql": {
        "EventId": "string",
        "OverriddenAt": "datetime",
        "DecidedByName": "string",
        "DecidedBy": "string",
        "OperatorReason": "string",
    },
    "infra/kql/alerts/drain-blocked.kql": {
        "NodeName": "string",
        "NodePool": "string",
        "EventId": "string",
        "BlockedSince": "datetime",
        "MinutesBlocked": "real",
        "Blockers": "dynamic",
    },
    "infra/kql/alerts/pause-long.kql": {
        "Scope": "string",
        "PausedSince": "datetime",
        "HoursPaused": "real",
        "PausedBy": "string",
        "OperatorReason": "string",
        "PauseUntil": "datetime",
    },
    "infra/kql/alerts/upcoming-budget-break.kql": {
        "WindowStart": "datetime",
        "DaysAhead": "real",
        "UpcomingSource": "string",
        "BudgetBreak": "string",
        "WindowEnd": "datetime",
        "Vms": "dynamic",
    },
}


@pytest.mark.parametrize(("path", "expected"), ALERT_COLUMNS.items())
def test_people_and_drain_alerts_say_who_what_and_since_when(
    path: str, expected: dict[str, str]
) -> None:
    columns = dict(c.split(":", 1) for c in session().result(path).columns)
    assert {name: columns.get(name) for name in expected} == expected


def test_drain_blocked_reads_only_the_drains_hook_records_and_expands_their_blockers() -> None:
    text = (kql_check.ROOT / "infra/kql/alerts/drain-blocked.kql").read_text(encoding="utf-8")
    assert 'HookName == "drain"' in text
    assert 'DrainStatus == "Blocked"' in text
    assert "mv-apply" in session().result("infra/kql/alerts/drain-blocked.kql").operators

"""KQL in .bicep files comes from the checked files, or is extracted and checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import kql_check
from tools.kql import bicep

INFRA_KQL = {t.name.split("#")[0] for t in kql_check.collect()}


def _values(tmp_path: Path, text: str) -> list[bicep.KqlValue]:
    path = tmp_path / "infra" / "main.bicep"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return bicep.values(path, tmp_path)


def test_loaded_query_is_traced_to_its_file(tmp_path: Path) -> None:
    (value,) = _values(tmp_path, "x: { query: loadTextContent('kql/alerts/a.kql') }\n")
    assert value.traced
    assert value.loads == ("infra/kql/alerts/a.kql",)
    assert value.inline is None


def test_replaced_parameter_line_through_variables_is_traced(tmp_path: Path) -> None:
    text = (
        "var t = loadTextContent('kql/alerts/heartbeat-missing.kql')\n"
        "var q = 'let MissingFor = ${m}m;\\n${join(skip(split(t, '\\n'), 1), '\\n')}'\n"
        "r: { query: q, other: 1 }\n"
    )
    (value,) = _values(tmp_path, text)
    assert value.loads == ("infra/kql/alerts/heartbeat-missing.kql",)
    assert value.inline is None


def test_loop_member_is_traced_when_the_member_is_loaded(tmp_path: Path) -> None:
    text = (
        "var alerts = [\n  { name: 'a', kql: loadTextContent('kql/alerts/a.kql') }\n]\n"
        "resource r 'x@1' = [for a in alerts: { properties: { query: a.kql } }]\n"
    )
    (value,) = _values(tmp_path, text)
    assert value.traced


def test_inline_literals_are_extracted(tmp_path: Path) -> None:
    text = (
        "a: { transformKql: 'source | where Zone != \\'1\\'' }\nb: { query: '''\nT\n| take 1''' }\n"
    )
    first, second = _values(tmp_path, text)
    assert first.inline == "source | where Zone != '1'"
    assert second.inline == "T\n| take 1"


@pytest.mark.parametrize(
    "value", ["'T | where x == ${p}'", "concat('T', p)", "someParam", "a.unknownMember"]
)
def test_untraceable_query_is_reported(tmp_path: Path, value: str) -> None:
    (found,) = _values(tmp_path, f"r: {{ query: {value} }}\n")
    assert not found.traced


def _infra_values() -> list[bicep.KqlValue]:
    root = kql_check.ROOT
    return [v for p in sorted(root.glob("infra/**/*.bicep")) for v in bicep.values(p, root)]


def test_every_kql_in_infra_bicep_is_loaded_from_a_checked_file_or_inline() -> None:
    for value in _infra_values():
        assert value.traced, (
            f"{value.file}:{value.line}: cannot tell where this {value.prop} comes from"
        )
        for loaded in value.loads:
            assert (kql_check.ROOT / loaded).is_file(), f"{value.file}:{value.line}: {loaded}"
            assert loaded in INFRA_KQL, f"{value.file}:{value.line}: {loaded} is not checked"


def test_bicep_loads_every_alert_the_transform_and_the_workbook() -> None:
    loaded = {path for value in _infra_values() for path in value.loads}
    alerts = {
        p.relative_to(kql_check.ROOT).as_posix()
        for p in (kql_check.ROOT / "infra/kql/alerts").glob("*.kql")
    }
    expected = alerts | {kql_check.DCR_TRANSFORM, "infra/workbook/se-bridge.workbook.json"}
    assert expected - loaded == set()

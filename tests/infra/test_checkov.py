"""checkov over infra/: every .bicep file parsed, no failed check, every skip has a reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import bicep


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return bicep.run_checkov()


def test_checkov_parsed_every_bicep_file(report: dict[str, Any]) -> None:
    # A file checkov cannot parse is left out of the scan and the run still exits 0.
    assert report["summary"]["parsing_errors"] == 0, report["results"]["parsing_errors"]
    parsed = bicep.checkov_parsed_files()
    expected = sorted(str(p) for p in bicep.bicep_files())
    assert parsed["found"] == expected
    assert parsed["parsed"] == expected
    assert parsed["errors"] == []


def test_checkov_scanned_resources_of_every_file_with_checks(report: dict[str, Any]) -> None:
    scanned = {
        record["file_path"]
        for kind in ("passed_checks", "failed_checks", "skipped_checks")
        for record in report["results"][kind]
    }
    for name in ("main.bicep", "modules/storage.bicep", "modules/keyvault.bicep"):
        assert f"/{name}" in scanned
    assert report["summary"]["resource_count"] > 0


def test_no_failed_check(report: dict[str, Any]) -> None:
    failed = [
        f"{r['check_id']} {r['check_name']} at {r['file_path']}:{r['resource']} "
        f"(severity {r.get('severity')})"
        for r in report["results"]["failed_checks"]
    ]
    assert not failed, (
        "fix these or skip them with a reason (// checkov:skip=ID:why):\n" + "\n".join(failed)
    )


def test_every_skipped_check_carries_its_reason(report: dict[str, Any]) -> None:
    skipped = report["results"]["skipped_checks"]
    assert skipped  # the skips below are real: checkov would fail these checks
    for record in skipped:
        reason = record["check_result"].get("suppress_comment", "")
        assert len(reason) >= 20, f"{record['check_id']} at {record['file_path']}: no reason"


@pytest.mark.parametrize("path", bicep.bicep_files(), ids=lambda p: str(p.relative_to(bicep.INFRA)))
def test_every_skip_comment_is_used_and_explained(path: Path, report: dict[str, Any]) -> None:
    used = {(r["file_path"], r["check_id"]) for r in report["results"]["skipped_checks"]}
    relative = "/" + str(path.relative_to(bicep.INFRA))
    for check, reason in bicep.skip_comments(path):
        assert len(reason) >= 20, f"{relative}: checkov:skip={check} has no reason"
        # A skip for a check that never fires is noise that hides the real ones.
        assert (relative, check) in used, f"{relative}: checkov:skip={check} skips nothing"

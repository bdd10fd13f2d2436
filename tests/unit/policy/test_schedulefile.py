"""`se-bridge policy check POLICY --schedule FILE` (issue 40, item 2): the fleet's patch
schedules against the policy's budgets, offline, naming each break."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.cli import main

DATA = Path(__file__).parents[2] / "data" / "weekahead" / "schedule.json"
WEDNESDAY = "2024-06-12T10:00:00Z"


def _policy(tmp_path: Path, budget: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(f"version: 1\nbudgets:\n  - {budget}\nrules:\n  - name: all\n"
                    "    action: approve\n", encoding="utf-8")  # fmt: skip
    return path


def test_a_tuesday_run_of_a_whole_scale_set_breaks_a_max_vms_1_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path, "{name: one-at-a-time, group: scale_set, max_vms: 1}")
    code = main(["policy", "check", str(policy), "--schedule", str(DATA), "--at", WEDNESDAY])
    out = capsys.readouterr().out
    assert code == 1
    breaks = [line for line in out.splitlines() if line.startswith("BREAK")]
    # Two Tuesdays within 14 days; app-sat-0300 patches one VM and fits.
    assert breaks == [
        "BREAK 2024-06-18 00:00Z web-tue-0200: budget one-at-a-time, group "
        "8d5f9c8e-1111-4222-8333-444455556666/rg-web/web: 4 VMs at once, limit 1",
        "BREAK 2024-06-25 00:00Z web-tue-0200: budget one-at-a-time, group "
        "8d5f9c8e-1111-4222-8333-444455556666/rg-web/web: 4 VMs at once, limit 1",
    ]
    assert "4 runs of 2 configurations in the next 14 days" in out


def test_a_budget_the_schedules_fit_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path, "{name: half, group: scale_set, max_percent: 100}")
    code = main(["policy", "check", str(policy), "--schedule", str(DATA), "--at", WEDNESDAY])
    out = capsys.readouterr().out
    assert code == 0
    assert "BREAK" not in out
    assert "fit every budget" in out


def test_a_schedule_it_cannot_read_exits_2_naming_the_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    data["configurations"][1]["properties"]["maintenanceWindow"]["timeZone"] = "Mars Time"
    broken = tmp_path / "schedule.json"
    broken.write_text(json.dumps(data), encoding="utf-8")
    policy = _policy(tmp_path, "{name: one-at-a-time, group: scale_set, max_vms: 1}")
    code = main(["policy", "check", str(policy), "--schedule", str(broken), "--at", WEDNESDAY])
    err = capsys.readouterr().err
    assert code == 2
    assert "app-sat-0300" in err
    assert "Mars Time" in err


def test_without_schedule_policy_check_is_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path, "{name: one-at-a-time, group: scale_set, max_vms: 1}")
    assert main(["policy", "check", str(policy)]) == 0
    assert "valid policy" in capsys.readouterr().out

"""The short chaos run of the normal suite; `python -m tests.chaos` runs the long one.

A dozen SIGKILLs of agents and the consumer while events come and go, IMDS answers with
faults and the sinks go down; afterwards every invariant of tests.chaos.invariants holds. And
the drain case (tests.chaos.drains): Kubernetes nodes drained while agents are killed and the
API server goes down, checked at the end of every cycle.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.chaos.drains import run_drain_chaos
from tests.chaos.run import run_chaos

CYCLES = int(os.environ.get("SE_BRIDGE_CHAOS_CYCLES", "12"))
SEED = int(os.environ.get("SE_BRIDGE_CHAOS_SEED", "1"))

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]


@pytest.mark.slow
@pytest.mark.timeout(600 + 10 * CYCLES)
def test_no_invariant_breaks_under_kills_faults_and_outages(
    tmp_path: Path, record_property: object
) -> None:
    report = run_chaos(tmp_path, cycles=CYCLES, seed=SEED)
    print(report.text())
    assert not report.problems, report.text()


DRAIN_CYCLES = int(os.environ.get("SE_BRIDGE_CHAOS_DRAIN_CYCLES", "3"))


@pytest.mark.slow  # about 20 s: three cycles of drains, kills and API outages
@pytest.mark.timeout(120 + 130 * DRAIN_CYCLES)
def test_no_node_is_left_cordoned_nor_approved_before_its_drain(tmp_path: Path) -> None:
    report = run_drain_chaos(tmp_path, cycles=DRAIN_CYCLES, seed=SEED)
    print(report.text())
    assert not report.problems, report.text()

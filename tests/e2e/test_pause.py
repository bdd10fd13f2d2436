"""`se-bridge pause --scope` as a person runs it against a standalone consumer (issue 39, item
9): a scope of the wrong form is refused on the command line (exit 2, what to write), and one
that covers no VM the consumer knows is taken with a warning, so a typo does not pass for a
pause that holds."""

from __future__ import annotations

import pytest

from tests.component.agent.test_imds_http import free_port
from tests.e2e.test_approvals import Loop, Transport
from tests.support.processes import Processes, run_bridge
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e


def test_pause_checks_the_scopes_form_and_warns_of_one_that_covers_no_vm(
    procs: Processes,
) -> None:
    port = free_port()
    loop = Loop(procs, Transport(procs.workdir), ["--page-address", f"127.0.0.1:{port}"]).start()
    api = ["--api", f"http://127.0.0.1:{port}", "--state-dir", str(procs.workdir / "consumer")]

    for scope in ("zone", "zone:", "planet:3", "tag:"):
        bad = run_bridge("pause", "--scope", scope, "--reason", "incident 4711", *api)
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert "is not KIND:VALUE" in bad.stderr, bad.stderr
        assert "Error" not in bad.stdout + bad.stderr  # no class name
        assert bad.stdout == ""  # nothing was sent

    nothing = run_bridge("pause", "--scope", "scale_set:nosuch", "--reason", "incident 4711", *api)
    assert nothing.returncode == 0, nothing.stdout + nothing.stderr + loop.describe()
    assert nothing.stdout.startswith("Accepted: "), nothing.stdout
    assert "warning: no VM the consumer knows is in scale_set:nosuch" in nothing.stderr

    group = loop.sim.fleet()["app-0"]["resourceId"].split("/resourceGroups/")[1].split("/")[0]

    def covered() -> str | None:  # once the consumer has heard from the VMs
        done = run_bridge("pause", "--scope", f"resource_group:{group}", "--reason", "r", *api)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout if "warning" not in done.stderr else None

    assert eventually(covered, what="a pause of the VMs' group without a warning",
                      details=loop.describe).startswith("Accepted: ")  # fmt: skip

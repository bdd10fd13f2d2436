"""People in the loop, end to end (issue 29): the IMDS simulator, an agent process per VM, and
`se-bridge consume` with its fleet state on Azurite's tables and the storage-queue command
channel. The policy asks the owners about every event; the webhook receiver gets the asks with
their links; one person approves through `se-bridge approve`, another through the approval page
in Chromium with scripting off; both approvals reach IMDS, and the audit names both people.

Both people sign in with Entra ID: a test tenant serves its signing keys on loopback and signs
their tokens. The page reads a person's token from the header App Service Authentication sets;
the CLI gets its person's token from the Azure CLI, as it does for a real person, here a stand-in
`az` on PATH that prints the token (the credential chain is azure-identity's, unchanged).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from tests.component.agent.test_imds_http import free_port
from tests.component.people.test_page_browser import signed_in
from tests.doubles.entra import AUDIENCE, Tenant, serving
from tests.doubles.webhook import WebhookReceiver
from tests.e2e.test_approvals import Loop, Transport
from tests.support.azurite import Azurite
from tests.support.browser import Chromium
from tests.support.processes import Processes, read_records, run_bridge
from tests.support.wait import eventually

pytestmark = pytest.mark.e2e

POLICY = """\
version: 1
rules:
  - name: ask-the-owners
    action: {ask: {target: owners, deadline: 30m, on_deadline: hold}}
"""


class QueuesAndTables(Transport):
    """Records through the local hub; the fleet state in Azurite's tables and the commands in
    its queues, as a consumer in Azure keeps them."""

    name = "azurite"

    def __init__(self, root: Path, azurite: Azurite) -> None:
        super().__init__(root)
        self.azurite = azurite
        self.tag = os.urandom(4).hex()

    def agent_args(self, listen: bool) -> list[str]:
        return ["--sink", f"hub:{self.hub}"] + (["--commands", "storagequeue"] if listen else [])

    def consumer_args(self) -> list[str]:
        return ["--hub", str(self.hub), "--commands", "storagequeue", "--state", "tables"]

    def env(self) -> dict[str, str]:
        return {
            "SE_BRIDGE_STORAGE_CONNECTION_STRING": self.azurite.connection_string,
            "SE_BRIDGE_COMMANDS_QUEUE_PREFIX": f"t{self.tag}-",
            "SE_BRIDGE_CONSUMER_TABLE_NAME": f"fleet{self.tag}",
            "NO_PROXY": "127.0.0.1,localhost",
        }


@pytest.fixture
def tenant() -> Iterator[Tenant]:
    with serving(Tenant()) as served:
        yield served


@pytest.fixture
def webhooks() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def chromium(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Chromium]:
    with Chromium.start(tmp_path, request.node.name) as browser:
        yield browser


def people_settings(tenant: Tenant, webhooks: WebhookReceiver, page: str) -> dict[str, str]:
    """The consumer's [consumer.people] and [notify], and the CLI's: the same tenant."""
    target = {"name": "owners", "kind": "generic", "url": webhooks.url("/owners")}
    return {
        "SE_BRIDGE_CONSUMER_PEOPLE_TENANT_ID": tenant.tenant_id,
        "SE_BRIDGE_CONSUMER_PEOPLE_AUDIENCE": AUDIENCE,
        "SE_BRIDGE_CONSUMER_PEOPLE_JWKS_URL": tenant.jwks_url,
        "SE_BRIDGE_NOTIFY_TARGETS": json.dumps([target]),
        "SE_BRIDGE_NOTIFY_PAGE_URL": page,
    }


def azure_cli_signed_in(root: Path, token: str) -> dict[str, str]:
    """The environment of a person signed in with `az login`: an `az` that answers `az account
    get-access-token` with `token` and keeps the arguments it was called with."""
    bin_dir, home = root / "bin", root / "home"
    bin_dir.mkdir(parents=True)
    home.mkdir()
    answer = json.dumps({"accessToken": token, "expires_on": 4102444800, "tokenType": "Bearer"})
    (root / "token.json").write_text(answer, encoding="utf-8")
    az = bin_dir / "az"
    az.write_text(f'#!/bin/sh\necho "$@" >> {root / "az.calls"}\ncat {root / "token.json"}\n',
                  encoding="utf-8")  # fmt: skip
    az.chmod(az.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(home)}


def test_two_people_approve_asked_events_through_the_cli_and_the_page(
    procs: Processes,
    azurite: Azurite,
    tenant: Tenant,
    webhooks: WebhookReceiver,
    chromium: Chromium,
) -> None:
    port = free_port()
    page = f"http://127.0.0.1:{port}"
    policy = procs.workdir / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    people = people_settings(tenant, webhooks, page)
    args = ["--policy", str(policy), "--page-address", f"127.0.0.1:{port}"]
    loop = Loop(procs, QueuesAndTables(procs.workdir, azurite), args)
    loop.env.update(people)
    loop.start()
    first = loop.sim.add_event(EventType="Reboot", EventSource="Platform", Resources=["app-0"])
    second = loop.sim.add_event(EventType="Reboot", EventSource="Platform", Resources=["app-1"])

    def asked() -> dict[str, dict[str, Any]] | None:
        found = {b["EventId"]: b for b in webhooks.bodies("/owners") if b["Kind"] == "asked"}
        return found if {first, second} <= set(found) else None

    notices = eventually(asked, what="the owners to be asked about both events",
                         details=loop.describe)  # fmt: skip
    assert notices[second]["Link"] == f"{page}/events/{second}"
    assert notices[first]["Vms"] == ["app-0"]

    # Alice, at her terminal, signed in with the Azure CLI.
    alice = tenant.token(oid="oid-alice", name="Alice")
    signed_in_env = {**people, **azure_cli_signed_in(procs.workdir / "alice", alice)}
    done = run_bridge("approve", first, "--api", page, "--reason", "failover done",
                      env=signed_in_env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + loop.describe()
    assert "Accepted: recorded; the event now: Approve: approved by Alice" in done.stdout
    calls = (procs.workdir / "alice" / "az.calls").read_text(encoding="utf-8")
    assert f"--resource {AUDIENCE}" in calls

    # Bob follows the link in the notice; App Service Authentication signed him in.
    signed_in(chromium, tenant.token(oid="oid-bob", name="Bob"))
    chromium.driver.get(notices[second]["Link"])
    section = chromium.driver.find_element(By.ID, f"event-{second}")
    assert "app-1" in section.text
    assert "owners" in section.text
    chromium.shot("asked")
    form = section.find_element(By.XPATH, ".//form[.//button[@value='approve']]")
    form.find_element(By.NAME, "reason").send_keys("replica, fine to go")
    form.find_element(By.TAG_NAME, "button").click()
    said = chromium.driver.find_element(By.ID, "answer").text
    assert said.startswith("Accepted: recorded; the event now: Approve: approved by Bob"), said
    chromium.shot("approved")

    for event_id, vm in ((first, "app-0"), (second, "app-1")):
        assert loop.wait_approved(event_id)["vm"] == vm

        def approved(vm: str = vm, event_id: str = event_id) -> list[dict[str, Any]]:
            return [r for r in loop.approval_records(vm) if r["EventId"] == event_id]

        [record] = eventually(approved, what=f"{vm}'s Approval record", details=loop.describe)
        assert (record["ApprovalOutcome"], record["ApprovalSource"]) == ("Approved", "Central")

    def told() -> dict[str, Any] | None:
        found = {b["EventId"]: b["DecidedBy"] for b in webhooks.bodies("/owners")
                 if b["Kind"] == "approved"}  # fmt: skip
        return found if len(found) == 2 else None

    who = eventually(told, what="the owners to be told who approved", details=loop.describe)
    assert who == {first: "Alice", second: "Bob"}

    decisions = read_records(loop.decisions)
    trail = {
        event_id: [d for d in decisions if d["EventId"] == event_id] for event_id in (first, second)
    }
    for event_id in (first, second):
        assert trail[event_id][0]["DecisionAction"] == "Ask"
        assert trail[event_id][0]["AskedTarget"] == "owners"
    by = {
        event_id: [
            (d["DecisionRule"], d["DecidedBy"], d["DecidedByName"], d["OperatorReason"])
            for d in trail[event_id]
            if d["DecisionAction"] == "Approve"
        ]
        for event_id in (first, second)
    }
    assert by == {
        first: [("(person)", "oid-alice", "Alice", "failover done")],
        second: [("(person)", "oid-bob", "Bob", "replica, fine to go")],
    }

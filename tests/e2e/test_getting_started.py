"""docs/getting-started.md, step 3, run in order as a user runs it (issue 39, item 4).

What needs Azure gets its local equivalent: Log Analytics holds what the VM's agent sent, so a
simulator and an agent make those records (the page's user restart: a Reboot from the User),
and the export is what `az monitor log-analytics query -o json` prints for the page's query,
its columns as Microsoft's Kusto analyser says the query keeps them. Every other command runs
as the page writes it, `.se/bin/se-bridge` being this checkout's `python -m bridge`. A command
the test has no local equivalent for fails it, so the page cannot gain an untried step.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.support.laexport import az_rows
from tests.support.processes import Agent, Processes, Simulator, run_bridge
from tests.support.sourcetree import ROOT
from tools import kql_check
from tools.kql_check import KqlText

pytestmark = pytest.mark.e2e

PAGE = ROOT / "docs" / "getting-started.md"
SE_BRIDGE = ".se/bin/se-bridge "


def _step(page: str, number: int) -> str:
    start = page.index(f"\n## {number}. ")
    end = page.find("\n## ", start + 1)
    return page[start : end if end != -1 else len(page)]


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def _commands(block: str) -> list[str]:
    """Each command of a shell block: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    lines = (line.split("  #", 1)[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def _columns(query: str) -> list[str]:
    """The columns `query` keeps, as the Kusto analyser reads it against the table."""
    (result,) = kql_check.run([KqlText("getting-started step 3", query)])
    assert not result.errors, result.errors
    # The table's standard columns come too, which the analyser's table leaves out.
    return ["TenantId", *(column.split(":", 1)[0] for column in result.columns), "Type"]


def _export(command: str, records: list[dict[str, object]], work: Path) -> None:
    words = shlex.split(command)
    query = words[words.index("--analytics-query") + 1]
    assert "-o" in words, "az prints JSON only with -o json where its default is another"
    assert words[words.index("-o") + 1] == "json"
    out = work / words[words.index(">") + 1]
    out.write_text(json.dumps(az_rows(records, _columns(query)), indent=2), encoding="utf-8")


def test_step_3_runs_in_order(procs: Processes, tmp_path: Path) -> None:
    page = PAGE.read_text(encoding="utf-8")
    step = _step(page, 3)
    saved = re.search(r"Save this as `([^`]+)`", step)
    assert saved, "step 3 names the file its policy is saved as"
    (policy,) = _blocks(step, "yaml")
    (tmp_path / saved.group(1)).parent.mkdir(parents=True)
    (tmp_path / saved.group(1)).write_text(policy, encoding="utf-8")

    sim = Simulator.launch(procs, "sim", "--vms", "1")
    agent = Agent(procs, "web-0", sim.vm_url("vm-0")).start()
    sim.wait_polls({"vm-0": 2})
    event_id = sim.add_event(EventType="Reboot", EventSource="User", Resources=["vm-0"])
    agent.wait_transition(event_id, "Scheduled")
    records = agent.records()  # exported while the agent runs, as on the page

    said: dict[str, str] = {}
    commands = [c for block in _blocks(step, "sh") for c in _commands(block)]
    for command in commands:
        if "functionapp" in command:
            break  # shipping the policy to Azure: nothing after it runs here
        if command.startswith("WORKSPACE=$(az "):
            continue  # the workspace's id: here, the agent's records are the workspace
        if command.startswith("az monitor log-analytics query "):
            _export(command, records, tmp_path)
        elif command.startswith(".se/bin/pip install "):
            continue  # this checkout's venv holds the consumer extra
        elif command.startswith(SE_BRIDGE):
            args = shlex.split(command.removeprefix(SE_BRIDGE))
            with_paths = [str(tmp_path / a) if (tmp_path / a).exists() else a for a in args]
            done = run_bridge(*with_paths)
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            said[" ".join(args[:2])] = done.stdout
        else:
            pytest.fail(f"step 3's command has no local equivalent in this test: {command}")
    assert set(said) == {"policy check", "policy explain"}, commands
    explained = said["policy explain"]
    assert f"event {event_id}: Reboot from User, Scheduled" in explained, explained
    assert "decision: Approve by user-initiated" in explained, explained
    assert agent.stop() == 0


def test_step_2_runs_where_it_can_and_names_real_outputs(tmp_path: Path) -> None:
    """Step 2 is Azure's but for the signing key and the query; every `out NAME` it and step 3
    read is an output of infra/main.bicep."""
    page = PAGE.read_text(encoding="utf-8")
    step = _step(page, 2)
    commands = [c for block in _blocks(step, "sh") for c in _commands(block)]
    (keygen,) = [c for c in commands if c.startswith(f"{SE_BRIDGE}keygen ")]
    args = shlex.split(keygen.removeprefix(SE_BRIDGE))
    out = args.index("--out") + 1
    args[out] = str(tmp_path / args[out])
    done = run_bridge(*args)
    assert done.returncode == 0, done.stderr
    # The verify key it prints is what install-agent.sh takes as --verify-key.
    printed = re.search(r'verify_key = "([^"]*)"', done.stdout)
    assert printed, done.stdout
    assert re.fullmatch(r"[A-Za-z0-9+/]{43}=", printed.group(1)), done.stdout
    (query,) = _blocks(step, "kusto")
    (result,) = kql_check.run([KqlText("getting-started step 2", query)])
    assert not result.errors, result.errors
    outputs = set(re.findall(r"^output (\w+) ", (ROOT / "infra" / "main.bicep").read_text(
        encoding="utf-8"), re.MULTILINE))  # fmt: skip
    used = set(re.findall(r"\$\(out (\w+)\)", page))
    assert used, "the page reads the deployment's outputs with out NAME"
    assert used <= outputs, used - outputs

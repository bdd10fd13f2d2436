"""`se-bridge consume` as a process, asking about an event, against a webhook that answers
400 MB: the consumer posts, reads the status alone and hangs up, and its memory stays its own
(a consumer that read the answer whole grew from 30 MB to 814 MB)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from bridge.localhub import LocalHub
from tests.doubles.hostile_webhook import HostileWebhook
from tests.support.fleetrecords import FleetRecords
from tests.support.processes import Processes
from tests.support.wait import eventually

EVENT = "5DD55E16-0000-4000-8000-0000000000A5"
POLICY = """\
version: 1
rules:
  - name: ask-the-owners
    action: {ask: {target: owners, deadline: 30m, on_deadline: hold}}
"""
MIB = 1024 * 1024


def peak_rss(pid: int) -> int:
    """The process's largest resident set so far (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_consumer_reads_no_more_of_a_webhook_s_answer_than_its_status(
    procs: Processes, tmp_path: Path
) -> None:
    fleet = FleetRecords(now=datetime.now(timezone.utc))
    fleet.vm("db-0")
    with LocalHub(tmp_path / "hub") as hub:
        hub.append([(r["VmId"], json.dumps(r)) for r in (fleet.heartbeat("db-0"),
                                                          fleet.event("db-0", EVENT))])  # fmt: skip
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    with HostileWebhook("huge", size=400 * MIB) as hostile:
        target = [{"name": "owners", "kind": "generic", "url": hostile.url()}]
        env = {"SE_BRIDGE_COMMANDS_ALLOW_UNSIGNED": "true", "NO_PROXY": "127.0.0.1",
               "SE_BRIDGE_NOTIFY_TARGETS": json.dumps(target)}  # fmt: skip
        consumer = procs.bridge(
            "consumer", "consume", "--hub", str(tmp_path / "hub"), "--policy", str(policy),
            "--commands", f"local:{tmp_path / 'commands'}", "--state-dir", str(tmp_path / "state"),
            env=env,
        )  # fmt: skip
        eventually(lambda: hostile.counts()[0] >= 1, what="the post", details=consumer.output)
        eventually(lambda: hostile.counts()[2] >= 1, timeout=120,
                   what="the consumer hanging up", details=consumer.output)  # fmt: skip
        posts, sent, _ = hostile.counts()
        peak = peak_rss(consumer.popen.pid)
        assert sent < 64 * MIB, f"{sent / MIB:.0f} MiB of the answer taken"
        assert peak < 200 * MIB, f"the consumer's peak RSS is {peak / MIB:.0f} MiB"
        assert consumer.stop() == 0
    assert posts == 1, "a 200: delivered once"

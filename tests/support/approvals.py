"""An agent against the in-process IMDS simulator, with a fake command inbox, for the
command listener and local mode tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bridge.agent import imds
from bridge.agent.loop import Agent
from bridge.agent.wiring import build_agent
from bridge.channels import Received
from bridge.commands import message as commands
from bridge.config import CommandsSettings, Config, HooksSettings, KubernetesSettings
from bridge.kubernetes.api import KubeApi
from bridge.policy.model import Policy
from bridge.records import utc_now
from bridge.retry import DeliveryError, RetryableError
from bridge.simulator import SimulatorServer
from tests.support.agentharness import AgentHarness


class FakeInbox:
    """A channel in memory: every undeleted message comes back at each read (no hiding)."""

    def __init__(self, failures: int = 0) -> None:
        self._lock = threading.Lock()
        self._messages: list[Received] = []
        self.deleted: list[str] = []
        self.receives = 0
        self.failures = failures

    def put(self, text: str) -> None:
        with self._lock:
            self._messages.append(Received(text, handle=len(self._messages) + len(self.deleted)))

    def receive(self, max_messages: int) -> list[Received]:
        with self._lock:
            self.receives += 1
            if self.failures:
                self.failures -= 1
                raise RetryableError("the queue service is unavailable")
            return list(self._messages[:max_messages])

    def delete(self, message: Received) -> None:
        with self._lock:
            self._messages = [m for m in self._messages if m.handle != message.handle]
            self.deleted.append(message.text)

    def pending(self) -> int:
        with self._lock:
            return len(self._messages)

    def close(self) -> None:
        """Nothing to release."""


class FailingStart(imds.ImdsClient):
    """An IMDS client whose StartRequests POST fails with `error`; reads work."""

    def __init__(self, url: str, error: DeliveryError) -> None:
        super().__init__(url, timeout=2, first_call_timeout=5)
        self.error = error
        self.posts = 0

    def start_events(self, event_ids: list[str]) -> int:
        self.posts += 1
        raise self.error


class Harness(AgentHarness):
    """The agent with a command listener reading a fake (or a real) inbox."""

    record_type = "Approval"

    def __init__(self, server: SimulatorServer, root: Path) -> None:
        super().__init__(server, root)
        self.inbox = FakeInbox()

    def start(
        self,
        *,
        channel: str | None = "local:unused",
        idle_interval: float = 0.0,
        policy: Policy | None = None,
        client: imds.ImdsClient | None = None,
        hooks: HooksSettings | None = None,
        now: Callable[[], datetime] | None = None,
        fake_inbox: bool = True,
        kubernetes: KubernetesSettings | None = None,
        kube: KubeApi | None = None,
    ) -> Agent:
        config = Config(
            agent=self.agent_settings(),
            imds=self.imds_settings(),
            hooks=hooks or HooksSettings(),
            commands=CommandsSettings(
                channel=channel or "", poll_interval=0.2, idle_interval=idle_interval
            ),
            kubernetes=kubernetes or KubernetesSettings(),
        )
        self.agent = build_agent(
            config,
            boot_id="b1",
            client=client,
            policy=policy,
            open_inbox=(lambda _vm_id: self.inbox) if fake_inbox else None,
            now=now or utc_now,
            kube=kube,
        )
        self.agent.start()
        return self.agent


def command(
    vm_id: str,
    event_id: str,
    *,
    issued: timedelta = timedelta(seconds=-0.4),
    expires: timedelta = timedelta(minutes=10),
    rule: str = "user-initiated",
    resources: list[str] | None = None,
) -> commands.Command:
    now = datetime.now(timezone.utc)
    return commands.approve(
        vm_id=vm_id,
        event_id=event_id,
        document_incarnation=2,
        issued_at=now + issued,
        expires_at=now + expires,
        rule=rule,
        reason="User-initiated Reboot: approve at once",
        resources=resources,
    )

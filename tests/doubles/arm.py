"""ARM's acknowledge for the tests: the simulator's (bridge.simulator.arm, the wire protocol, TLS
and the token check) with the events a test `offer`s instead of a simulated fleet's, so a test
says which events exist on which scope and reads back which were acknowledged.

    with ArmDouble(accept_token=issued_for_arm(sim.issued)) as arm:
        arm.offer(scale_set_id, event_id)
        ... the consumer, with eventgrid.arm_endpoint = arm.endpoint ...
        assert arm.acknowledged() == [event_id]
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from bridge.simulator.arm import API_VERSION, AckRequest, ArmServer, issued_for_arm

__all__ = ["API_VERSION", "AckRequest", "ArmDouble", "client_environment", "issued_for_arm"]


class ArmDouble(ArmServer):
    """ARM's acknowledge on https://127.0.0.1:<port> of the events offered; trust `ca_bundle`."""

    def __init__(self, *, accept_token: Callable[[str], bool] | None = None) -> None:
        self._offered: dict[tuple[str, str], bool] = {}  # (scope, event id) -> acknowledged
        self._offered_lock = threading.Lock()
        super().__init__(self._acknowledge, accept_token or bool)

    def __enter__(self) -> ArmDouble:
        self.start()
        return self

    def offer(self, scope: str, *event_ids: str) -> None:
        """Events that exist on `scope` (a compute resource id) and may be acknowledged."""
        with self._offered_lock:
            for event_id in event_ids:
                self._offered.setdefault((scope.lower(), event_id.lower()), False)

    def acknowledged(self) -> list[str]:
        """The event ids acknowledged so far (each once, whatever the retries)."""
        with self._offered_lock:
            return sorted(e for (_, e), done in self._offered.items() if done)

    def _acknowledge(self, scope: str, event_id: str) -> bool:
        key = (scope.lower(), event_id.lower())
        with self._offered_lock:
            if key not in self._offered:
                return False
            self._offered[key] = True
            return True


def client_environment(double: ArmServer, identity_url: str) -> dict[str, str]:
    """What the consumer's process needs to reach the double as it reaches ARM."""
    return double.client_environment(identity_url)

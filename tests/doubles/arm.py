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
from datetime import datetime, timezone

from bridge.simulator.arm import API_VERSION, AckRequest, ArmServer, issued_for_arm

__all__ = ["API_VERSION", "AckRequest", "ArmDouble", "client_environment", "issued_for_arm"]


class ArmDouble(ArmServer):
    """ARM's acknowledge on https://127.0.0.1:<port> of the events offered; trust `ca_bundle`."""

    def __init__(self, *, accept_token: Callable[[str], bool] | None = None) -> None:
        self._offered: dict[tuple[str, str], bool] = {}  # (scope, event id) -> acknowledged
        self._offered_lock = threading.Lock()
        # (configuration id, run name) -> [cut-off, cancels taken]: Update Manager's runs.
        self._runs: dict[tuple[str, str], list[object]] = {}
        self.clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)
        super().__init__(self._acknowledge, accept_token or bool, cancel_run=self._cancel_run)

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

    def offer_run(self, configuration_id: str, run: str, cutoff: datetime) -> None:
        """A patch run of `configuration_id` that may be cancelled until `cutoff`."""
        with self._offered_lock:
            self._runs.setdefault((configuration_id.lower(), run), [cutoff, 0])

    def cancels(self, configuration_id: str, run: str) -> int:
        """How many cancels of the run ARM took (each PUT answered Cancelled)."""
        with self._offered_lock:
            found = self._runs.get((configuration_id.lower(), run))
            return int(str(found[1])) if found else 0

    def _cancel_run(self, configuration_id: str, run: str) -> str:
        with self._offered_lock:
            found = self._runs.get((configuration_id, run))
            if found is None:
                return "NotFound"
            cutoff = found[0]
            assert isinstance(cutoff, datetime)
            if self.clock() > cutoff:
                return "TooLate"
            found[1] = int(str(found[1])) + 1
            return "Cancelled"

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

"""The bearer tokens a simulated Azure service is sent, checked and kept as the simulator's ARM
(bridge.simulator.arm) and the tests' HTTPS doubles (the Logs Ingestion API) check and keep them.

A request is answered by what its `Authorization` header carries: no bearer token (MISSING),
one the service's `accept` does not take (REFUSED), or one it does (ACCEPTED); each service
says so in its own words. Every token sent is kept, distinct and in the order first seen, for
tests' assertions only (that a token was used, and that none leaked into a log), never in a
service's record of its requests.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Mapping


class Bearer(enum.Enum):
    ACCEPTED = "accepted"
    MISSING = "missing"
    REFUSED = "refused"


class BearerTokens:
    """The tokens a service was sent (`seen`), and the check of one request's (`check`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # handler threads check while a test reads
        self._seen: list[str] = []

    def check(self, headers: Mapping[str, str], accept: Callable[[str], bool]) -> Bearer:
        """What `headers` (names in lower case) carry: the token after any scheme is kept,
        and taken only as `Bearer <token>` that `accept` takes."""
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        token = token.strip()
        if token:
            with self._lock:
                if token not in self._seen:
                    self._seen.append(token)
        if scheme.lower() != "bearer" or not token:
            return Bearer.MISSING
        return Bearer.ACCEPTED if accept(token) else Bearer.REFUSED

    @property
    def seen(self) -> list[str]:
        """Distinct tokens, in the order first seen."""
        with self._lock:
            return list(self._seen)

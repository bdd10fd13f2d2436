"""Fault injection for the IMDS simulator: the failures a real IMDS client must survive.

Faults are set globally and may be overridden per VM (only the fields given). They apply
to the IMDS endpoints only, never to the control API. Every random choice comes from one
seeded random.Random, so a run with the same seed and request order fails the same way.

Settings (control-API JSON key, CLI flag: meaning). The Python field names are the
snake_case forms (rate429 -> rate_429, firstCallDelay -> first_call_delay):

- latency, --latency S: seconds added to every IMDS response.
- rate429, --rate-429 R: share of requests answered 429 with Retry-After.
- rate410, --rate-410 R / rate500, --rate-500 R / rate503, --rate-503 R: shares answered
  410, 500 and 503 (all three are documented transient IMDS errors).
- retryAfter, --retry-after S: the Retry-After value sent with 429 (default 1).
- firstCallDelay, --first-call-delay S: the first scheduledevents call after start, or
  after a 24-hour reset, waits this long (real IMDS: up to 2 minutes).
- rateNotJson, --rate-not-json R: share of 200 bodies that are not JSON at all.
- rateNotDocument, --rate-not-document R: share of 200 bodies that are JSON but not a
  document (`[]`, `{"DocumentIncarnation": "x"}`, ...).
- rateNoInstance, --rate-no-instance R: share of instance metadata requests answered 404;
  1 is an IMDS, like some emulators, that serves only scheduledevents.
- drip, --drip S: a 200 body is sent one byte every S seconds (a stalled IMDS).
- rateEndless, --rate-endless R: share of 200 answers whose body never ends (chunked, until
  the client hangs up or 256 MiB went out).

Rates are 0..1; the four status rates together must not exceed 1, nor the two body rates.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

JSON_KEYS = {
    "latency": "latency",
    "rate429": "rate_429",
    "rate410": "rate_410",
    "rate500": "rate_500",
    "rate503": "rate_503",
    "retryAfter": "retry_after",
    "firstCallDelay": "first_call_delay",
    "rateNotJson": "rate_not_json",
    "rateNotDocument": "rate_not_document",
    "rateNoInstance": "rate_no_instance",
    "drip": "drip",
    "rateEndless": "rate_endless",
}
_FIELD_KEYS = {v: k for k, v in JSON_KEYS.items()}
_STATUS_RATES = (("rate_429", 429), ("rate_410", 410), ("rate_500", 500), ("rate_503", 503))

# Bodies a broken IMDS or a middlebox might send: cut-off JSON, an HTML error page, nothing.
NOT_JSON_BODIES = (
    b'{"DocumentIncarnation": 7, "Events": [{"EventId": "',
    b"<html><body><h1>503 Service Unavailable</h1></body></html>",
    b"",
)
# Valid JSON that is not a Scheduled Events document.
NOT_DOCUMENT_BODIES = (b"[]", b'{"DocumentIncarnation": "x"}', b'{"Events": null}', b"null")


class FaultError(ValueError):
    """A fault setting is unknown or out of range; the message names it."""


@dataclass(frozen=True)
class Faults:
    latency: float = 0.0
    rate_429: float = 0.0
    rate_410: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    retry_after: float = 1.0
    first_call_delay: float = 0.0
    rate_not_json: float = 0.0
    rate_not_document: float = 0.0
    rate_no_instance: float = 0.0
    drip: float = 0.0
    rate_endless: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0 or (f.name.startswith("rate_") and value > 1):
                raise FaultError(f"fault {_FIELD_KEYS[f.name]} is out of range: {value}")
        if sum(getattr(self, name) for name, _ in _STATUS_RATES) > 1:
            raise FaultError("rate429 + rate410 + rate500 + rate503 must not exceed 1")
        if self.rate_not_json + self.rate_not_document > 1:
            raise FaultError("rateNotJson + rateNotDocument must not exceed 1")

    def to_json(self) -> dict[str, float]:
        return {_FIELD_KEYS[name]: value for name, value in asdict(self).items()}


def fields_from_json(changes: Mapping[str, Any]) -> dict[str, float]:
    """Control-API keys (camelCase) or field names to field names, checking each value."""
    out: dict[str, float] = {}
    for key, value in changes.items():
        name = JSON_KEYS.get(key, key)
        if name not in _FIELD_KEYS:
            raise FaultError(f"unknown fault {key!r}; known: {', '.join(JSON_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FaultError(f"fault {key} must be a number, not {value!r}")
        out[name] = float(value)
    return out


@dataclass(frozen=True)
class Decision:
    """What to do to one request: wait, answer with an error status, or corrupt the body."""

    delay: float = 0.0
    status: int | None = None
    retry_after: float = 0.0
    corrupt_body: bytes | None = None
    no_instance: bool = False  # instance metadata answers 404, as if the IMDS had none
    drip: float = 0.0  # seconds between the bytes of a 200 body
    endless: bool = False  # a 200 body that never ends


class FaultPlan:
    """Global faults, per-VM overrides and the seeded dice, safe to use from many threads."""

    def __init__(self, faults: Faults | None = None, seed: int = 0) -> None:
        self._global = faults or Faults()
        self._per_vm: dict[str, dict[str, float]] = {}
        # Not for security: reproducible fault sequences are the point.
        self._rng = random.Random(f"faults-{seed}")  # noqa: S311
        self._lock = threading.Lock()

    def set(self, changes: Mapping[str, Any], vm: str | None = None) -> Faults:
        """Merge `changes` into the global faults, or into `vm`'s overrides; returns the result."""
        values = fields_from_json(changes)
        with self._lock:
            if vm is None:
                self._global = replace(self._global, **values)
                return self._global
            merged = {**self._per_vm.get(vm, {}), **values}
            result = replace(self._global, **merged)  # validates before storing
            self._per_vm[vm] = merged
            return result

    def clear(self, vm: str | None = None) -> None:
        """Drop `vm`'s overrides, or (no vm) every fault everywhere."""
        with self._lock:
            if vm is None:
                self._global, self._per_vm = Faults(), {}
            else:
                self._per_vm.pop(vm, None)

    def effective(self, vm: str) -> Faults:
        with self._lock:
            return replace(self._global, **self._per_vm.get(vm, {}))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            per_vm = {
                vm: {_FIELD_KEYS[k]: v for k, v in o.items()} for vm, o in self._per_vm.items()
            }
            return {"global": self._global.to_json(), "perVm": per_vm}

    def decide(self, vm: str, first_call: bool) -> Decision:
        """Roll the dice for one IMDS request from `vm`."""
        faults = self.effective(vm)
        delay = faults.latency + (faults.first_call_delay if first_call else 0.0)
        with self._lock:
            status = self._pick_status(faults, self._rng.random())
            body = self._pick_body(faults, self._rng.random())
            no_instance = self._rng.random() < faults.rate_no_instance
            endless = self._rng.random() < faults.rate_endless
        return Decision(delay, status, faults.retry_after, body, no_instance, faults.drip, endless)

    def _pick_status(self, faults: Faults, roll: float) -> int | None:
        edge = 0.0
        for name, status in _STATUS_RATES:
            edge += getattr(faults, name)
            if roll < edge:
                return status
        return None

    def _pick_body(self, faults: Faults, roll: float) -> bytes | None:
        if roll < faults.rate_not_json:
            return self._rng.choice(NOT_JSON_BODIES)
        if roll < faults.rate_not_json + faults.rate_not_document:
            return self._rng.choice(NOT_DOCUMENT_BODIES)
        return None

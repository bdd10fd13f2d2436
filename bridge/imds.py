"""The IMDS edge: HTTP to the Instance Metadata Service, mapped onto the three failure kinds.

One keep-alive session; `Metadata: true` on every call; never through a proxy and never
following a redirect (IMDS answers only on the link-local address, and a redirect means
something other than IMDS answered); never more than `max_rps` requests a second.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import requests

from bridge.records import VmIdentity
from bridge.retry import PermanentError, RetryableError, ThrottledError, parse_retry_after

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://169.254.169.254"
EVENTS_PATH = "/metadata/scheduledevents"
INSTANCE_PATH = "/metadata/instance"
INSTANCE_API_VERSION = "2021-02-01"
# Documented transient answers; everything else but 200 is permanent for that request.
TRANSIENT = frozenset({410, 500, 502, 503, 504})
EXCERPT = 200


def excerpt(body: bytes | str, limit: int = EXCERPT) -> str:
    """A short, single-line view of a body for a log line."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


class RateLimiter:
    """Spaces calls at least 1/rate seconds apart, across threads."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._spacing = 1.0 / rate
        self._clock, self._sleep = clock, sleep
        self._next = 0.0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            now = self._clock()
            wait = self._next - now
            self._next = max(now, self._next) + self._spacing
        if wait > 0:
            self._sleep(wait)


class ImdsClient:
    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_version: str = "2020-07-01",
        *,
        timeout: float = 10.0,
        first_call_timeout: float = 120.0,
        max_rps: float = 5.0,
        session: requests.Session | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_version = api_version
        self._timeout = timeout
        self._first_timeout = first_call_timeout
        # Per endpoint: each one's first call after IMDS idled may be the slow one.
        self._answered: set[str] = set()
        self._limiter = RateLimiter(max_rps)
        self._session = session or requests.Session()
        # IMDS must be reached directly: an HTTP(S)_PROXY in the environment would intercept it.
        self._session.trust_env = False
        self._session.headers.update({"Metadata": "true", "User-Agent": "se-bridge"})

    @property
    def events_url(self) -> str:
        return self.base_url + EVENTS_PATH

    def scheduled_events(self) -> bytes:
        """The raw body of the Scheduled Events document; raises a bridge.retry failure."""
        return self._call("GET", EVENTS_PATH, self.api_version).content

    def start_events(self, event_ids: list[str]) -> int:
        """Approve events (POST StartRequests); the HTTP status IMDS answered with."""
        body = {"StartRequests": [{"EventId": event_id} for event_id in event_ids]}
        return self._call("POST", EVENTS_PATH, self.api_version, body).status_code

    def instance_metadata(self) -> dict[str, Any]:
        response = self._call("GET", INSTANCE_PATH, INSTANCE_API_VERSION)
        try:
            data = response.json()
        except (ValueError, RecursionError) as err:  # RecursionError: nested too deeply
            raise RetryableError(
                f"instance metadata is not JSON: {excerpt(response.content)!r}"
            ) from err
        if not isinstance(data, dict):
            raise RetryableError(
                f"instance metadata is not an object: {excerpt(response.content)!r}"
            )
        return data

    def close(self) -> None:
        self._session.close()

    def _call(self, method: str, path: str, version: str, body: object = None) -> requests.Response:
        self._limiter.acquire()
        read_timeout = self._timeout if path in self._answered else self._first_timeout
        url = self.base_url + path
        try:
            response = self._session.request(
                method,
                url,
                params={"api-version": version},
                json=body,
                timeout=(min(5.0, read_timeout), read_timeout),
                allow_redirects=False,
            )
        except requests.RequestException as err:
            raise RetryableError(f"{method} {url} failed: {type(err).__name__}: {err}") from err
        self._answered.add(path)
        _raise_for(response, method, url)
        return response


def _raise_for(response: requests.Response, method: str, url: str) -> None:
    status = response.status_code
    if status == 200:
        return
    what = f"IMDS answered {status} to {method} {url}: {excerpt(response.content)!r}"
    if status == 429:
        raise ThrottledError(what, parse_retry_after(response.headers.get("Retry-After")))
    if status in TRANSIENT:
        raise RetryableError(what)
    raise PermanentError(what)


# A real answer of /metadata/instance?api-version=2021-02-01 (abridged):
#   {"compute": {"vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6", "name": "web_3",
#     "resourceId": "/subscriptions/8d10da13-.../resourceGroups/rg/providers/
#                    Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/3",
#     "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d", "resourceGroupName": "rg",
#     "location": "westeurope", "zone": "1", "vmScaleSetName": "web",
#     "platformFaultDomain": "0", "platformUpdateDomain": "3",
#     "tagsList": [{"name": "role", "value": "frontend"}], ...},
#    "network": {...}}
# IMDS sends the domains as strings and empty strings for absent values.
def parse_instance(raw: Mapping[str, Any]) -> VmIdentity:
    """VmIdentity from an instance metadata document; unknown or empty fields become None."""
    compute = raw.get("compute")
    if not isinstance(compute, Mapping):
        return VmIdentity()
    return VmIdentity(
        vm_id=_text(compute.get("vmId")),
        vm_name=_text(compute.get("name")),
        resource_id=_text(compute.get("resourceId")),
        subscription_id=_text(compute.get("subscriptionId")),
        resource_group=_text(compute.get("resourceGroupName")),
        location=_text(compute.get("location")),
        zone=_text(compute.get("zone")),
        vm_scale_set_name=_text(compute.get("vmScaleSetName")),
        platform_fault_domain=_number(compute.get("platformFaultDomain")),
        platform_update_domain=_number(compute.get("platformUpdateDomain")),
        tags=_tags(compute.get("tagsList"), compute.get("tags")),
    )


def _text(value: object) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip()
    return text or None


# ASCII digits only, and few enough for int(): str.isdigit() also accepts "²", and
# lstrip("-") let "--5" through, which int() refuses with a ValueError.
_WHOLE = re.compile(r"-?[0-9]{1,30}")


def _number(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = _text(value)
    return int(text) if text is not None and _WHOLE.fullmatch(text) else None


def _tags(tags_list: object, tags: object) -> tuple[tuple[str, str], ...]:
    """tagsList when present; the older "k1:v1;k2:v2" string otherwise."""
    if isinstance(tags_list, list):
        pairs = [
            (str(t.get("name", "")), str(t.get("value", "")))
            for t in tags_list
            if isinstance(t, Mapping)
        ]
        return tuple(p for p in pairs if p[0])
    if isinstance(tags, str) and tags:
        pairs = [part.partition(":")[::2] for part in tags.split(";")]
        return tuple((k, v) for k, v in pairs if k)
    return ()

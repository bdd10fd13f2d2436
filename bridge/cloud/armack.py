"""ARM's acknowledge of scheduled events (preview): approving an event from outside the VM, as
an IMDS StartRequests POST does from inside it, with an Entra ID token (issue 36).

Raw REST, because the SDK support (azure-mgmt-maintenance) is beta only. The operations are
Microsoft.Maintenance's, on the compute resource the event belongs to (a scale set, an
availability set or a VM); api-version 2025-10-01-preview, the first that has the list form
(2023-10-01-preview has the single one only), and the one the Azure CLI's and .NET SDK's list
acknowledge default to. Reference: https://learn.microsoft.com/azure/virtual-machines/
scheduled-events-azure-resource-graph ("Acknowledging with the Maintenance Resource Provider
Endpoint"), the REST spec's examples (azure-rest-api-specs, specification/maintenance,
ScheduledEvents_Acknowledge.json, ScheduledEvents_AcknowledgeList.json), and
https://learn.microsoft.com/cli/azure/maintenance/scheduledevents. The caller needs
Microsoft.Maintenance/scheduledevents/acknowledge/action on the resource: the built-in role
Scheduled Events Contributor (b67fe603-310e-4889-b9ee-8257d09d353d) grants that and reading
VMs, scale sets and availability sets, nothing else.

A sample exchange, one event (the list form takes {"value": [ids]} at .../scheduledevents):

    POST https://management.azure.com/subscriptions/8d5f.../resourcegroups/rg-web/providers/
         Microsoft.Compute/virtualMachineScaleSets/web/providers/Microsoft.Maintenance/
         scheduledevents/c7061bac-afdc-4513-b24b-aa5f13a16123/acknowledge
         ?api-version=2025-10-01-preview
    Authorization: Bearer eyJ0eXAi...

    200 {"value": "Successfully Approved"}

and a list answered in part (HTTP 207):

    {"error": {"code": "MultiStatusResponse", "message": "The operation returned different
     statuses for the Scheduled Events. Review each event's result for details.",
     "details": [{"target": "11111111-...", "code": "NotFound",
                  "message": "Scheduled event not found."}]}}

Failure kinds (bridge.retry): 429 is a ThrottledError with its Retry-After, 5xx and lost
connections RetryableErrors; both are retried here a few times with the project's backoff
(Retry-After honoured, each wait and the whole bounded), then handed to the caller's retry. A
404 or 409 refuses that event (it is over, or not opted in: the caller's `refused`); 401, 403
and other 4xx are PermanentErrors naming what to grant or fix. Tokens are never logged.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import requests

from bridge.retry import Backoff, PermanentError, RetryableError, ThrottledError, parse_retry_after

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

log = logging.getLogger(__name__)
_T = TypeVar("_T")

API_VERSION = "2025-10-01-preview"
ENDPOINT = "https://management.azure.com"
SCOPE = "https://management.azure.com/.default"
ROLE = "Scheduled Events Contributor"
MAX_IDS = 100  # event ids in one list acknowledge
TIMEOUT = 10.0  # seconds to connect, and to wait for each read
ATTEMPTS = 4  # tries of one acknowledge before the caller's retry takes over
MAX_WAIT = 10.0  # the longest wait between two tries, whatever Retry-After says
MAX_BODY = 64 * 1024  # an answer is read at most this far
_COMPUTE = re.compile(
    r"/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"(?:virtualmachines|virtualmachinescalesets|availabilitysets)/[^/]+",
    re.IGNORECASE,
)
_GUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_REFUSALS = (404, 409)


@dataclass(frozen=True)
class Acknowledged:
    """What ARM said of each event id: approved, or refused with its code and message."""

    approved: tuple[str, ...]
    refused: dict[str, str] = field(default_factory=dict)


class ArmCaller:
    """Calls to one ARM endpoint as one identity: a token per call, an answer read at most
    MAX_BODY far, and a 429 (its Retry-After, capped) or a 5xx tried again with the one
    jittered backoff (bridge.retry). The actions (acknowledge here, a patch run's cancel in
    bridge.cloud.applyupdates) say what each other status means."""

    def __init__(
        self,
        credential: TokenCredential,
        endpoint: str = ENDPOINT,
        *,
        attempts: int = ATTEMPTS,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._credential = credential
        self.endpoint = endpoint.rstrip("/")
        self._attempts = attempts
        self._backoff = backoff or Backoff(initial=0.5, maximum=MAX_WAIT)
        self._sleep = sleep
        self._session = requests.Session()
        self.throttled = 0  # 429s answered so far (the metrics)

    def close(self) -> None:
        self._session.close()

    def retried(self, what: str, call: Callable[[], _T]) -> _T:
        """`call`'s answer, tried up to `attempts` times while it raises RetryableError."""
        self._backoff.reset()
        for attempt in range(1, self._attempts + 1):
            try:
                return call()
            except RetryableError as err:
                if attempt == self._attempts:
                    raise
                wait = self._backoff.delay_for(err)
                log.debug("ARM's %s: %s; trying again in %.1f s", what, err, wait)
                self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def send(
        self, method: str, url: str, body: dict[str, Any] | None, *, api_version: str
    ) -> tuple[int, Any, str]:
        """ARM's status, its decoded answer (None when not JSON) and its words for them
        (`said_of`); ThrottledError on a 429, RetryableError on a 5xx or no answer."""
        token = self._credential.get_token(SCOPE).token
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        try:
            response = self._session.request(
                method,
                url,
                params={"api-version": api_version},
                json=body,
                headers=headers,
                timeout=TIMEOUT,
                stream=True,
            )
            with response:
                text = response.raw.read(MAX_BODY + 1, decode_content=True)
        except requests.RequestException as err:
            raise RetryableError(f"ARM did not answer: {type(err).__name__}") from None
        status = response.status_code
        answer = answer_of(text)
        said = said_of(status, answer)
        if status == 429:
            self.throttled += 1
            raise ThrottledError(said, parse_retry_after(response.headers.get("Retry-After")))
        if status >= 500:
            raise RetryableError(said)
        return status, answer, said


class ArmAcknowledge(ArmCaller):
    """Acknowledges scheduled events on one ARM endpoint, as one identity."""

    def acknowledge(self, resource_id: str, event_ids: Sequence[str]) -> Acknowledged:
        """Approve `event_ids` (GUIDs) of the compute resource `resource_id`; one id takes the
        single form, several the list form."""
        if not _COMPUTE.fullmatch(resource_id):
            raise PermanentError(f"{resource_id!r} is not a VM, scale set or availability set id")
        ids = list(dict.fromkeys(event_ids))
        if not 1 <= len(ids) <= MAX_IDS or not all(_GUID.fullmatch(e) for e in ids):
            raise PermanentError(f"ARM acknowledges 1 to {MAX_IDS} event GUIDs at once: {ids!r}")
        base = f"{self.endpoint}{resource_id}/providers/Microsoft.Maintenance/scheduledevents"
        if len(ids) == 1:
            url, body = f"{base}/{ids[0]}/acknowledge", None
        else:
            url, body = base, {"value": ids}
        return self.retried(f"acknowledge of {ids}", lambda: self._post(url, body, ids))

    def _post(self, url: str, body: dict[str, Any] | None, ids: list[str]) -> Acknowledged:
        status, answer, said = self.send("POST", url, body, api_version=API_VERSION)
        if status == 200:
            return Acknowledged(tuple(ids))
        if status == 207:
            refused = _details(answer, ids)
            return Acknowledged(tuple(e for e in ids if e not in refused), refused)
        if status in _REFUSALS and len(ids) == 1:
            return Acknowledged((), {ids[0]: said})
        if status in (401, 403):
            raise PermanentError(
                f"{said}: the consumer's identity needs the role {ROLE} on the "
                "VMs' resource group (infra/ grants it with eventGridSource "
                "and armAcknowledge)"
            )
        raise PermanentError(said)


def answer_of(text: bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def said_of(status: int, answer: Any) -> str:
    """`HTTP 404 NotFound: Scheduled event not found.` (ARM's error code and message)."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return f"HTTP {status}"
    code, message = str(error.get("code", ""))[:100], str(error.get("message", ""))[:300]
    return f"HTTP {status} {code}: {message}".rstrip(": ")


def _details(answer: Any, ids: list[str]) -> dict[str, str]:
    """Of a 207, the ids refused and why; an id ARM's details do not name was approved."""
    error = answer.get("error") if isinstance(answer, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    wanted = {e.lower(): e for e in ids}
    refused: dict[str, str] = {}
    for detail in details if isinstance(details, list) else []:
        if not isinstance(detail, dict):
            continue
        target = wanted.get(str(detail.get("target", "")).lower())
        if target is not None:
            refused[target] = f"{detail.get('code', '')}: {detail.get('message', '')}"[:400]
    if not refused:
        # A 207 that names nobody says too little to count anything approved.
        raise RetryableError("ARM answered 207 without naming the events it refused")
    return refused

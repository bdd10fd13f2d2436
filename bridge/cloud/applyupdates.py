"""Cancelling a patch run of Azure Update Manager (issue 40, item 1): the maintenance RP's
applyUpdates with status Cancel, addressed to the run of a maintenance configuration, with the
consumer's Entra ID token. The strongest action se-bridge takes on Azure: the caller
(bridge.consumer.patchruns) takes it only by an explicit rule and never after the cut-off.

Raw REST, as bridge.cloud.armack does (the SDK, azure-mgmt-maintenance, is not a dependency).
References: the REST reference "Apply Updates - Create Or Update Or Cancel"
(learn.microsoft.com/rest/api/maintenance/apply-updates/create-or-update-or-cancel), the REST
spec's example ApplyUpdates_CreateOrUpdate_CancelMaintenance.json (azure-rest-api-specs,
specification/maintenance/resource-manager/Microsoft.Maintenance/preview/2023-10-01-preview/
examples), and Update Manager's "cancel a schedule run before it begins" (articles/
update-manager/manage-pre-post-events.md: "the cancelation API in your pre-event must get
triggered at least 10 minutes before the schedule maintenance configuration start time";
"invoking a cancellation API ... will cancel the schedule run and not the entire schedule").
The run's name is the last segment of the pre-event's correlationId (yyyyMMddHHmmss). Only
preview api-versions have the Cancel status (patchruns.api_version).

A sample exchange (the spec's example; `resourceId` is the configuration's):

    PUT https://management.azure.com/subscriptions/5b4b650e-.../resourcegroups/examplerg/
        providers/Microsoft.Maintenance/maintenanceConfigurations/maintenanceConfig1/providers/
        Microsoft.Maintenance/applyUpdates/20230901121200?api-version=2023-10-01-preview
    Authorization: Bearer eyJ0eXAi...
    {"properties": {"status": "Cancel"}}

    200 {"id": ".../applyupdates/20230901121200", "name": "maintenanceConfig1",
         "type": "Microsoft.Maintenance/applyUpdates",
         "properties": {"status": "Cancelled", "resourceId": ".../maintenanceconfig1"}}

The PUT is idempotent: cancelling a cancelled run answers the same. Failure kinds
(bridge.retry), as armack's: 429 a ThrottledError with its Retry-After and 5xx a
RetryableError, both retried a few times with the project's backoff, each wait bounded; a 404
or 409 refuses the cancel (no such run, or Azure will not cancel it now: past the cut-off or
started); 401 and 403 are PermanentErrors naming the role to grant. Tokens are never logged.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import requests

from bridge.cloud.armack import (
    ATTEMPTS,
    ENDPOINT,
    MAX_BODY,
    MAX_WAIT,
    SCOPE,
    TIMEOUT,
    answer_of,
    said_of,
)
from bridge.retry import Backoff, PermanentError, RetryableError, ThrottledError, parse_retry_after

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential

log = logging.getLogger(__name__)

API_VERSION = "2023-10-01-preview"
ROLE = "se-bridge patch run canceller (infra/, patchRunCancel)"
_CONFIG = re.compile(
    r"/subscriptions/[0-9a-f-]{36}/resourcegroups/[-\w._()]{1,90}/providers/"
    r"microsoft\.maintenance/maintenanceconfigurations/[-\w._]{1,128}",
    re.IGNORECASE,
)
_RUN = re.compile(r"\d{14}")


@dataclass(frozen=True)
class Cancelled:
    """What ARM said: the run cancelled (`done`), or refused with why."""

    done: bool
    said: str  # ARM's status ("Cancelled"), or its error


class ArmCancel:
    """Cancels patch runs on one ARM endpoint, as one identity."""

    def __init__(
        self,
        credential: TokenCredential,
        endpoint: str = ENDPOINT,
        *,
        api_version: str = API_VERSION,
        attempts: int = ATTEMPTS,
        backoff: Backoff | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._credential = credential
        self.endpoint = endpoint.rstrip("/")
        self.api_version = api_version
        self._attempts = attempts
        self._backoff = backoff or Backoff(initial=0.5, maximum=MAX_WAIT)
        self._sleep = sleep
        self._session = requests.Session()
        self.throttled = 0  # 429s answered so far (the metrics)

    def close(self) -> None:
        self._session.close()

    def cancel(self, configuration_id: str, run: str) -> Cancelled:
        """Cancel the run `run` (yyyyMMddHHmmss) of the maintenance configuration."""
        if not _CONFIG.fullmatch(configuration_id) or not _RUN.fullmatch(run):
            raise PermanentError(
                f"{configuration_id!r} / {run!r} is not a maintenance configuration's run"
            )
        url = (
            f"{self.endpoint}{configuration_id}/providers/Microsoft.Maintenance/applyUpdates/{run}"
        )
        self._backoff.reset()
        for attempt in range(1, self._attempts + 1):
            try:
                return self._put(url)
            except RetryableError as err:
                if attempt == self._attempts:
                    raise
                wait = self._backoff.delay_for(err)
                log.debug("ARM's cancel of run %s: %s; trying again in %.1f s", run, err, wait)
                self._sleep(wait)
        raise AssertionError("unreachable")  # pragma: no cover

    def _put(self, url: str) -> Cancelled:
        token = self._credential.get_token(SCOPE).token
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        try:
            response = self._session.put(
                url,
                params={"api-version": self.api_version},
                json={"properties": {"status": "Cancel"}},
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
        if status in (200, 201):
            return Cancelled(True, _status(answer) or "Cancelled")
        if status in (404, 409):
            return Cancelled(False, said)
        if status in (401, 403):
            raise PermanentError(
                f"{said}: the consumer's identity needs Microsoft.Maintenance/applyUpdates/"
                f"write on the maintenance configuration ({ROLE})"
            )
        raise PermanentError(said)


def _status(answer: Any) -> str | None:
    properties = answer.get("properties") if isinstance(answer, dict) else None
    status = properties.get("status") if isinstance(properties, dict) else None
    return str(status)[:40] if status else None

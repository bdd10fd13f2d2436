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

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.cloud.armack import ATTEMPTS, ENDPOINT, ArmCaller
from bridge.retry import Backoff, PermanentError

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential


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


class ArmCancel(ArmCaller):
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
        super().__init__(credential, endpoint, attempts=attempts, backoff=backoff, sleep=sleep)
        self.api_version = api_version

    def cancel(self, configuration_id: str, run: str) -> Cancelled:
        """Cancel the run `run` (yyyyMMddHHmmss) of the maintenance configuration."""
        if not _CONFIG.fullmatch(configuration_id) or not _RUN.fullmatch(run):
            raise PermanentError(
                f"{configuration_id!r} / {run!r} is not a maintenance configuration's run"
            )
        url = (
            f"{self.endpoint}{configuration_id}/providers/Microsoft.Maintenance/applyUpdates/{run}"
        )
        return self.retried(f"cancel of run {run}", lambda: self._put(url))

    def _put(self, url: str) -> Cancelled:
        body = {"properties": {"status": "Cancel"}}
        status, answer, said = self.send("PUT", url, body, api_version=self.api_version)
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

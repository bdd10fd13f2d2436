"""Azure Storage failures (tables, queues) as the three kinds bridge.retry knows.

One mapping for both services, so a throttled table and a throttled queue back off alike.
What the SDK raises, and what it becomes:

    HttpResponseError(status_code=503, error_code="ServerBusy", Retry-After: 3)
        -> ThrottledError("503 ServerBusy from queue se-bridge-1b1f... at https://...", 3.0)
    HttpResponseError(status_code=403, error_code="AuthorizationPermissionMismatch")
        -> PermanentError("403 AuthorizationPermissionMismatch from ...: grant ... the role ...")
    ServiceRequestError("Connection refused")  -> RetryableError("cannot reach ...: ...")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bridge.cloud import advice
from bridge.redact import describe
from bridge.retry import (
    DeliveryError,
    PermanentError,
    RetryableError,
    ThrottledError,
    parse_retry_after,
)


def status_of(err: BaseException) -> int | None:
    status = getattr(err, "status_code", None)
    return status if isinstance(status, int) else None


def error_code(err: BaseException) -> str:
    """The service's x-ms-error-code as plain text (the SDK may hand an enum member)."""
    code = getattr(err, "error_code", None)
    return str(getattr(code, "value", code) or "")


def classify(
    err: BaseException, *, target: str, auth_advice: str, not_found: str = ""
) -> DeliveryError:
    """`err` from a call on `target` (named without secrets) as a DeliveryError.

    `auth_advice` says what to grant or fix on 401/403; `not_found` what to check on 404.
    """
    if isinstance(err, DeliveryError):
        return err
    status = status_of(err)
    if status is not None:
        return _for_status(status, err, target=target, auth_advice=auth_advice, not_found=not_found)
    name = type(err).__name__
    if name in ("ClientAuthenticationError", "CredentialUnavailableError"):
        # No status: the credential itself gave no token.
        return PermanentError(f"no token for {target}; {advice.CREDENTIAL_ADVICE}")
    return RetryableError(f"cannot reach {target}: {describe(err, with_type=True)}")


def _for_status(
    status: int, err: BaseException, *, target: str, auth_advice: str, not_found: str
) -> DeliveryError:
    code = error_code(err)
    said = f"{status} {code}".strip()
    headers: Mapping[str, Any] = getattr(getattr(err, "response", None), "headers", None) or {}
    retry_after = parse_retry_after(headers.get("Retry-After"))
    # 503 ServerBusy is Storage throttling an account or partition; another 503 is an outage,
    # unless the service says when to come back.
    if status == 429 or (status == 503 and (code == "ServerBusy" or retry_after is not None)):
        return ThrottledError(f"{said} from {target}: the account is busy", retry_after)
    if status in (401, 403):
        # The service's text quotes the request signature; the code says enough.
        return PermanentError(f"{said} from {target}: {auth_advice}")
    # 409 here is a table or queue being deleted (ETag conflicts never reach this point).
    if status >= 500 or status in (408, 409):
        return RetryableError(f"{said} from {target}: {describe(err)}")
    if status == 404 and not_found:
        return PermanentError(f"{said} from {target}: {not_found} ({describe(err)})")
    return PermanentError(f"{said} from {target}: check the storage settings ({describe(err)})")

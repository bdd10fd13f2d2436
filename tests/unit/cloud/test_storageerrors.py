"""Storage failures map onto the three kinds of bridge.retry the same for tables and queues."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
)

from bridge.cloud import storageerrors
from bridge.retry import DeliveryError, PermanentError, RetryableError, ThrottledError

TARGET = "queue se-bridge-1b1f at https://acct.queue.core.windows.net"


class Response:
    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status_code = status
        self.headers = headers
        self.reason = "reason"

    def text(self) -> str:
        return "sig=SECRET-SIGNATURE"


def failure(status: int, code: str = "", **headers: str) -> HttpResponseError:
    response: Any = Response(status, headers)
    err = HttpResponseError(message=f"{code} sig=SECRET-SIGNATURE", response=response)
    err.error_code = code  # type: ignore[attr-defined]  # the Storage SDKs set it so
    return err


def classify(err: BaseException, **kw: Any) -> DeliveryError:
    return storageerrors.classify(err, target=TARGET, auth_advice="grant the role", **kw)


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (429, "", ThrottledError),
        (503, "ServerBusy", ThrottledError),
        (503, "ServiceUnavailable", RetryableError),
        (500, "InternalError", RetryableError),
        (408, "", RetryableError),
        (409, "QueueBeingDeleted", RetryableError),
        (403, "AuthorizationPermissionMismatch", PermanentError),
        (401, "", PermanentError),
        (400, "InvalidXmlDocument", PermanentError),
        (404, "ResourceNotFound", PermanentError),
    ],
)
def test_statuses_map_to_their_kind(status: int, code: str, kind: type[DeliveryError]) -> None:
    got = classify(failure(status, code))
    assert type(got) is kind
    assert str(got).startswith(f"{status} {code}".strip() + f" from {TARGET}")


def test_throttling_honours_retry_after() -> None:
    got = classify(failure(503, "ServerBusy", **{"Retry-After": "7"}))
    assert isinstance(got, ThrottledError)
    assert got.retry_after == 7
    assert isinstance(classify(failure(503, "Scripted", **{"Retry-After": "2"})), ThrottledError)


def test_refused_credentials_give_advice_and_never_the_signature() -> None:
    got = classify(failure(403, "AuthenticationFailed"))
    assert "grant the role" in str(got)
    assert "SECRET" not in str(got)


def test_not_found_advice_only_where_given() -> None:
    assert "check storage.account" in str(classify(failure(404), not_found="check storage.account"))
    assert "check the storage settings" in str(classify(failure(404)))


def test_no_token_and_no_connection() -> None:
    assert isinstance(classify(ClientAuthenticationError("no token")), PermanentError)
    unreachable = classify(ServiceRequestError("Connection refused"))
    assert isinstance(unreachable, RetryableError)
    assert "cannot reach" in str(unreachable)
    already = RetryableError("kept")
    assert classify(already) is already

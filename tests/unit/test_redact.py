"""describe(): what a sink error looks like in logs and status."""

from __future__ import annotations

import pytest

from bridge.redact import MAX_ERROR_CHARS, describe
from bridge.retry import RetryableError


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;"
            "SharedAccessKey=abc+/def=",
            "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=***",
        ),
        (
            "GET https://acct.queue.core.windows.net/q?sv=2021&sig=Zm9v%2Bbar&se=1 failed",
            "GET https://acct.queue.core.windows.net/q?sv=2021&sig=***&se=1 failed",
        ),
        (
            "401 with Authorization: Bearer eyJ0eXAi.eyJhdWQi.sig",
            "401 with Authorization: Bearer ***",
        ),
        ('{"password": "hunter2", "user": "x"}', '{"password": ***, "user": "x"}'),
        ("AccountKey=a1b2==;BlobEndpoint=http://x", "AccountKey=***;BlobEndpoint=http://x"),
        ("plain 503 Service Unavailable", "plain 503 Service Unavailable"),
    ],
)
def test_secrets_are_masked(message: str, expected: str) -> None:
    assert describe(RetryableError(message)) == expected


def test_type_is_named_on_request_and_empty_messages_named_by_type() -> None:
    assert describe(KeyError("Zone"), with_type=True) == "KeyError: 'Zone'"
    assert describe(TimeoutError()) == "TimeoutError"


def test_long_and_multiline_messages_are_one_bounded_line() -> None:
    text = describe(RuntimeError("line one\nline two\t" + "x" * 2000))
    assert text.startswith("line one line two x")
    assert len(text) == MAX_ERROR_CHARS
    assert text.endswith("...")

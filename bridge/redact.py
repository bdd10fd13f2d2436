"""Keeping secrets out of logs, errors and status: connection strings, SAS signatures, tokens."""

from __future__ import annotations

import re
import unicodedata

MAX_ERROR_CHARS = 500

# Connection strings, SAS URLs and auth headers end up in SDK error messages.
_SECRETS = (
    re.compile(
        r"(?i)\b(sharedaccesskey|accountkey|sig|password|secret|client_secret|token|apikey)"
        r"([\"']?\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^;&\s,\"']+)"
    ),
    re.compile(r"(?i)\b(bearer|basic)(\s+)([A-Za-z0-9._~+/=-]+)"),
)


def describe(error: BaseException, *, with_type: bool = False) -> str:
    """A one-line, secret-free, bounded description of `error` for logs and status."""
    text = str(error) or type(error).__name__
    if with_type:
        text = f"{type(error).__name__}: {text}"
    text = " ".join(redact(text).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def redact(text: str) -> str:
    """`text` with every secret-looking value replaced by ***."""
    for pattern in _SECRETS:
        text = pattern.sub(r"\1\2***", text)
    return text


def printable(text: str) -> str:
    """`text` with control and format characters (escape sequences, line breaks, bidi
    overrides) shown as escapes, so that it prints as it is and no more."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")
        else ch
        for ch in text
    )

"""An IMDS transport over a caller's requests.Session, for tests that answer with canned
responses: the agent itself talks to IMDS over plain http.client (bridge.agent.imds), so
requests is imported here, by the tests, and never at the agent's start."""

from __future__ import annotations

import json

import requests

from bridge.agent.imds import CONNECT_TIMEOUT, MAX_OTHER_BODY, Answer, AnswerTooLarge


class SessionTransport:
    """A caller's requests.Session (tests inject canned ones), used as the old client did."""

    def __init__(self, base_url: str, session: requests.Session) -> None:
        self._base_url = base_url.rstrip("/")
        self._session = session
        # IMDS must be reached directly: an HTTP(S)_PROXY in the environment would intercept it.
        self._session.trust_env = False
        self._session.headers.update({"Metadata": "true", "User-Agent": "se-bridge"})

    def request(
        self,
        method: str,
        path: str,
        *,
        version: str,
        body: bytes | None,
        read_timeout: float,
        limit: int = MAX_OTHER_BODY,
    ) -> Answer:
        response = self._session.request(
            method,
            self._base_url + path,
            params={"api-version": version},
            json=None if body is None else json.loads(body),
            timeout=(min(CONNECT_TIMEOUT, read_timeout), read_timeout),
            allow_redirects=False,
        )
        if len(response.content) > limit:
            raise AnswerTooLarge(f"IMDS sent more than {limit} bytes: refused")
        return Answer(response.status_code, response.headers.get("Retry-After"), response.content)

    def close(self) -> None:
        self._session.close()

"""IMDS edge: instance metadata parsing, the rate limiter, and status codes onto failure kinds."""

from __future__ import annotations

import socket
from typing import Any, cast

import pytest
import requests

from bridge.agent import imds
from bridge.records import VmIdentity
from bridge.retry import PermanentError, RetryableError, ThrottledError
from tests.doubles.imds_transport import SessionTransport

# A real /metadata/instance?api-version=2021-02-01 answer for a uniform scale-set instance,
# abridged to the fields the agent reads, with IMDS's string-typed domains.
INSTANCE = {
    "compute": {
        "vmId": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
        "name": "web_3",
        "resourceId": "/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/rg"
        "/providers/Microsoft.Compute/virtualMachineScaleSets/web/virtualMachines/3",
        "subscriptionId": "8d10da13-8125-4ba9-a717-bf7490507b3d",
        "resourceGroupName": "rg",
        "location": "westeurope",
        "zone": "",
        "vmScaleSetName": "web",
        "platformFaultDomain": "0",
        "platformUpdateDomain": "3",
        "tagsList": [{"name": "role", "value": "frontend"}],
    },
    "network": {"interface": []},
}


def test_parse_instance() -> None:
    identity = imds.parse_instance(INSTANCE)
    assert identity.vm_id == "02aab8a4-74ef-476e-8182-f6d2ba4166a6"
    assert (identity.vm_name, identity.vm_scale_set_name, identity.zone) == ("web_3", "web", None)
    assert (identity.platform_fault_domain, identity.platform_update_domain) == (0, 3)
    assert identity.tags == (("role", "frontend"),)


@pytest.mark.parametrize(
    "raw",
    [{}, {"compute": []}, {"compute": {"platformFaultDomain": "x", "name": {"a": 1}}}],
)
def test_parse_instance_tolerates_junk(raw: dict[str, Any]) -> None:
    identity = imds.parse_instance(raw)
    assert identity.vm_name is None
    assert identity.platform_fault_domain is None


@pytest.mark.parametrize("vm_id", ["x/../y", "vm-1", "02aab8a4-74ef-476e-8182-f6d2ba4166a6/..", ""])
def test_a_vm_id_that_is_not_a_guid_is_no_vm_id(vm_id: str) -> None:
    # The consumer refuses records whose VmId is not a GUID, and a VmId names a channel.
    compute = dict(cast(dict[str, Any], INSTANCE["compute"]), vmId=vm_id)
    identity = imds.parse_instance({"compute": compute})
    assert identity.vm_id is None
    assert identity.vm_name == "web_3"


def test_old_style_tags_string() -> None:
    identity = imds.parse_instance({"compute": {"tags": "role:frontend;tier:1"}})
    assert identity.tags == (("role", "frontend"), ("tier", "1"))
    assert identity != VmIdentity()


def limited(rate: float) -> tuple[imds.RateLimiter, list[float], list[float]]:
    """A limiter on a hand-moved clock: (limiter, clock, sleeps)."""
    clock = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    return imds.RateLimiter(rate, clock=lambda: clock[0], sleep=sleep), clock, slept


def test_rate_limiter_lets_a_burst_through_and_holds_the_sixth_call_of_a_second() -> None:
    limiter, clock, slept = limited(5.0)
    for _ in range(3):  # an approval: poll, fresh read, POST
        limiter.acquire()
    assert slept == []
    clock[0] += 0.5
    limiter.acquire()
    limiter.acquire()
    assert slept == []
    limiter.acquire()  # the sixth within one second: waits for the first to leave the window
    assert slept == pytest.approx([0.5])
    limiter.acquire()
    limiter.acquire()  # the calls of 100.0 leave the window at 101.0: two more go at once
    assert slept == pytest.approx([0.5])
    limiter.acquire()  # five since 100.5: waits for 101.5
    assert slept == pytest.approx([0.5, 0.5])


def test_rate_limiter_never_allows_more_than_rate_calls_in_any_second() -> None:
    limiter, clock, _slept = limited(5.0)
    times = []
    for step in [0.0, 0.05, 0.3, 0.0, 0.0, 0.0, 0.7, 0.0, 0.0, 0.1] * 5:
        clock[0] += step
        limiter.acquire()
        times.append(clock[0])
    for i, start in enumerate(times):
        assert sum(1 for t in times[i:] if t < start + 1.0 - 1e-9) <= 5


def test_rate_limiter_below_one_call_a_second_spaces_calls() -> None:
    limiter, _clock, slept = limited(0.5)
    for _ in range(3):
        limiter.acquire()
    assert slept == pytest.approx([2.0, 2.0])


def response(status: int, body: bytes = b"{}", headers: dict[str, str] | None = None) -> Any:
    r = requests.Response()
    r.status_code = status
    r._content = body
    r.headers.update(headers or {})
    return r


class FakeSession(requests.Session):
    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> Any:  # type: ignore[override]
        self.calls.append({"method": method, "url": url, **kwargs})
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def over(session: requests.Session) -> SessionTransport:
    return SessionTransport("http://imds.test", session)


BAD_HEADER = b'{ "error": "Bad request: . Required metadata header not specified" }'


@pytest.mark.parametrize(
    ("answer", "kind", "text"),
    [
        # Refused: a PermanentError that keeps the status (a 400 or a 404 also says an
        # api-version is not served: bridge.agent.advisory).
        (response(400, BAD_HEADER), imds.Refused, "Required metadata header not specified"),
        (response(404, b"nope"), imds.Refused, "404"),
        (response(501), PermanentError, "501"),
        (response(410), RetryableError, "410"),
        (response(500), RetryableError, "500"),
        (response(503), RetryableError, "503"),
        (response(429, headers={"Retry-After": "7"}), ThrottledError, "429"),
        (requests.ConnectionError("refused"), RetryableError, "ConnectionError"),
        (requests.Timeout("slow"), RetryableError, "Timeout"),
    ],
)
def test_failures_map_onto_kinds(answer: Any, kind: type[Exception], text: str) -> None:
    with FakeSession(answer) as session:
        client = imds.ImdsClient("http://imds.test", max_rps=5, transport=over(session))
        with pytest.raises(kind) as info:
            client.scheduled_events()
    assert type(info.value) is kind
    assert text in str(info.value)
    if kind is ThrottledError:
        assert info.value.retry_after == 7.0  # type: ignore[attr-defined]
    if kind is imds.Refused:
        assert isinstance(info.value, PermanentError)
        assert info.value.status in (400, 404)  # type: ignore[attr-defined]


def test_requests_carry_header_version_and_long_first_timeout() -> None:
    with FakeSession(response(200, b'{"DocumentIncarnation": 1, "Events": []}')) as session:
        client = imds.ImdsClient(
            "http://imds.test/",
            "2019-08-01",
            timeout=3,
            first_call_timeout=120,
            transport=SessionTransport("http://imds.test/", session),
        )
        assert client.scheduled_events().startswith(b"{")
        client.scheduled_events()
        assert session.headers["Metadata"] == "true"
        assert session.trust_env is False
    first, second = session.calls
    assert first["url"] == "http://imds.test/metadata/scheduledevents"
    assert first["params"] == {"api-version": "2019-08-01"}
    assert first["allow_redirects"] is False
    assert first["timeout"][1] == 120
    assert second["timeout"][1] == 3


def test_approval_posts_start_requests() -> None:
    with FakeSession(response(200, b"")) as session:
        client = imds.ImdsClient("http://imds.test", transport=over(session))
        assert client.start_events(["e1"]) == 200
    assert session.calls[0]["json"] == {"StartRequests": [{"EventId": "e1"}]}


def test_instance_metadata_that_is_not_json_is_retryable() -> None:
    with FakeSession(response(200, b"<html>")) as session:
        client = imds.ImdsClient("http://imds.test", transport=over(session))
        with pytest.raises(RetryableError, match="not JSON"):
            client.instance_metadata()


def test_excerpt_is_short_and_single_line() -> None:
    assert imds.excerpt(b"a\n  b" + b"x" * 500, 10) == "a bxxxxxxx…"


def test_a_sooner_deadline_wakes_the_watchdog_that_waits_for_a_later_one() -> None:
    # The watchdog is told of a new deadline only when it would look later than that: one
    # armed for the first call's two minutes must still end a 10 s call at 10 s.
    watchdog = imds._Watchdog()
    first, _ = socket.socketpair()
    watchdog.arm(first, 120.0)
    assert not watchdog.disarm()
    ours, theirs = socket.socketpair()
    with ours, theirs, first, _:
        ours.settimeout(5.0)  # far past the deadline: only a shut socket ends this recv
        watchdog.arm(ours, 0.05)
        assert ours.recv(1) == b""  # shut by the watchdog, not answered
        assert watchdog.disarm()

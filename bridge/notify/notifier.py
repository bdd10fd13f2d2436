"""Posting notices to webhooks without ever holding the consumer up.

Each target has a bounded queue and a thread of its own: `notify` only appends (a full queue
drops its oldest notice, with a WARNING and a metric), so a webhook that hangs or fails delays
neither the caller nor another target. A thread posts one notice at a time, each post within
`timeout` seconds in all and only its answer's status read (bridge.notify.post), retrying
transient failures with the project's backoff (bridge.retry); a notice given up is an ERROR, and
its target is `failing()` until a post to it succeeds again. `close` hangs up on a post still
under way once its time is up.

A target's URL is a secret (a Teams workflow's or Slack's URL lets anyone post): it is in no
log line, error, repr or metric label. Metrics name targets.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import quote, urlsplit

import requests
from prometheus_client import CollectorRegistry, Counter, Gauge

from bridge.notify.formats import Format
from bridge.notify.notice import Notice
from bridge.notify.post import Post, PostCut, post
from bridge.redact import describe
from bridge.retry import (
    Backoff,
    DeliveryError,
    FailureStreak,
    PermanentError,
    RetryableError,
    ThrottledError,
    parse_retry_after,
)

log = logging.getLogger(__name__)
USER_AGENT = "se-bridge-notify/1"


@dataclass(frozen=True)
class Target:
    """Where notices go, and the body they take there (a function of bridge.notify.formats)."""

    name: str
    format: Format
    url: str = field(repr=False)


@dataclass(frozen=True)
class Delivery:
    """How notices are posted (notify.* settings)."""

    timeout: float = 10.0  # seconds one post may take in all, connecting to answering
    attempts: int = 6  # posts of one notice before it is given up
    first_backoff: float = 0.5
    max_backoff: float = 60.0
    queue_size: int = 1000  # notices waiting per target
    page_url: str = ""  # the approval page, for links


class NotifyMetrics:
    """se_bridge_consumer_notifications_total{target,outcome} (outcome: delivered, retried,
    given_up, dropped, unknown_target) and se_bridge_consumer_notify_target_failing{target}."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.notices = Counter(
            "se_bridge_consumer_notifications",
            "Notices per target, by outcome: delivered, retried (a post failed and is tried "
            "again), given_up, dropped (a full queue), unknown_target.",
            ["target", "outcome"],
            registry=registry,
        )
        self.failing = Gauge(
            "se_bridge_consumer_notify_target_failing",
            "1 while a target's last notice was given up and none has reached it since.",
            ["target"],
            registry=registry,
        )


class Notifier:
    """Posts notices to their targets from threads of its own; never blocks the caller."""

    def __init__(
        self,
        targets: Sequence[Target],
        delivery: Delivery | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._delivery = delivery or Delivery()
        _HIDDEN.add(*(t.url for t in targets))
        self._metrics = NotifyMetrics(registry or CollectorRegistry(auto_describe=True))
        self._lines = {t.name: _Line(t, self._delivery, self._metrics) for t in targets}
        self._unknown: set[str] = set()

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self._lines)

    def notify(self, notice: Notice) -> None:
        """Queue `notice` for its target and return at once."""
        line = self._lines.get(notice.target)
        if line is None:
            self._metrics.notices.labels(notice.target, "unknown_target").inc()
            if notice.target not in self._unknown:
                self._unknown.add(notice.target)
                log.error(
                    "no notify.targets entry is named %r: its notices (the first about "
                    "event %s) go nowhere; add it or name another target in the "
                    "policy",
                    notice.target,
                    notice.event_id,
                )
            return
        if notice.link is None and self._delivery.page_url:
            notice = replace(notice, link=event_link(self._delivery.page_url, notice.event_id))
        line.put(notice)

    def failing(self) -> tuple[str, ...]:
        """The targets whose last notice was given up, none having reached them since."""
        return tuple(sorted(name for name, line in self._lines.items() if line.failing))

    def alive(self) -> tuple[str, ...]:
        """The targets whose thread still runs: all until `close`, then, for a moment, those
        whose post it hung up on."""
        return tuple(name for name, line in self._lines.items() if line.alive)

    def close(self, timeout: float) -> None:
        """Post what is queued for at most `timeout` seconds in all; what is left is given up."""
        for line in self._lines.values():
            line.close()
        deadline = time.monotonic() + timeout
        for line in self._lines.values():
            line.join(max(0.0, deadline - time.monotonic()))


class _HideUrls(logging.Filter):
    """Hides the webhook URLs in urllib3's DEBUG lines, which name each request's path and
    query (where a Teams workflow's or Slack's URL has its secret)."""

    def __init__(self) -> None:
        super().__init__()
        self._texts: set[str] = set()

    def add(self, *urls: str) -> None:
        for url in urls:
            parts = urlsplit(url)
            where = parts.path + (f"?{parts.query}" if parts.query else "")
            self._texts |= {url, where} if len(where) > 1 else {url}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = message
        for text in sorted(self._texts, key=len, reverse=True):
            hidden = hidden.replace(text, "***")
        if hidden != message:
            record.msg, record.args = hidden, None
        return True


_HIDDEN = _HideUrls()
logging.getLogger("urllib3.connectionpool").addFilter(_HIDDEN)


def event_link(page_url: str, event_id: str | None) -> str:
    """The approval page's address for `event_id` (the page itself for the whole fleet)."""
    base = page_url.rstrip("/")
    if event_id is None:
        return f"{base}/"
    run = _PATCH_SUBJECT.fullmatch(event_id)
    if run is not None:  # a patch run's ask: its own address (a slash would not be one path)
        return f"{base}/patchruns/{quote(run.group(1), safe='')}/{run.group(2)}"
    return f"{base}/events/{quote(event_id, safe='')}"


# A patch run as notices name it (bridge.consumer.patchruns.subject).
_PATCH_SUBJECT = re.compile(r"\(patch:([-\w._]{1,128})/(\d{14})\)")


class _Line:
    """One target's queue, thread and run of failures."""

    def __init__(self, target: Target, delivery: Delivery, metrics: NotifyMetrics) -> None:
        self._target, self._delivery, self._metrics = target, delivery, metrics
        self._queue: deque[Notice] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._abandon = threading.Event()
        self._posting: Post | None = None  # the post under way, which the close cuts
        self._streak = FailureStreak(Backoff(delivery.first_backoff, delivery.max_backoff))
        self.failing = False
        self._broken_kinds: set[str] = set()  # kinds of errors said (`_broken`)
        metrics.failing.labels(target.name).set(0)
        self._thread = threading.Thread(target=self._run, name=f"notify-{target.name}", daemon=True)
        self._thread.start()

    def put(self, notice: Notice) -> None:
        with self._ready:
            if self._closing:
                self._metrics.notices.labels(self._target.name, "given_up").inc()
                log.error(
                    "a notice (%s, event %s) to notify target %s came after the notifier "
                    "stopped: not sent",
                    notice.kind,
                    notice.event_id,
                    self._target.name,
                )
                return
            if len(self._queue) >= self._delivery.queue_size:
                dropped = self._queue.popleft()
                self._metrics.notices.labels(self._target.name, "dropped").inc()
                log.warning(
                    "notify target %s has %d notices waiting: dropped the oldest (%s, "
                    "event %s); the target is slow or failing",
                    self._target.name,
                    len(self._queue) + 1,
                    dropped.kind,
                    dropped.event_id,
                )
            self._queue.append(notice)
            self._ready.notify()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        with self._ready:
            self._closing = True
            self._ready.notify()

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the queue to drain; then stop retrying."""
        self._thread.join(timeout)
        self._abandon.set()
        with self._ready:
            left, self._queue = list(self._queue), deque()
            posting = self._posting
        if posting is not None:
            posting.cut()
        if left:
            self._metrics.notices.labels(self._target.name, "given_up").inc(len(left))
            log.error(
                "%d notices to notify target %s were not sent before the consumer "
                "stopped (the first: %s, event %s)",
                len(left),
                self._target.name,
                left[0].kind,
                left[0].event_id,
            )

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue or self._abandon.is_set():
                    return
                notice = self._queue.popleft()
            try:
                self._deliver(notice)
            except Exception as err:  # one notice (a format's bug) never ends the target's line
                self._broken(notice, err)

    def _deliver(self, notice: Notice) -> None:
        body = json.dumps(self._target.format(notice)).encode("utf-8")
        name = self._target.name
        for attempt in range(1, self._delivery.attempts + 1):
            try:
                self._post(body)
            except DeliveryError as err:
                permanent = isinstance(err, PermanentError)
                first, delay = self._streak.failed(err, longest=permanent)
                if permanent or attempt == self._delivery.attempts:
                    self._give_up(notice, err, attempt)
                    return
                self._metrics.notices.labels(name, "retried").inc()
                (log.warning if first else log.debug)(
                    "a notice to notify target %s failed: %s; retrying in %.1f s",
                    name,
                    describe(err),
                    delay,
                )
                if self._abandon.wait(delay):
                    self._give_up(notice, err, attempt)
                    return
            else:
                self._metrics.notices.labels(name, "delivered").inc()
                if failures := self._streak.succeeded():
                    log.info(
                        "notify target %s takes notices again after %d failed posts", name, failures
                    )
                self.failing = False
                self._metrics.failing.labels(name).set(0)
                return

    def _broken(self, notice: Notice, err: Exception) -> None:
        """A notice that could not be made or posted for another reason than the webhook's:
        given up and counted; each kind of error said once, with its traceback."""
        self._metrics.notices.labels(self._target.name, "given_up").inc()
        kind = type(err).__name__
        if kind in self._broken_kinds:
            log.debug("gave up another notice to %s: %s", self._target.name, describe(err))
            return
        self._broken_kinds.add(kind)
        log.error(
            "gave up a notice (%s, event %s) to notify target %s: making or posting it failed "
            "(%s); the target's later notices go on, and later failures of this kind are "
            'counted in se_bridge_consumer_notifications_total{outcome="given_up"}, not '
            "said again; report this line with its traceback",
            notice.kind,
            notice.event_id,
            self._target.name,
            describe(err, with_type=True),
            exc_info=err,
        )

    def _give_up(self, notice: Notice, err: DeliveryError, attempts: int) -> None:
        self.failing = True
        self._metrics.failing.labels(self._target.name).set(1)
        self._metrics.notices.labels(self._target.name, "given_up").inc()
        log.error(
            "gave up a notice (%s, event %s) to notify target %s after %d post%s: %s; "
            "check the target's URL and that the webhook accepts posts",
            notice.kind,
            notice.event_id,
            self._target.name,
            attempts,
            "" if attempts == 1 else "s",
            describe(err),
        )

    def _post(self, body: bytes) -> None:
        """One POST of at most `timeout` seconds in all, its answer's body unread; a
        DeliveryError that never quotes the URL (requests' own errors do)."""
        timeout = self._delivery.timeout
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        with Post(timeout) as cut:
            with self._ready:
                self._posting = cut
            if self._abandon.is_set():
                cut.cut()
            try:
                answer = post(self._target.url, body, headers, timeout=timeout, cut=cut)
            except (requests.Timeout, PostCut):
                raise RetryableError(f"no answer within {timeout:g} s") from None
            except requests.RequestException as err:
                raise RetryableError(f"cannot post ({type(err).__name__})") from None
            finally:
                with self._ready:
                    self._posting = None
        status = answer.status_code
        if 200 <= status < 300:
            return
        said = f"the webhook answered HTTP {status}"
        if status == 429:
            raise ThrottledError(said, parse_retry_after(answer.headers.get("Retry-After")))
        if status == 408 or status >= 500:
            raise RetryableError(said)
        raise PermanentError(f"{said}, which retrying cannot change")

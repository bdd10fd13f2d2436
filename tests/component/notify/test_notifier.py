"""The Notifier against real webhooks (a local HTTP server): each format arrives, a failing
target is retried and then reported failing, a hanging one holds up neither the caller nor
another target, and a webhook's URL shows up in no log, error or metric."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bridge.config import load
from bridge.notify import formats, kinds
from bridge.notify.formats import SAMPLE
from bridge.notify.notice import Notice
from bridge.notify.notifier import Delivery, Notifier, Target
from tests.doubles.hostile_webhook import HostileWebhook
from tests.doubles.keyvault import KeyVaultDouble
from tests.doubles.webhook import WebhookReceiver
from tests.support.wait import eventually

# What a real webhook URL carries: whoever has it may post to the channel.
SECRET = "sig=Zm9yZ2VkLXNpZ25hdHVyZQ"
FAST = Delivery(timeout=30, attempts=3, first_backoff=0.01, max_backoff=0.05)


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as made:
        yield made


def hook(receiver: WebhookReceiver, name: str) -> str:
    return receiver.url(f"/hooks/{name}") + f"?api-version=1&{SECRET}"


def sample(value: float, registry: CollectorRegistry, target: str, outcome: str) -> bool:
    labels = {"target": target, "outcome": outcome}
    return registry.get_sample_value("se_bridge_consumer_notifications_total", labels) == value


def test_each_format_reaches_its_webhook(receiver: WebhookReceiver) -> None:
    kinds = (("any", formats.generic), ("chat", formats.teams), ("ops", formats.slack))
    targets = [Target(name, fmt, hook(receiver, name)) for name, fmt in kinds]
    notifier = Notifier(targets, FAST)
    for target in ("any", "chat", "ops"):
        notifier.notify(replace(SAMPLE, target=target))
    assert eventually(lambda: receiver.bodies("/hooks/any")) == [formats.generic(SAMPLE)]
    assert eventually(lambda: receiver.bodies("/hooks/chat")) == [formats.teams(SAMPLE)]
    assert eventually(lambda: receiver.bodies("/hooks/ops")) == [formats.slack(SAMPLE)]
    notifier.close(5)
    assert notifier.failing() == ()


def test_a_notice_without_a_link_gets_the_page_s(receiver: WebhookReceiver) -> None:
    page = Delivery(page_url="https://bridge.contoso.com/")
    notifier = Notifier([Target("any", formats.generic, hook(receiver, "any"))], page)
    notifier.notify(replace(SAMPLE, target="any", link=None, event_id="a/b"))
    notifier.notify(replace(SAMPLE, target="any", link=None, event_id=None, kind="paused"))
    bodies = eventually(lambda: receiver.bodies("/hooks/any")[1:] and receiver.bodies("/hooks/any"))
    assert [body["Link"] for body in bodies] == [
        "https://bridge.contoso.com/events/a%2Fb",
        "https://bridge.contoso.com/",
    ]
    notifier.close(5)


def test_a_failing_target_is_retried_then_reported_failing_until_it_answers_again(
    receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="bridge.notify")
    registry = CollectorRegistry()
    notifier = Notifier([Target("dba", formats.teams, hook(receiver, "dba"))], FAST, registry)
    receiver.script("/hooks/dba", 500, 502, 500)
    notifier.notify(replace(SAMPLE, target="dba"))
    assert eventually(notifier.failing) == ("dba",)
    assert receiver.posts("/hooks/dba") == FAST.attempts
    assert sample(2, registry, "dba", "retried")
    assert sample(1, registry, "dba", "given_up")
    assert registry.get_sample_value("se_bridge_consumer_notify_target_failing", {"target": "dba"})
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(warnings) == 1, "one WARNING when the trouble starts, not one per retry"
    assert "HTTP 500" in warnings[0].getMessage()
    assert len(errors) == 1
    assert "gave up" in errors[0].getMessage()
    assert f"event {SAMPLE.event_id}" in errors[0].getMessage()

    notifier.notify(replace(SAMPLE, target="dba"))  # the script is used up: 200 again
    eventually(lambda: not notifier.failing())
    assert sample(1, registry, "dba", "delivered")
    assert "takes notices again" in caplog.text
    notifier.close(5)


def test_a_refusal_that_retrying_cannot_change_is_given_up_at_once(
    receiver: WebhookReceiver,
) -> None:
    registry = CollectorRegistry()
    notifier = Notifier([Target("gone", formats.slack, hook(receiver, "gone"))], FAST, registry)
    receiver.script("/hooks/gone", 404)
    notifier.notify(replace(SAMPLE, target="gone"))
    assert eventually(notifier.failing) == ("gone",)
    assert receiver.posts("/hooks/gone") == 1
    notifier.close(5)


def test_a_throttled_target_is_retried(receiver: WebhookReceiver) -> None:
    notifier = Notifier([Target("busy", formats.generic, hook(receiver, "busy"))], FAST)
    receiver.script("/hooks/busy", 429, 429)
    notifier.notify(replace(SAMPLE, target="busy"))
    assert eventually(lambda: receiver.bodies("/hooks/busy")) == [formats.generic(SAMPLE)]
    assert receiver.posts("/hooks/busy") == 3
    assert notifier.failing() == ()
    notifier.close(5)


def test_a_hanging_target_holds_up_neither_the_caller_nor_another_target(
    receiver: WebhookReceiver,
) -> None:
    receiver.hang("/hooks/stuck")
    notifier = Notifier(
        [Target("stuck", formats.teams, hook(receiver, "stuck")),
         Target("ops", formats.slack, hook(receiver, "ops"))],
        FAST,
    )  # fmt: skip
    notifier.notify(replace(SAMPLE, target="stuck"))
    holding = receiver.holding("/hooks/stuck")
    assert holding.wait(30), "the hanging webhook never got the post"
    # The webhook holds the post (it answers only when the receiver closes): these calls
    # return while it does, so notify never waits on a post.
    notifier.notify(replace(SAMPLE, target="stuck", event_id="second"))
    notifier.notify(replace(SAMPLE, target="ops"))
    assert eventually(lambda: receiver.bodies("/hooks/ops")) == [formats.slack(SAMPLE)]
    assert receiver.posts("/hooks/stuck") == 1, "still the first post, held"
    notifier.close(0)  # gives up what is left, and the held post with it
    eventually(lambda: not notifier.alive(), what="the held post cut off at the close")
    receiver.release()


def test_a_full_queue_drops_its_oldest_notice_with_a_warning(
    receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.hang("/hooks/stuck")
    registry = CollectorRegistry()
    small = replace(FAST, queue_size=2)
    notifier = Notifier([Target("stuck", formats.generic, hook(receiver, "stuck"))], small,
                        registry)  # fmt: skip
    notifier.notify(replace(SAMPLE, target="stuck", event_id="held"))
    assert receiver.holding("/hooks/stuck").wait(30)
    for event in ("first", "second", "third"):
        notifier.notify(replace(SAMPLE, target="stuck", event_id=event))
    assert sample(1, registry, "stuck", "dropped")
    assert "dropped the oldest (asked, event first)" in caplog.text
    notifier.close(0)
    assert "2 notices to notify target stuck were not sent" in caplog.text
    receiver.release()
    eventually(lambda: not notifier.alive())


def test_a_notice_for_a_target_nobody_configured_is_counted_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    notifier = Notifier([], FAST, registry)
    notifier.notify(replace(SAMPLE, target="nobody"))
    notifier.notify(replace(SAMPLE, target="nobody"))
    assert sample(2, registry, "nobody", "unknown_target")
    assert caplog.text.count("no notify.targets entry is named 'nobody'") == 1
    notifier.close(1)


def test_a_webhook_url_is_in_no_log_error_repr_or_metric(
    receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    registry = CollectorRegistry()
    refused = "http://127.0.0.1:9/hooks/closed?" + SECRET  # the discard port: nothing listens
    targets = [Target("bad", formats.generic, hook(receiver, "bad")),
               Target("closed", formats.generic, refused)]  # fmt: skip
    receiver.script("/hooks/bad", 500, 500, 500)
    notifier = Notifier(targets, FAST, registry)
    notifier.notify(replace(SAMPLE, target="bad"))
    notifier.notify(replace(SAMPLE, target="closed"))
    eventually(lambda: notifier.failing() == ("bad", "closed"))
    notifier.close(5)
    shown = [caplog.text, repr(targets), generate_latest(registry).decode()]
    shown += [str(r.exc_info[1]) for r in caplog.records if r.exc_info and r.exc_info[1]]
    assert "cannot post (ConnectionError)" in caplog.text
    for text in shown:
        assert SECRET not in text
        assert "/hooks/" not in text


def test_a_target_whose_url_is_in_key_vault_gets_its_notices(
    receiver: WebhookReceiver, key_vault: KeyVaultDouble
) -> None:
    key_vault.put("dba-webhook", hook(receiver, "dba"))
    env = {"SE_BRIDGE_IDENTITY_KIND": "managed",
           "SE_BRIDGE_NOTIFY_KEY_VAULT": key_vault.vault_url,
           "SE_BRIDGE_NOTIFY_PAGE_URL": "https://bridge.contoso.com/",
           "SE_BRIDGE_NOTIFY_TARGETS": '[{"name": "dba", "kind": "teams", '
                                       '"url_secret": "dba-webhook"}]'}  # fmt: skip
    notifier = kinds.build(load(environ=env))
    notifier.notify(replace(SAMPLE, target="dba", link=None))
    [card] = eventually(lambda: receiver.bodies("/hooks/dba"))
    [action] = card["attachments"][0]["content"]["actions"]
    assert action["url"] == f"https://bridge.contoso.com/events/{SAMPLE.event_id}"
    notifier.close(5)


def test_a_notice_after_the_stop_is_an_error_not_a_silent_loss(
    receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    notifier = Notifier([Target("any", formats.generic, hook(receiver, "any"))], FAST, registry)
    notifier.close(5)
    notifier.notify(replace(SAMPLE, target="any"))
    assert sample(1, registry, "any", "given_up")
    assert "notice (asked, event C7061BAC" in caplog.text
    assert "after the notifier stopped" in caplog.text


@pytest.mark.parametrize("mode", ["huge", "endless"])
def test_a_webhook_s_answer_is_not_read_beyond_its_status(mode: str) -> None:
    # 400 MB, or a chunked body that never ends: only the status matters, so the post is over
    # once it is read, and the poster hangs up on the rest.
    registry = CollectorRegistry()
    with HostileWebhook("huge" if mode == "huge" else "endless") as hostile:
        notifier = Notifier([Target("any", formats.generic, hostile.url())], FAST, registry)
        notifier.notify(replace(SAMPLE, target="any"))
        eventually(lambda: sample(1, registry, "any", "delivered"), what="the post delivered")
        eventually(lambda: hostile.counts()[2] == 1, what="the poster hanging up on the answer")
        posts, sent, _ = hostile.counts()
        assert posts == 1
        assert sent < 64 * 1024 * 1024, "at most what the sockets' buffers took"
        notifier.close(5)


def test_a_webhook_that_drips_its_answer_is_cut_off_at_the_post_s_deadline() -> None:
    # A byte every 0.2 s: a timeout between bytes never fires; the post's deadline does.
    registry = CollectorRegistry()
    slow = Delivery(timeout=1, attempts=2, first_backoff=0.01, max_backoff=0.05)
    with HostileWebhook("drip", every=0.2) as hostile:
        notifier = Notifier([Target("any", formats.generic, hostile.url())], slow, registry)
        notifier.notify(replace(SAMPLE, target="any"))
        assert eventually(notifier.failing, what="the notice given up") == ("any",)
        assert sample(1, registry, "any", "retried")
        assert hostile.counts()[0] == 2
        notifier.close(5)
        assert notifier.alive() == ()


def test_the_close_cuts_a_post_to_a_dripping_webhook() -> None:
    with HostileWebhook("drip", every=0.2) as hostile:
        notifier = Notifier([Target("any", formats.generic, hostile.url())], FAST)
        notifier.notify(replace(SAMPLE, target="any"))
        eventually(lambda: hostile.counts()[1] > 0, what="the answer begun")
        notifier.close(0)
        eventually(lambda: not notifier.alive(), what="the post cut off at the close")


def test_a_notice_its_format_fails_on_is_given_up_and_the_target_takes_the_next(
    receiver: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in a format for one notice (or a notice no format expected) ends neither the
    target's thread nor its later notices (issue 36's review: a thread must not stop for good)."""

    def fragile(notice: Notice) -> formats.Body:
        if notice.event_id == "odd":
            raise KeyError("a field this format did not expect")
        return formats.generic(notice)

    registry = CollectorRegistry()
    notifier = Notifier([Target("any", fragile, hook(receiver, "any"))], FAST, registry)
    for event in ("odd", "odd", "next"):
        notifier.notify(replace(SAMPLE, target="any", event_id=event))
    eventually(lambda: receiver.bodies("/hooks/any") or not notifier.alive(), 60, "the next")
    assert notifier.alive() == ("any",)
    assert [b["EventId"] for b in receiver.bodies("/hooks/any")] == ["next"]
    assert sample(2, registry, "any", "given_up")
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "KeyError" in errors[0]
    notifier.close(5)

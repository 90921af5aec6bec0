"""Sink payloads (their exact shapes) and the notifier's retries, with fake sinks and a
recorded sleep instead of time passing."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from datetime import UTC, datetime

import pytest
from fixtures.loop import one_loop_turn
from hypothesis import given
from hypothesis import strategies as st

from chronoshard.watchdog.incidents import AlertRecord, Event, Severity
from chronoshard.watchdog.notifier import (
    DeliveryStats,
    Notifier,
    RetryPolicy,
    backoff_s,
)
from chronoshard.watchdog.sinks import (
    PAGERDUTY_SUMMARY_MAX_CHARS,
    DeliveryFailed,
    LogSink,
    Notice,
    pagerduty_payload,
    slack_payload,
    webhook_payload,
)

OPENED = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
SENT = datetime(2030, 1, 2, 3, 4, 6, tzinfo=UTC)
TENANT = uuid.UUID("0190a5c2-7b7e-7cde-8f00-0000000000aa")


def alert(**changes: object) -> AlertRecord:
    base = AlertRecord(
        id=42,
        kind="job_overdue",
        dedup_key=f"chronoshard/job/{TENANT}/nightly",
        severity=Severity.ERROR,
        summary="job 'nightly' of tenant acme is overdue",
        opened_at=OPENED,
        tenant_id=TENANT,
        job_id="nightly",
        details={"interval_s": 60.0, "last_completed_at": OPENED, "nested": {"id": TENANT}},
    )
    return AlertRecord(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def notice(event: Event = Event.TRIGGER, **changes: object) -> Notice:
    return Notice(event, alert(**changes), "wd-1", SENT)


def test_webhook_payload_shape() -> None:
    body = webhook_payload(notice())
    assert body == {
        "version": 1,
        "event": "trigger",
        "alert": {
            "id": 42,
            "kind": "job_overdue",
            "dedup_key": f"chronoshard/job/{TENANT}/nightly",
            "severity": "error",
            "summary": "job 'nightly' of tenant acme is overdue",
            "tenant_id": str(TENANT),
            "job_id": "nightly",
            "details": {
                "interval_s": 60.0,
                "last_completed_at": OPENED.isoformat(),
                "nested": {"id": str(TENANT)},
            },
            "opened_at": OPENED.isoformat(),
            "resolved_at": None,
        },
        "source": "chronoshard-watchdog",
        "node_id": "wd-1",
        "sent_at": SENT.isoformat(),
    }
    json.dumps(body)  # serialisable as is
    resolved = webhook_payload(notice(Event.RESOLVE, resolved_at=SENT))
    assert resolved["event"] == "resolve"
    assert resolved["alert"]["resolved_at"] == SENT.isoformat()


def test_pagerduty_trigger_payload_follows_events_api_v2() -> None:
    body = pagerduty_payload(notice(), "R0UT1NGKEY")
    assert body["routing_key"] == "R0UT1NGKEY"
    assert body["event_action"] == "trigger"
    assert body["dedup_key"] == f"chronoshard/job/{TENANT}/nightly"
    payload = body["payload"]
    assert set(payload) >= {"summary", "source", "severity"}  # the required fields
    assert payload["severity"] in {"critical", "error", "warning", "info"}
    assert payload["severity"] == "error"
    assert payload["source"] == "wd-1"
    assert payload["timestamp"] == OPENED.isoformat()
    assert payload["component"] == "nightly"
    assert payload["group"] == str(TENANT)
    assert payload["class"] == "job_overdue"
    assert payload["custom_details"]["alert_id"] == 42
    json.dumps(body)


def test_pagerduty_renotify_is_a_trigger_with_the_same_dedup_key() -> None:
    first = pagerduty_payload(notice(Event.TRIGGER), "k")
    again = pagerduty_payload(notice(Event.RENOTIFY), "k")
    assert again["event_action"] == "trigger"
    assert again["dedup_key"] == first["dedup_key"]


def test_pagerduty_resolve_carries_only_the_keys() -> None:
    body = pagerduty_payload(notice(Event.RESOLVE, resolved_at=SENT), "k")
    assert body == {
        "routing_key": "k",
        "event_action": "resolve",
        "dedup_key": f"chronoshard/job/{TENANT}/nightly",
    }


def test_pagerduty_summary_is_cut_to_the_api_limit() -> None:
    body = pagerduty_payload(notice(summary="x" * 5000), "k")
    assert len(body["payload"]["summary"]) == PAGERDUTY_SUMMARY_MAX_CHARS


def test_slack_payload_is_text_naming_state_severity_and_key() -> None:
    firing = slack_payload(notice())
    assert set(firing) == {"text"}
    assert "*FIRING*" in firing["text"] and "[ERROR]" in firing["text"]
    assert "alert #42" in firing["text"] and "nightly" in firing["text"]
    assert "*STILL FIRING*" in slack_payload(notice(Event.RENOTIFY))["text"]
    resolved = slack_payload(notice(Event.RESOLVE, resolved_at=SENT))["text"]
    assert "*RESOLVED*" in resolved and "resolved 2030-01-02T03:04:06" in resolved


# --- the notifier --------------------------------------------------------------------------------


class FakeSink:
    def __init__(self, name: str, failures: list[DeliveryFailed | Exception], pages: bool = True):
        self.name = name
        self.pages = pages
        self._failures = list(failures)
        self.calls: list[Notice] = []

    async def send(self, notice: Notice) -> None:
        self.calls.append(notice)
        if self._failures:
            raise self._failures.pop(0)


def transient() -> DeliveryFailed:
    return DeliveryFailed("connection refused", retryable=True)


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


POLICY = RetryPolicy(max_attempts=4, initial_backoff_s=1.0, max_backoff_s=3.0)


async def test_a_transient_failure_is_retried_with_backoff_until_delivered() -> None:
    sink = FakeSink("webhook", [transient(), transient()])
    sleeps = Sleeps()
    stats = DeliveryStats()
    notifier = Notifier([sink], POLICY, stats, rng=random.Random(1), sleep=sleeps)
    report = await notifier.deliver(notice())
    assert report.delivered == ("webhook",) and report.failed == () and report.accepted
    assert len(sink.calls) == 3
    assert len(sleeps.delays) == 2
    assert 0.5 <= sleeps.delays[0] <= 1.0 and 1.0 <= sleeps.delays[1] <= 2.0
    assert stats.sent[("webhook", "trigger")] == 1
    assert stats.retries["webhook"] == 2
    assert stats.failed[("webhook", "trigger")] == 0


async def test_an_unreachable_sink_is_counted_failed_and_others_still_get_it() -> None:
    down = FakeSink("webhook-1", [transient()] * 10)
    up = FakeSink("webhook-2", [])
    stats = DeliveryStats()
    notifier = Notifier([down, up], POLICY, stats, sleep=Sleeps())
    report = await notifier.deliver(notice(Event.RESOLVE))
    assert len(down.calls) == POLICY.max_attempts
    assert report.failed == ("webhook-1",) and report.delivered == ("webhook-2",)
    assert report.accepted
    assert stats.failed[("webhook-1", "resolve")] == 1
    assert stats.sent[("webhook-2", "resolve")] == 1


async def test_a_permanent_error_is_not_retried_and_a_crashing_sink_is_contained() -> None:
    refused = FakeSink("pagerduty", [DeliveryFailed("HTTP 400", retryable=False)])
    buggy = FakeSink("slack", [RuntimeError("bug")])
    stats = DeliveryStats()
    report = await Notifier([refused, buggy], POLICY, stats, sleep=Sleeps()).deliver(notice())
    assert len(refused.calls) == 1 and len(buggy.calls) == 1
    assert report.delivered == () and not report.accepted
    assert stats.retries == {}


async def test_only_the_log_is_not_a_delivery_but_alone_it_counts() -> None:
    down = FakeSink("webhook", [transient()] * 10)
    report = await Notifier([down, LogSink()], POLICY, DeliveryStats(), sleep=Sleeps()).deliver(
        notice()
    )
    assert report.delivered == ("log",) and not report.accepted
    alone = await Notifier([LogSink()], POLICY, DeliveryStats()).deliver(notice())
    assert alone.accepted


async def test_submit_runs_in_the_background_and_marks_the_key_busy() -> None:
    gate = asyncio.Event()

    class SlowSink(FakeSink):
        async def send(self, notice: Notice) -> None:
            await gate.wait()
            await super().send(notice)

    sink = SlowSink("webhook", [])
    notifier = Notifier([sink], POLICY, DeliveryStats())
    recorded: list[Notice] = []

    async def record(notice: Notice) -> None:
        recorded.append(notice)

    assert notifier.submit(notice(), record)
    key = alert().dedup_key
    assert notifier.busy() == {key}
    assert not notifier.submit(notice(Event.RESOLVE), record)  # the key is in flight
    gate.set()
    await notifier.drain(5)
    assert notifier.busy() == frozenset()
    assert [n.event for n in recorded] == [Event.TRIGGER]
    assert len(sink.calls) == 1


async def test_the_delivery_is_recorded_at_the_first_acceptance_not_after_slow_sinks() -> None:
    """A replica that dies while a dead webhook is still being retried must already have
    recorded the trigger the live one took, or its successor sends it again."""
    retrying = asyncio.Event()
    release = asyncio.Event()

    async def held_sleep(seconds: float) -> None:
        retrying.set()
        await release.wait()

    down = FakeSink("webhook-2", [transient()] * 10)
    up = FakeSink("webhook-1", [])
    log_only = LogSink()
    notifier = Notifier([down, log_only, up], POLICY, DeliveryStats(), sleep=held_sleep)
    recorded: list[Notice] = []

    async def record(n: Notice) -> None:
        recorded.append(n)

    notifier.submit(notice(), record)
    await asyncio.wait_for(retrying.wait(), 5)
    await one_loop_turn()
    assert len(recorded) == 1  # recorded while webhook-2 is still being retried
    assert notifier.busy() == {alert().dedup_key}
    release.set()
    await notifier.drain(5)
    assert len(recorded) == 1  # once, however many sinks took it


async def test_nothing_is_recorded_when_no_paging_sink_took_it() -> None:
    down = FakeSink("webhook", [transient()] * 10)
    recorded: list[Notice] = []

    async def record(n: Notice) -> None:
        recorded.append(n)

    notifier = Notifier([down, LogSink()], POLICY, DeliveryStats(), sleep=Sleeps())
    notifier.submit(notice(), record)
    await notifier.drain(5)
    assert recorded == []


async def test_a_failing_record_is_contained() -> None:
    notifier = Notifier([FakeSink("webhook", [])], POLICY, DeliveryStats())

    async def broken(notice: Notice) -> None:
        raise RuntimeError("database gone")

    notifier.submit(notice(), broken)
    await notifier.drain(5)
    assert notifier.busy() == frozenset()


@given(st.integers(1, 200), st.floats(0, 0.999999))
def test_backoff_doubles_up_to_the_cap_with_bounded_jitter(attempt: int, u: float) -> None:
    policy = RetryPolicy(max_attempts=5, initial_backoff_s=0.5, max_backoff_s=30.0)
    step = min(30.0, 0.5 * 2 ** min(attempt - 1, 60))
    delay = backoff_s(attempt, policy, u)
    assert step / 2 <= delay <= step
    assert backoff_s(attempt, policy, 0.0) <= backoff_s(attempt + 1, policy, 0.0)


def test_backoff_counts_attempts_from_one() -> None:
    with pytest.raises(ValueError):
        backoff_s(0, RetryPolicy(), 0.5)

"""Where alerts go: a generic JSON webhook, PagerDuty Events API v2, a Slack-compatible
webhook, and the log.

Each sink is a payload builder (pure: a :class:`Notice` in, a JSON-ready dict out, unit
tested for its exact shape) and one ``send``. HTTP goes through ``urllib`` in a worker
thread: a notification is a handful of small POSTs, which does not justify an HTTP client
dependency, and the thread keeps a slow receiver off the event loop. ``send`` raises
:class:`DeliveryFailed` saying whether trying again may help (a timeout, a refused
connection, 429 or 5xx) or not (any other 4xx: the request itself is wrong); retries and
backoff are the notifier's business, not the sink's.

PagerDuty gets ``trigger`` for triggers and re-notifications (it deduplicates them by
``dedup_key`` into the open incident) and ``resolve`` with the same key. The webhook body
carries the alert's database id and the event, so a receiver can deduplicate the rare
repeat after a watchdog failover.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from chronoshard import __version__
from chronoshard.watchdog.incidents import AlertRecord, Event, Severity

log = logging.getLogger("chronoshard.watchdog.alerts")

SOURCE = "chronoshard-watchdog"
USER_AGENT = f"chronoshard-watchdog/{__version__}"
PAGERDUTY_SUMMARY_MAX_CHARS = 1024
"""PagerDuty refuses a longer payload.summary."""
WEBHOOK_VERSION = 1
_RESPONSE_PEEK_BYTES = 512


@dataclass(frozen=True)
class Notice:
    """One notification: ``event`` about ``alert``, sent by replica ``node_id``."""

    event: Event
    alert: AlertRecord
    node_id: str
    sent_at: datetime


class DeliveryFailed(Exception):
    """Raised by a sink's ``send``; ``retryable`` says whether another attempt may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class Sink(Protocol):
    name: str
    # False for the log: a logged line tells nobody, so it does not count as delivered.
    pages: bool

    async def send(self, notice: Notice) -> None:
        """Deliver one notice or raise :class:`DeliveryFailed`."""
        ...


# --- payloads (pure) ---------------------------------------------------------------------------


def json_ready(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def alert_document(alert: AlertRecord) -> dict[str, Any]:
    """The alert as JSON-ready data (timestamps ISO 8601, ids as text)."""
    return {
        "id": alert.id,
        "kind": alert.kind,
        "dedup_key": alert.dedup_key,
        "severity": str(alert.severity),
        "summary": alert.summary,
        "tenant_id": None if alert.tenant_id is None else str(alert.tenant_id),
        "job_id": alert.job_id,
        "details": json_ready(alert.details),
        "opened_at": alert.opened_at.isoformat(),
        "resolved_at": None if alert.resolved_at is None else alert.resolved_at.isoformat(),
    }


def webhook_payload(notice: Notice) -> dict[str, Any]:
    """The generic webhook body: ``{"version", "event", "alert": {...}, "source", ...}``."""
    return {
        "version": WEBHOOK_VERSION,
        "event": str(notice.event),
        "alert": alert_document(notice.alert),
        "source": SOURCE,
        "node_id": notice.node_id,
        "sent_at": notice.sent_at.isoformat(),
    }


def pagerduty_payload(notice: Notice, routing_key: str) -> dict[str, Any]:
    """An Events API v2 event. Resolves carry only the routing and dedup keys, as the API
    asks; triggers (and re-notifications, which PagerDuty folds into the open incident)
    carry the payload."""
    alert = notice.alert
    if notice.event is Event.RESOLVE:
        return {
            "routing_key": routing_key,
            "event_action": "resolve",
            "dedup_key": alert.dedup_key,
        }
    summary = alert.summary
    if len(summary) > PAGERDUTY_SUMMARY_MAX_CHARS:
        summary = summary[: PAGERDUTY_SUMMARY_MAX_CHARS - 1] + "…"
    custom_details = {"alert_id": alert.id, **json_ready(alert.details)}
    payload: dict[str, Any] = {
        "summary": summary,
        "source": notice.node_id,
        "severity": str(alert.severity),
        "timestamp": alert.opened_at.isoformat(),
        "component": alert.job_id or "chronoshard",
        "class": alert.kind,
        "custom_details": custom_details,
    }
    if alert.tenant_id is not None:
        payload["group"] = str(alert.tenant_id)
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": alert.dedup_key,
        "client": "Chronoshard watchdog",
        "payload": payload,
    }


_SLACK_MARK = {
    Event.TRIGGER: ":rotating_light:",
    Event.RENOTIFY: ":bell:",
    Event.RESOLVE: ":white_check_mark:",
}


def slack_payload(notice: Notice) -> dict[str, Any]:
    """An incoming-webhook message: ``text`` only, which every Slack-compatible receiver
    (Slack, Mattermost, Rocket.Chat) renders."""
    alert = notice.alert
    verb = {
        Event.TRIGGER: "FIRING",
        Event.RENOTIFY: "STILL FIRING",
        Event.RESOLVE: "RESOLVED",
    }[notice.event]
    lines = [
        f"{_SLACK_MARK[notice.event]} *{verb}* [{str(alert.severity).upper()}] {alert.summary}",
        f"opened {alert.opened_at.isoformat(timespec='seconds')} · key `{alert.dedup_key}`"
        + (f" · alert #{alert.id}" if alert.id is not None else ""),
    ]
    if alert.resolved_at is not None:
        lines.append(f"resolved {alert.resolved_at.isoformat(timespec='seconds')}")
    return {"text": "\n".join(lines)}


# --- sending --------------------------------------------------------------------------------------


def post_json(url: str, body: Mapping[str, Any], timeout_s: float) -> int:
    """POST ``body`` as JSON (blocking); the HTTP status on 2xx, else DeliveryFailed."""
    data = json.dumps(body, separators=(",", ":")).encode("utf-8")
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        detail = exc.read(_RESPONSE_PEEK_BYTES).decode("utf-8", "replace")
        retryable = exc.code == 429 or exc.code >= 500
        raise DeliveryFailed(f"HTTP {exc.code}: {detail}", retryable=retryable) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        # Refused, reset, DNS, timeouts (socket.timeout is an OSError): worth another try.
        raise DeliveryFailed(f"{type(exc).__name__}: {exc}", retryable=True) from exc
    if not 200 <= status < 300:
        raise DeliveryFailed(f"HTTP {status}", retryable=status >= 500)
    return status


class WebhookSink:
    """A generic JSON webhook (:func:`webhook_payload`)."""

    pages = True

    def __init__(self, url: str, timeout_s: float, name: str = "webhook") -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.name = name

    def payload(self, notice: Notice) -> dict[str, Any]:
        return webhook_payload(notice)

    async def send(self, notice: Notice) -> None:
        await asyncio.to_thread(post_json, self.url, self.payload(notice), self.timeout_s)


class PagerDutySink(WebhookSink):
    """PagerDuty Events API v2 (:func:`pagerduty_payload`)."""

    def __init__(self, routing_key: str, events_url: str, timeout_s: float) -> None:
        super().__init__(events_url, timeout_s, name="pagerduty")
        self._routing_key = routing_key

    def payload(self, notice: Notice) -> dict[str, Any]:
        return pagerduty_payload(notice, self._routing_key)


class SlackSink(WebhookSink):
    """A Slack-compatible incoming webhook (:func:`slack_payload`)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        super().__init__(url, timeout_s, name="slack")

    def payload(self, notice: Notice) -> dict[str, Any]:
        return slack_payload(notice)


_LOG_LEVEL = {
    Severity.CRITICAL: logging.ERROR,
    Severity.ERROR: logging.ERROR,
    Severity.WARNING: logging.WARNING,
    Severity.INFO: logging.INFO,
}


class LogSink:
    """One structured log line per notification; resolves at INFO."""

    name = "log"
    pages = False

    async def send(self, notice: Notice) -> None:
        alert = notice.alert
        level = logging.INFO if notice.event is Event.RESOLVE else _LOG_LEVEL[alert.severity]
        log.log(
            level,
            "alert %s: %s",
            notice.event,
            alert.summary,
            extra={
                "event": str(notice.event),
                "alert_id": alert.id,
                "kind": alert.kind,
                "dedup_key": alert.dedup_key,
                "severity": str(alert.severity),
                "tenant_id": None if alert.tenant_id is None else str(alert.tenant_id),
                "job_id": alert.job_id,
            },
        )

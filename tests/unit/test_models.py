"""The request fingerprint (pure; the store's use of it is tested against PostgreSQL in
tests/integration/test_store.py). Submit validation is the wire's alone:
tests/unit/test_task_requests.py."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from chronoshard.scheduler.api import payloads
from chronoshard.scheduler.core.models import NewTask, Priority, request_fingerprint

AT = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)


def _task(**overrides: object) -> NewTask:
    base = NewTask(
        id=uuid.UUID(int=1),
        type="t",
        scheduled_at=AT,
        due_at=AT,
        shard=0,
        payload={"a": [1, 2], "b": 0},
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


def _fingerprint(task: NewTask) -> str:
    return request_fingerprint(task, payloads.canonical(task.payload, "payload", 1024))


def test_a_repeat_with_server_chosen_fields_changed_has_the_same_fingerprint() -> None:
    original = _task()
    repeat = _task(
        id=uuid.UUID(int=2),
        shard=17,
        due_at=AT + timedelta(seconds=40),
        trace_context={"traceparent": "other"},
        submitted_by="another-key",
        # The same instant written in another zone, and the same object in another order.
        scheduled_at=AT.astimezone(timezone(timedelta(hours=5))),
        payload={"b": 0, "a": [1, 2]},
    )
    assert _fingerprint(repeat) == _fingerprint(original)


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"a": [2, 1], "b": 0}},
        {"type": "u"},
        {"scheduled_at": AT + timedelta(microseconds=1)},
        {"priority": Priority.BULK},
        {"queue": "other"},
        {"max_retries": 4},
        {"timeout_s": 5.0},
        {"idempotent": True},
        {"job_id": "job"},
    ],
)
def test_a_different_request_has_a_different_fingerprint(change: dict[str, object]) -> None:
    assert _fingerprint(_task(**change)) != _fingerprint(_task())

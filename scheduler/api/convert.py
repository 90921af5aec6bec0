"""Conversions between the wire (``chronoshard.v1`` messages) and the scheduler's types.

Only the servicers of this package (and the node) import generated code (STYLE #7).
Parsing a field either returns a core value or raises
:class:`~chronoshard.scheduler.errors.InvalidArgument` naming the field, so every servicer
reports bad input the same way. The scalars (Timestamp, Duration) go through the codec
both ends of the wire share, :mod:`chronoshard.wire`. What a TaskService request may
hold and what it resolves to is :mod:`.task_requests`.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from datetime import UTC, datetime
from typing import Any, cast

from google.protobuf import duration_pb2, timestamp_pb2

from chronoshard import exact_json, wire
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import (
    Priority,
    Task,
    TaskAttempt,
    TaskRef,
)
from chronoshard.scheduler.core.states import AttemptState, Resolution, TaskStatus
from chronoshard.scheduler.errors import InvalidArgument, shown
from chronoshard.v1 import common_pb2

_JITTER_BY_NAME = {
    "JITTER_MODE_SYMMETRIC": JitterMode.SYMMETRIC,
    "JITTER_MODE_NONE": JitterMode.NONE,
    "JITTER_MODE_DELAY_ONLY": JitterMode.DELAY_ONLY,
}

# Enum values go out by name: the generated constructors accept names, and names are what
# the database stores (minus the prefix). The one exception is write_task, which sets
# fields one by one (attributes typed as numbers) from the tables next to it.


def status_to_pb(status: TaskStatus) -> str:
    return f"TASK_STATUS_{status.value}"


def status_from_pb(value: int, field: str) -> TaskStatus:
    name = _enum_name(common_pb2.TaskStatus, value, field)
    if name == "TASK_STATUS_UNSPECIFIED":
        raise InvalidArgument(field, "task status must be specified")
    return TaskStatus(name.removeprefix("TASK_STATUS_"))


def attempt_state_to_pb(state: AttemptState) -> str:
    return f"ATTEMPT_STATE_{state.value}"


def resolution_to_pb(resolution: Resolution) -> str:
    return f"RESOLUTION_{resolution.value}"


def resolution_from_pb(value: int, field: str = "resolution") -> Resolution:
    name = _enum_name(common_pb2.Resolution, value, field)
    if name == "RESOLUTION_UNSPECIFIED":
        raise InvalidArgument(field, "must be RETRY or MARK_FAILED")
    return Resolution(name.removeprefix("RESOLUTION_"))


def priority_to_pb(priority: Priority) -> str:
    return f"PRIORITY_{priority.value.upper()}"


_PRIORITY_BY_NUMBER = {
    common_pb2.Priority.Value(priority_to_pb(priority)): priority for priority in Priority
}
_PRIORITY_BY_NUMBER[common_pb2.PRIORITY_UNSPECIFIED] = Priority.STANDARD
"""Every submit reads a priority: a lookup, not a name search and a parse."""


def priority_from_pb(value: int, field: str = "priority") -> Priority:
    known = _PRIORITY_BY_NUMBER.get(value)
    if known is not None:
        return known
    name = _enum_name(common_pb2.Priority, value, field)
    if name == "PRIORITY_UNSPECIFIED":
        return Priority.STANDARD
    return Priority(name.removeprefix("PRIORITY_").lower())


def jitter_from_pb(value: int, field: str = "jitter_mode") -> JitterMode | None:
    """None: the request did not choose (the tenant's default applies)."""
    name = _enum_name(common_pb2.JitterMode, value, field)
    return _JITTER_BY_NAME.get(name)


def _enum_name(enum: Any, value: int, field: str) -> str:
    try:
        return str(enum.Name(value))
    except ValueError as exc:
        raise InvalidArgument(field, f"unknown value {value}") from exc


def ts_to_pb(value: datetime) -> timestamp_pb2.Timestamp:
    """An instant the scheduler holds, as a Timestamp (:func:`chronoshard.wire.timestamp_to_pb`).

    The scheduler's instants are aware (PostgreSQL's timestamptz, the cluster clock); a
    naive one is read as the host's local time, as ``datetime.astimezone`` reads it (this
    function's rule before the shared codec). Tested by ``tzinfo``, not ``utcoffset()``,
    which would cost a third of the conversion: this is on the dispatch path.
    """
    message = timestamp_pb2.Timestamp()
    write_ts(message, value)
    return message


def write_ts(target: timestamp_pb2.Timestamp, value: datetime) -> None:
    """:func:`ts_to_pb` into an existing Timestamp (a field of a message being built)."""
    if value.tzinfo is None:
        value = value.astimezone(UTC)
    wire.write_timestamp(target, value)


def ts_from_pb(value: timestamp_pb2.Timestamp, field: str) -> datetime:
    # Checked here rather than left to protobuf, whose message ("Nanos -1 must be in a
    # range [0, 999999]") names neither the field nor what a valid value is.
    if not 0 <= value.nanos <= 999_999_999:
        raise InvalidArgument(field, "is not a valid timestamp: nanos must be 0..999999999")
    if not wire.MIN_TIMESTAMP_SECONDS <= value.seconds <= wire.MAX_TIMESTAMP_SECONDS:
        raise InvalidArgument(
            field, "is not a valid timestamp: it must lie between years 0001 and 9999"
        )
    return wire.timestamp_from_pb(value)


duration_to_pb = wire.duration_to_pb
"""A duration the scheduler holds as a Duration, to the nanosecond: no policy to add (the
scheduler's durations are its own stored, validated floats)."""


def duration_from_pb(value: duration_pb2.Duration, field: str) -> float:
    if value.nanos < -999_999_999 or value.nanos > 999_999_999:
        raise InvalidArgument(field, "is not a valid duration: nanos must be within +-999999999")
    return wire.duration_seconds(value)


_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Unicode's category Cc, exactly: the C0 controls, DEL and the C1 controls
(tests/unit/test_task_requests.py compares it with ``unicodedata`` for every code point).
One regular expression search instead of a category lookup per character: the check
runs on several fields of every submitted task."""


def has_control_character(value: str) -> bool:
    """Whether ``value`` holds a control character (a NUL would fail every later
    statement that writes it; the others garble logs and terminals)."""
    return _CONTROL_CHARACTER.search(value) is not None


_CANONICAL_UUID = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def uuid_from_pb(value: str, field: str) -> uuid.UUID:
    """An id as the wire carries it: canonical UUID text only (8-4-4-4-12 hex digits).

    ``uuid.UUID()`` also takes braces, a ``urn:uuid:`` prefix and no hyphens; the API
    says ids are canonical text, and accepting other spellings would make one id have
    several (an idempotent repeat, a cache keyed by the text). Upper-case hex is
    accepted (RFC 9562 reads UUID text case-insensitively): it names the same 128 bits,
    so nothing is lost when it is answered in lower case.
    """
    if _CANONICAL_UUID.fullmatch(value) is None:
        raise InvalidArgument(
            field, f"is not a UUID in canonical text (8-4-4-4-12 hex digits): {shown(value)}"
        )
    return uuid.UUID(value)


def ref_from_pb(ref: common_pb2.TaskRef, field: str = "task") -> TaskRef:
    if not ref.HasField("scheduled_at"):
        raise InvalidArgument(f"{field}.scheduled_at", "required")
    return TaskRef(
        ts_from_pb(ref.scheduled_at, f"{field}.scheduled_at"), uuid_from_pb(ref.id, f"{field}.id")
    )


def ref_to_pb(ref: TaskRef) -> common_pb2.TaskRef:
    return common_pb2.TaskRef(id=str(ref.id), scheduled_at=ts_to_pb(ref.scheduled_at))


def json_bytes(value: object) -> bytes:
    """A stored payload or result as the wire carries it: compact UTF-8 JSON, numbers
    exact (``chronoshard.exact_json``); None is empty."""
    if value is None:
        return b""
    return exact_json.dumps(value).encode()


def task_to_pb(task: Task, *, include_payload: bool = True) -> common_pb2.Task:
    msg = common_pb2.Task()
    write_task(msg, task, include_payload=include_payload)
    return msg


# The numbers of the wire's enums, for setting a field of a message being built (a
# generated constructor takes names, but an attribute is typed as the number).
_STATUS_NUMBER = {
    status: cast(common_pb2.TaskStatus, common_pb2.TaskStatus.Value(status_to_pb(status)))
    for status in TaskStatus
}
_PRIORITY_NUMBER = {
    priority: cast(common_pb2.Priority, common_pb2.Priority.Value(priority_to_pb(priority)))
    for priority in Priority
}


def write_task(msg: common_pb2.Task, task: Task, *, include_payload: bool = True) -> None:
    """Write ``task`` into ``msg``, an empty Task (often a field of a response being
    built: ``response.results.add().submitted.task``).

    In place and field by field, because a message handed to another message's
    constructor is copied, once per level, and a constructor of thirty keyword arguments
    costs more than setting the dozen a task usually has: a SubmitBatch answer of 1,000
    tasks took a third of the node's CPU for the call (issue 14). A field at its default
    (empty, zero, false) is left unset, which is what setting it would mean in proto3.
    """
    msg.id = str(task.id)
    msg.tenant_id = str(task.tenant_id)
    msg.type = task.type
    msg.status = _STATUS_NUMBER[task.status]
    write_ts(msg.scheduled_at, task.scheduled_at)
    write_ts(msg.due_at, task.due_at)
    msg.priority = _PRIORITY_NUMBER[task.priority]
    msg.queue = task.queue
    if task.last_error:
        msg.last_error = task.last_error
    if task.attempt:
        msg.attempt = task.attempt
    if task.fencing_token:
        msg.fencing_token = task.fencing_token
    if task.retry_count:
        msg.retry_count = task.retry_count
    if task.max_retries:
        msg.max_retries = task.max_retries
    backoff = msg.retry_backoff
    wire.write_duration(backoff.initial, task.backoff_initial_s)
    wire.write_duration(backoff.max, task.backoff_max_s)
    backoff.multiplier = task.backoff_multiplier
    if task.strict_timing:
        msg.strict_timing = True
    if task.idempotent:
        msg.idempotent = True
    if task.idempotency_key:
        msg.idempotency_key = task.idempotency_key
    if task.job_id:
        msg.job_id = task.job_id
    if task.worker_id:
        msg.worker_id = task.worker_id
    msg.shard = task.shard
    if task.trace_context:
        msg.trace_context.update(task.trace_context)
    if task.unresolved_dependencies:
        msg.unresolved_dependencies = task.unresolved_dependencies
    if task.workflow_id:
        msg.workflow_id = str(task.workflow_id)
    if task.schedule_id:
        msg.schedule_id = str(task.schedule_id)
    if include_payload:
        msg.payload_json = json_bytes(task.payload)
        if task.result_payload is not None:
            msg.result_json = json_bytes(task.result_payload)
        if task.checkpoint is not None:
            msg.checkpoint = bytes(task.checkpoint)
    if task.timeout_s is not None:
        wire.write_duration(msg.timeout, task.timeout_s)
    for name in ("lease_expires_at", "created_at", "updated_at", "finished_at", "logical_date"):
        value = getattr(task, name)
        if value is not None:
            write_ts(getattr(msg, name), value)


def attempt_to_pb(attempt: TaskAttempt) -> common_pb2.TaskAttempt:
    msg = common_pb2.TaskAttempt(
        attempt=attempt.attempt,
        fencing_token=attempt.fencing_token,
        state=attempt_state_to_pb(attempt.state),
        worker_id=attempt.worker_id or "",
        entered_at=ts_to_pb(attempt.entered_at),
        error=attempt.error or "",
        resolution=None if attempt.resolution is None else resolution_to_pb(attempt.resolution),
    )
    if attempt.finished_at is not None:
        msg.finished_at.CopyFrom(ts_to_pb(attempt.finished_at))
    return msg


MAX_NAME_TOKEN_CHARS = 1024


def name_page_token_to_pb(last: str) -> str:
    """A page token of a list ordered by a name (job ids, schedule names): opaque to
    clients, where the next page starts inside the caller's own tenant."""
    return base64.urlsafe_b64encode(last.encode("utf-8")).decode("ascii").rstrip("=")


def name_page_token_from_pb(token: str) -> str:
    """The name a :func:`name_page_token_to_pb` token holds; "" for the first page."""
    if token == "":
        return ""
    try:
        if len(token) > MAX_NAME_TOKEN_CHARS:
            raise ValueError("too long")
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        after = raw.decode("utf-8")
        if "\x00" in after:  # no name has one; PostgreSQL text cannot hold it
            raise ValueError("NUL")
        return after
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidArgument("page_token", "not a token this server issued") from None

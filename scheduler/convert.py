"""Conversions between the wire (``chronoshard.v1`` messages) and the scheduler's models.

Only the servicers (``api``, ``gateway``, ``admin``) and this module import generated
code (STYLE #7). Parsing a request field either returns a model value or raises
:class:`~chronoshard.scheduler.errors.InvalidArgument` naming the field, so every
servicer reports bad input the same way.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from chronoshard.scheduler.errors import InvalidArgument, SchedulerError
from chronoshard.scheduler.jitter import JitterMode
from chronoshard.scheduler.models import Priority, Task, TaskAttempt, TaskRef
from chronoshard.scheduler.states import AttemptState, TaskStatus
from chronoshard.v1 import common_pb2

_JITTER_BY_NAME = {
    "JITTER_MODE_SYMMETRIC": JitterMode.SYMMETRIC,
    "JITTER_MODE_NONE": JitterMode.NONE,
    "JITTER_MODE_DELAY_ONLY": JitterMode.DELAY_ONLY,
}

# Enum values go out by name: the generated constructors accept names, and names are what
# the database stores (minus the prefix), so no table of numbers is kept here.


def status_to_pb(status: TaskStatus) -> str:
    return f"TASK_STATUS_{status.value}"


def status_from_pb(value: int, field: str) -> TaskStatus:
    name = _enum_name(common_pb2.TaskStatus, value, field)
    if name == "TASK_STATUS_UNSPECIFIED":
        raise InvalidArgument(field, "task status must be specified")
    return TaskStatus(name.removeprefix("TASK_STATUS_"))


def attempt_state_to_pb(state: AttemptState) -> str:
    return f"ATTEMPT_STATE_{state.value}"


def priority_to_pb(priority: Priority) -> str:
    return f"PRIORITY_{priority.value.upper()}"


def priority_from_pb(value: int, field: str = "priority") -> Priority:
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
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value.astimezone(UTC))
    return ts


def ts_from_pb(value: timestamp_pb2.Timestamp, field: str) -> datetime:
    try:
        return value.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError) as exc:
        raise InvalidArgument(field, f"not a valid timestamp: {exc}") from exc


def duration_to_pb(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=seconds))
    return d


def duration_from_pb(value: duration_pb2.Duration, field: str) -> float:
    if value.nanos < -999_999_999 or value.nanos > 999_999_999:
        raise InvalidArgument(field, "nanos out of range")
    return value.seconds + value.nanos / 1e9


def uuid_from_pb(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError) as exc:
        raise InvalidArgument(field, f"not a UUID: {value!r}") from exc


def ref_from_pb(ref: common_pb2.TaskRef, field: str = "task") -> TaskRef:
    if not ref.HasField("scheduled_at"):
        raise InvalidArgument(f"{field}.scheduled_at", "required")
    return TaskRef(
        ts_from_pb(ref.scheduled_at, f"{field}.scheduled_at"), uuid_from_pb(ref.id, f"{field}.id")
    )


def ref_to_pb(ref: TaskRef) -> common_pb2.TaskRef:
    return common_pb2.TaskRef(id=str(ref.id), scheduled_at=ts_to_pb(ref.scheduled_at))


def json_bytes(value: object) -> bytes:
    if value is None:
        return b""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def task_to_pb(task: Task, *, include_payload: bool = True) -> common_pb2.Task:
    msg = common_pb2.Task(
        id=str(task.id),
        tenant_id=str(task.tenant_id),
        type=task.type,
        status=status_to_pb(task.status),
        scheduled_at=ts_to_pb(task.scheduled_at),
        due_at=ts_to_pb(task.due_at),
        priority=priority_to_pb(task.priority),
        queue=task.queue,
        last_error=task.last_error or "",
        attempt=task.attempt,
        fencing_token=task.fencing_token,
        retry_count=task.retry_count,
        max_retries=task.max_retries,
        retry_backoff=common_pb2.RetryBackoff(
            initial=duration_to_pb(task.backoff_initial_s),
            max=duration_to_pb(task.backoff_max_s),
            multiplier=task.backoff_multiplier,
        ),
        strict_timing=task.strict_timing,
        idempotent=task.idempotent,
        idempotency_key=task.idempotency_key or "",
        job_id=task.job_id or "",
        worker_id=task.worker_id or "",
        shard=task.shard,
        trace_context=task.trace_context or {},
        unresolved_dependencies=task.unresolved_dependencies,
        workflow_id=str(task.workflow_id) if task.workflow_id else "",
        schedule_id=str(task.schedule_id) if task.schedule_id else "",
    )
    if include_payload:
        msg.payload_json = json_bytes(task.payload)
        msg.result_json = json_bytes(task.result_payload)
        if task.checkpoint is not None:
            msg.checkpoint = bytes(task.checkpoint)
    if task.timeout_s is not None:
        msg.timeout.CopyFrom(duration_to_pb(task.timeout_s))
    for name in ("lease_expires_at", "created_at", "updated_at", "finished_at", "logical_date"):
        value = getattr(task, name)
        if value is not None:
            getattr(msg, name).CopyFrom(ts_to_pb(value))
    return msg


def attempt_to_pb(attempt: TaskAttempt) -> common_pb2.TaskAttempt:
    msg = common_pb2.TaskAttempt(
        attempt=attempt.attempt,
        fencing_token=attempt.fencing_token,
        state=attempt_state_to_pb(attempt.state),
        worker_id=attempt.worker_id or "",
        entered_at=ts_to_pb(attempt.entered_at),
        error=attempt.error or "",
    )
    if attempt.finished_at is not None:
        msg.finished_at.CopyFrom(ts_to_pb(attempt.finished_at))
    return msg


def error_info(error: SchedulerError) -> common_pb2.ErrorInfo:
    return common_pb2.ErrorInfo(
        code=error.grpc_code_name,
        reason=error.reason,
        message=str(error),
        field=getattr(error, "field", "") or "",
        retryable=error.retryable,
    )

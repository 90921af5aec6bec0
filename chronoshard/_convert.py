"""The client's protobuf adapter: chronoshard.v1 messages <-> the types of ``chronoshard.types``.

This is the only module of the client that builds or reads generated messages (STYLE #7).
The mapping follows the proto's conventions one field at a time: a proto enum value is the
enum's prefix plus the state machine's name (``TASK_STATUS_DEAD_LETTER`` <->
``TaskStatus.DEAD_LETTER``, ``PRIORITY_BULK`` <-> ``Priority.BULK``); an unset
Timestamp/Duration and an empty string or ``bytes`` become ``None``; Timestamps become aware
UTC datetimes (microsecond precision, as PostgreSQL stores them) and Durations float
seconds; ``*_json`` bytes are decoded with exact numbers (:mod:`chronoshard.exact_json`: a
number a float cannot hold exactly comes back as a ``decimal.Decimal``, never rounded).
Anything the server sends that this client cannot read raises
:class:`~chronoshard.errors.ProtocolError` instead of a bare ValueError deep inside a call.

Payloads are encoded compactly (``separators=(",", ":")``, UTF-8, no NaN/Infinity since
neither is JSON nor storable in JSONB), because the server bounds payloads by their size;
a ``decimal.Decimal`` in a payload is sent exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from chronoshard import batching, exact_json, wire
from chronoshard.errors import ChronoshardError, ProtocolError, error_for, status_code_from_name
from chronoshard.types import (
    AlertSeverity,
    AttemptState,
    BackfillResult,
    CatchupPolicy,
    Incident,
    JitterMode,
    OverlapPolicy,
    Priority,
    Resolution,
    RetryPolicy,
    RunOrigin,
    Schedule,
    ScheduleDetails,
    SchedulePage,
    ScheduleRun,
    ScheduleSpec,
    ScheduleWatch,
    SubmitResult,
    Task,
    TaskAttempt,
    TaskPage,
    TaskSpec,
    TaskStatus,
    TriggerRule,
    WorkerSession,
    WorkerSessionPage,
    Workflow,
    WorkflowCancelResult,
    WorkflowCreateResult,
    WorkflowDetail,
    WorkflowEdge,
    WorkflowPage,
    WorkflowRetryResult,
    WorkflowState,
    WorkflowTask,
    WorkflowTaskState,
    WorkflowTemplate,
    coerce_enum,
    require_aware,
)
from chronoshard.v1 import (
    admin_service_pb2,
    common_pb2,
    schedule_service_pb2,
    task_service_pb2,
    watchdog_service_pb2,
    workflow_service_pb2,
)

_E = TypeVar("_E", bound=StrEnum)

_STATUS_PREFIX = "TASK_STATUS_"
_PRIORITY_PREFIX = "PRIORITY_"
_JITTER_PREFIX = "JITTER_MODE_"
_ATTEMPT_PREFIX = "ATTEMPT_STATE_"
_RESOLUTION_PREFIX = "RESOLUTION_"
_CATCHUP_PREFIX = "CATCHUP_POLICY_"
_OVERLAP_PREFIX = "OVERLAP_POLICY_"
_TRIGGER_PREFIX = "TRIGGER_RULE_"
_WORKFLOW_STATE_PREFIX = "WORKFLOW_STATE_"


# --- scalars -----------------------------------------------------------------------------


def encode_payload(payload: Mapping[str, Any] | None) -> bytes:
    """A JSON object as compact UTF-8; None is ``b""`` (the server reads it as ``{}``).

    Raises TypeError for anything that is not a JSON-serialisable object, before any call.
    """
    if payload is None:
        return b""
    if not isinstance(payload, Mapping):
        raise TypeError(f"payload must be a dict (a JSON object), got {type(payload).__name__}")
    try:
        return exact_json.dumps(dict(payload)).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # NaN, cycles, lone surrogates
        raise TypeError(f"payload is not JSON-serialisable: {exc}") from exc


def decode_json(data: bytes, what: str) -> Any:
    """Decode a ``*_json`` field, numbers exact (:mod:`chronoshard.exact_json`: a float
    where a float is the number, else a Decimal); empty bytes (not sent) are None."""
    if not data:
        return None
    try:
        return exact_json.loads(data)
    except (ValueError, RecursionError) as exc:  # incl. JSONDecodeError, UnicodeDecodeError
        raise ProtocolError(
            f"server sent {what} that is not UTF-8 JSON: {exc}", reason="PROTOCOL_ERROR"
        ) from exc


def timestamp(value: datetime, argument: str) -> timestamp_pb2.Timestamp:
    """An aware datetime as a Timestamp; a naive one is a ValueError naming ``argument``."""
    return wire.timestamp_to_pb(require_aware(value, argument))


def duration(seconds: float, argument: str) -> duration_pb2.Duration:
    """Float seconds as a Duration, exact to the nanosecond."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"{argument} must be a number of seconds, got {type(seconds).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(f"{argument} must be finite, got {seconds}")
    return wire.duration_to_pb(seconds)


def _datetime(msg: Any, field: str) -> datetime | None:
    if not msg.HasField(field):
        return None
    return wire.timestamp_from_pb(getattr(msg, field))


def _seconds(msg: Any, field: str) -> float | None:
    if not msg.HasField(field):
        return None
    return wire.duration_seconds(getattr(msg, field))


def _text(value: str) -> str | None:
    return value or None


def _enum_from_pb(enum: type[_E], pb_enum: Any, prefix: str, value: int, *, lower: bool) -> _E:
    try:
        name = pb_enum.Name(value)
        if not name.startswith(prefix) or name.endswith("_UNSPECIFIED"):
            raise ValueError(name)
        suffix = name.removeprefix(prefix)
        return enum(suffix.lower() if lower else suffix)
    except ValueError as exc:
        raise ProtocolError(
            f"server sent {enum.__name__} value {value}, which this client does not know "
            "(is the client older than the server?)",
            reason="PROTOCOL_ERROR",
        ) from exc


def _enum_to_pb(pb_enum: Any, prefix: str, member: StrEnum) -> Any:
    return pb_enum.Value(prefix + member.value.upper())


def incident_from_pb(msg: watchdog_service_pb2.Incident) -> Incident:
    severity = watchdog_service_pb2.Severity.Name(msg.severity).removeprefix("SEVERITY_")
    opened_at = _datetime(msg, "opened_at")
    if opened_at is None:
        raise ProtocolError("the server sent an incident without opened_at")
    return Incident(
        id=msg.id,
        kind=msg.kind,
        job_id=_text(msg.job_id),
        severity=severity.lower(),
        summary=msg.summary,
        opened_at=opened_at,
        resolved_at=_datetime(msg, "resolved_at"),
        tenant_id=_text(msg.tenant_id),
        tenant_name=msg.tenant_name,
    )


def worker_session_from_pb(msg: admin_service_pb2.WorkerSession) -> WorkerSession:
    reported_at = _datetime(msg, "reported_at")
    if reported_at is None:
        raise ProtocolError("the server sent a worker session without reported_at")
    return WorkerSession(
        worker_id=msg.worker_id,
        node_id=msg.node_id,
        session_id=msg.session_id,
        tenant_id=_text(msg.tenant_id),
        tenant_name=msg.tenant_name,
        queues=tuple(msg.queues),
        task_types=tuple(msg.task_types),
        slots=msg.slots,
        credits=msg.credits,
        running=msg.running,
        draining=msg.draining,
        connected_at=_datetime(msg, "connected_at"),
        reported_at=reported_at,
    )


def worker_session_page_from_pb(
    msg: admin_service_pb2.ListWorkerSessionsResponse,
) -> WorkerSessionPage:
    return WorkerSessionPage(
        sessions=tuple(worker_session_from_pb(s) for s in msg.sessions),
        next_page_token=_text(msg.next_page_token),
        restricted=msg.restricted,
        answered_by=msg.node_id,
    )


def status_to_pb(status: TaskStatus) -> common_pb2.TaskStatus:
    value: common_pb2.TaskStatus = _enum_to_pb(common_pb2.TaskStatus, _STATUS_PREFIX, status)
    return value


def priority_to_pb(priority: Priority | None) -> common_pb2.Priority:
    if priority is None:
        return common_pb2.PRIORITY_UNSPECIFIED
    value: common_pb2.Priority = _enum_to_pb(common_pb2.Priority, _PRIORITY_PREFIX, priority)
    return value


def jitter_to_pb(mode: JitterMode | None) -> common_pb2.JitterMode:
    if mode is None:
        return common_pb2.JITTER_MODE_UNSPECIFIED
    value: common_pb2.JitterMode = _enum_to_pb(common_pb2.JitterMode, _JITTER_PREFIX, mode)
    return value


# --- messages -> types -------------------------------------------------------------------


def attempt_from_pb(msg: common_pb2.TaskAttempt) -> TaskAttempt:
    return TaskAttempt(
        attempt=msg.attempt,
        fencing_token=msg.fencing_token,
        state=_enum_from_pb(
            AttemptState, common_pb2.AttemptState, _ATTEMPT_PREFIX, msg.state, lower=False
        ),
        worker_id=_text(msg.worker_id),
        entered_at=_datetime(msg, "entered_at"),
        finished_at=_datetime(msg, "finished_at"),
        error=_text(msg.error),
        resolution=(
            None
            if msg.resolution == common_pb2.RESOLUTION_UNSPECIFIED
            else _enum_from_pb(
                Resolution, common_pb2.Resolution, _RESOLUTION_PREFIX, msg.resolution, lower=False
            )
        ),
    )


def resolution_to_pb(resolution: Resolution | str) -> common_pb2.Resolution:
    """Raises ValueError naming the choices for a string that is no Resolution."""
    member = coerce_enum(Resolution, resolution, "resolution")
    value: common_pb2.Resolution = _enum_to_pb(common_pb2.Resolution, _RESOLUTION_PREFIX, member)
    return value


def task_from_pb(msg: common_pb2.Task, attempts: Iterable[common_pb2.TaskAttempt] = ()) -> Task:
    backoff = msg.retry_backoff
    return Task(
        id=msg.id,
        tenant_id=msg.tenant_id,
        type=msg.type,
        status=_enum_from_pb(
            TaskStatus, common_pb2.TaskStatus, _STATUS_PREFIX, msg.status, lower=False
        ),
        scheduled_at=_datetime(msg, "scheduled_at"),
        due_at=_datetime(msg, "due_at"),
        # The proto documents UNSPECIFIED as "the server applies STANDARD".
        priority=(
            Priority.STANDARD
            if msg.priority == common_pb2.PRIORITY_UNSPECIFIED
            else _enum_from_pb(
                Priority, common_pb2.Priority, _PRIORITY_PREFIX, msg.priority, lower=True
            )
        ),
        queue=msg.queue,
        payload=decode_json(msg.payload_json, "payload_json"),
        result=decode_json(msg.result_json, "result_json"),
        last_error=_text(msg.last_error),
        attempt=msg.attempt,
        fencing_token=msg.fencing_token,
        retry_count=msg.retry_count,
        retry_policy=RetryPolicy(
            max_retries=msg.max_retries,
            initial_backoff_s=_seconds(backoff, "initial"),
            max_backoff_s=_seconds(backoff, "max"),
            multiplier=backoff.multiplier or None,
        ),
        timeout_s=_seconds(msg, "timeout"),
        strict_timing=msg.strict_timing,
        idempotent=msg.idempotent,
        idempotency_key=_text(msg.idempotency_key),
        job_id=_text(msg.job_id),
        worker_id=_text(msg.worker_id),
        lease_expires_at=_datetime(msg, "lease_expires_at"),
        checkpoint=msg.checkpoint or None,
        shard=msg.shard,
        trace_context=dict(msg.trace_context),
        created_at=_datetime(msg, "created_at"),
        updated_at=_datetime(msg, "updated_at"),
        finished_at=_datetime(msg, "finished_at"),
        workflow_id=_text(msg.workflow_id),
        unresolved_dependencies=msg.unresolved_dependencies,
        schedule_id=_text(msg.schedule_id),
        logical_date=_datetime(msg, "logical_date"),
        attempts=tuple(attempt_from_pb(a) for a in attempts),
        waiting_reason=_text(msg.waiting_reason),
    )


def submit_result_from_pb(msg: task_service_pb2.SubmitTaskResponse) -> SubmitResult:
    # The task is decoded when the caller first reads it (SubmitResult.task).
    return SubmitResult.decoded_later(functools.partial(task_from_pb, msg.task), msg.created)


def error_from_info(
    info: common_pb2.ErrorInfo, *, retry_after_s: float | None = None
) -> ChronoshardError:
    """The exception (not raised) for an ErrorInfo carried inside a response (with the
    wait a quota refusal asks, where the response carries one)."""
    return error_for(
        status_code_from_name(info.code),
        info.message or info.reason or info.code,
        reason=info.reason or None,
        field=info.field or None,
        retryable=info.retryable,
        retry_after_s=retry_after_s,
    )


def batch_results_from_pb(
    msg: task_service_pb2.SubmitBatchResponse, expected: int
) -> list[SubmitResult | ChronoshardError]:
    if len(msg.results) != expected:
        raise ProtocolError(
            f"SubmitBatch answered {len(msg.results)} results for {expected} items",
            reason="PROTOCOL_ERROR",
        )
    out: list[SubmitResult | ChronoshardError] = []
    for item in msg.results:
        outcome = item.WhichOneof("outcome")
        if outcome == "submitted":
            out.append(submit_result_from_pb(item.submitted))
        elif outcome == "error":
            out.append(error_from_info(item.error))
        else:
            out.append(
                ProtocolError(
                    "SubmitBatch result with neither task nor error",
                    code=grpc.StatusCode.INTERNAL,
                    reason="PROTOCOL_ERROR",
                )
            )
    return out


def page_from_pb(msg: task_service_pb2.ListTasksResponse) -> TaskPage:
    return TaskPage(
        tasks=tuple(task_from_pb(t) for t in msg.tasks),
        next_page_token=msg.next_page_token or None,
    )


# --- types -> messages -------------------------------------------------------------------


def submit_request(spec: TaskSpec) -> task_service_pb2.SubmitTaskRequest:
    """The request for one spec; raises TypeError/ValueError for what cannot be encoded."""
    req = task_service_pb2.SubmitTaskRequest(
        type=spec.type,
        payload_json=encode_payload(spec.payload),
        priority=priority_to_pb(spec.priority),
        queue=spec.queue,
        strict_timing=spec.strict_timing,
        jitter_mode=jitter_to_pb(spec.jitter),
        idempotent=spec.idempotent,
        idempotency_key=spec.idempotency_key or "",
        job_id=spec.job_id or "",
    )
    if spec.at is not None:
        req.scheduled_at.CopyFrom(timestamp(spec.at, "at"))
    elif spec.delay_s is not None:
        req.delay.CopyFrom(duration(spec.delay_s, "delay_s"))
    max_retries = spec.effective_max_retries
    if max_retries is not None:
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        req.max_retries = max_retries
    if spec.retry is not None:
        if spec.retry.initial_backoff_s is not None:
            req.retry_backoff.initial.CopyFrom(
                duration(spec.retry.initial_backoff_s, "retry.initial_backoff_s")
            )
        if spec.retry.max_backoff_s is not None:
            req.retry_backoff.max.CopyFrom(
                duration(spec.retry.max_backoff_s, "retry.max_backoff_s")
            )
        if spec.retry.multiplier is not None:
            req.retry_backoff.multiplier = spec.retry.multiplier
    if spec.timeout_s is not None:
        req.timeout.CopyFrom(duration(spec.timeout_s, "timeout_s"))
    if spec.jitter_window_s is not None:
        req.jitter_window.CopyFrom(duration(spec.jitter_window_s, "jitter_window_s"))
    return req


def list_request(
    *,
    statuses: TaskStatus | str | Iterable[TaskStatus | str] | None,
    type: str | None,
    queue: str | None,
    job_id: str | None,
    scheduled_from: datetime | None,
    scheduled_before: datetime | None,
    due_from: datetime | None,
    due_before: datetime | None,
    page_size: int,
    page_token: str | None,
    include_payloads: bool,
) -> task_service_pb2.ListTasksRequest:
    if isinstance(statuses, str):  # a TaskStatus is a str too: one status, not its letters
        statuses = [statuses]
    if page_size < 0:
        raise ValueError(f"page_size must be >= 0 (0: the server default), got {page_size}")
    req = task_service_pb2.ListTasksRequest(
        statuses=[status_to_pb(coerce_enum(TaskStatus, s, "statuses")) for s in statuses or ()],
        type=type or "",
        queue=queue or "",
        job_id=job_id or "",
        page_size=page_size,
        page_token=page_token or "",
        include_payloads=include_payloads,
    )
    for range_msg, start, end, names in (
        (
            req.scheduled_at,
            scheduled_from,
            scheduled_before,
            ("scheduled_from", "scheduled_before"),
        ),
        (req.due_at, due_from, due_before, ("due_from", "due_before")),
    ):
        if start is not None:
            range_msg.start.CopyFrom(timestamp(start, names[0]))
        if end is not None:
            range_msg.end.CopyFrom(timestamp(end, names[1]))
    return req


def attempt_to_pb(attempt: TaskAttempt) -> common_pb2.TaskAttempt:
    msg = common_pb2.TaskAttempt(
        attempt=attempt.attempt,
        fencing_token=attempt.fencing_token,
        state=_enum_to_pb(common_pb2.AttemptState, _ATTEMPT_PREFIX, attempt.state),
        worker_id=attempt.worker_id or "",
        error=attempt.error or "",
        resolution=(
            common_pb2.RESOLUTION_UNSPECIFIED
            if attempt.resolution is None
            else resolution_to_pb(attempt.resolution)
        ),
    )
    _set_time(msg, "entered_at", attempt.entered_at)
    _set_time(msg, "finished_at", attempt.finished_at)
    return msg


def task_to_pb(task: Task) -> common_pb2.Task:
    """The inverse of :func:`task_from_pb` (``attempts`` travel beside the task, not in it).

    The client never sends a Task; this exists for test doubles of the server and for the
    round-trip tests that pin the mapping of every field.
    """
    msg = common_pb2.Task(
        id=task.id,
        tenant_id=task.tenant_id,
        type=task.type,
        status=status_to_pb(task.status),
        priority=priority_to_pb(task.priority),
        queue=task.queue,
        payload_json=b"" if task.payload is None else _encode_any(task.payload),
        result_json=b"" if task.result is None else _encode_any(task.result),
        last_error=task.last_error or "",
        attempt=task.attempt,
        fencing_token=task.fencing_token,
        retry_count=task.retry_count,
        max_retries=task.retry_policy.max_retries or 0,
        strict_timing=task.strict_timing,
        idempotent=task.idempotent,
        idempotency_key=task.idempotency_key or "",
        job_id=task.job_id or "",
        worker_id=task.worker_id or "",
        checkpoint=task.checkpoint or b"",
        shard=task.shard,
        trace_context=dict(task.trace_context),
        workflow_id=task.workflow_id or "",
        unresolved_dependencies=task.unresolved_dependencies,
        schedule_id=task.schedule_id or "",
        waiting_reason=task.waiting_reason or "",
    )
    policy = task.retry_policy
    if policy.initial_backoff_s is not None:
        msg.retry_backoff.initial.CopyFrom(duration(policy.initial_backoff_s, "initial_backoff_s"))
    if policy.max_backoff_s is not None:
        msg.retry_backoff.max.CopyFrom(duration(policy.max_backoff_s, "max_backoff_s"))
    if policy.multiplier is not None:
        msg.retry_backoff.multiplier = policy.multiplier
    if task.timeout_s is not None:
        msg.timeout.CopyFrom(duration(task.timeout_s, "timeout_s"))
    for name in (
        "scheduled_at",
        "due_at",
        "lease_expires_at",
        "created_at",
        "updated_at",
        "finished_at",
        "logical_date",
    ):
        _set_time(msg, name, getattr(task, name))
    return msg


def _set_time(msg: Any, field: str, value: datetime | None) -> None:
    if value is not None:
        getattr(msg, field).CopyFrom(timestamp(value, field))


def _encode_any(value: Any) -> bytes:
    return exact_json.dumps(value).encode("utf-8")


def chunk_requests(
    requests: Sequence[task_service_pb2.SubmitTaskRequest], *, max_items: int, max_bytes: int
) -> list[list[task_service_pb2.SubmitTaskRequest]]:
    """Split batch items into chunks of at most ``max_items`` items and, where possible,
    ``max_bytes`` serialized bytes (so a chunk of big payloads stays under the server's
    message limit), by the one bounded packer (:func:`chronoshard.batching.chunk`). An
    item bigger than ``max_bytes`` goes alone: the server's answer about it is more useful
    than a client-side guess. Order is preserved."""
    return batching.chunk(requests, _batch_item_size, max_items=max_items, max_bytes=max_bytes)


def _batch_item_size(request: task_service_pb2.SubmitTaskRequest) -> int:
    # Each repeated item costs its length plus a tag and a varint length prefix.
    return batching.encoded_size(request) + 6


# --- task template (the inverse of submit_request) -----------------------------------------


def task_spec_from_pb(msg: task_service_pb2.SubmitTaskRequest) -> TaskSpec:
    """The spec :func:`submit_request` builds ``msg`` from: ``submit_request`` of the
    result is ``msg`` again. A schedule's task template travels as a SubmitTaskRequest,
    and the CLI's ``schedules update`` sends back what it read, so this must lose
    nothing. Raises ProtocolError for what no TaskSpec holds (a payload that is not an
    object, an unknown enum value)."""
    backoff = msg.retry_backoff
    retry = RetryPolicy(
        initial_backoff_s=_seconds(backoff, "initial"),
        max_backoff_s=_seconds(backoff, "max"),
        multiplier=backoff.multiplier or None,
    )
    try:
        return TaskSpec(
            type=msg.type,
            payload=decode_json(msg.payload_json, "payload_json"),
            at=_datetime(msg, "scheduled_at"),
            delay_s=_seconds(msg, "delay"),
            priority=(
                None
                if msg.priority == common_pb2.PRIORITY_UNSPECIFIED
                else _enum_from_pb(
                    Priority, common_pb2.Priority, _PRIORITY_PREFIX, msg.priority, lower=True
                )
            ),
            queue=msg.queue,
            max_retries=msg.max_retries if msg.HasField("max_retries") else None,
            # submit_request leaves retry_backoff unset for a policy of only None fields.
            retry=None if retry == RetryPolicy() else retry,
            timeout_s=_seconds(msg, "timeout"),
            strict_timing=msg.strict_timing,
            jitter=(
                None
                if msg.jitter_mode == common_pb2.JITTER_MODE_UNSPECIFIED
                else _enum_from_pb(
                    JitterMode, common_pb2.JitterMode, _JITTER_PREFIX, msg.jitter_mode, lower=True
                )
            ),
            jitter_window_s=_seconds(msg, "jitter_window"),
            idempotent=msg.idempotent,
            idempotency_key=_text(msg.idempotency_key),
            job_id=_text(msg.job_id),
        )
    except (TypeError, ValueError) as exc:  # a payload that is no object, ...
        raise ProtocolError(
            f"server sent a task template this client cannot read: {exc}", reason="PROTOCOL_ERROR"
        ) from exc


# --- schedules: types -> messages ----------------------------------------------------------


def catchup_to_pb(policy: CatchupPolicy | None) -> schedule_service_pb2.CatchupPolicy:
    if policy is None:
        return schedule_service_pb2.CATCHUP_POLICY_UNSPECIFIED
    value: schedule_service_pb2.CatchupPolicy = _enum_to_pb(
        schedule_service_pb2.CatchupPolicy, _CATCHUP_PREFIX, policy
    )
    return value


def overlap_to_pb(policy: OverlapPolicy | None) -> schedule_service_pb2.OverlapPolicy:
    if policy is None:
        return schedule_service_pb2.OVERLAP_POLICY_UNSPECIFIED
    value: schedule_service_pb2.OverlapPolicy = _enum_to_pb(
        schedule_service_pb2.OverlapPolicy, _OVERLAP_PREFIX, policy
    )
    return value


def watch_to_pb(watch: ScheduleWatch) -> schedule_service_pb2.ScheduleWatch:
    msg = schedule_service_pb2.ScheduleWatch(
        disabled=watch.disabled,
        severity="" if watch.severity is None else watch.severity.value,
    )
    if watch.expected_duration_s is not None:
        msg.expected_duration.CopyFrom(
            duration(watch.expected_duration_s, "watch.expected_duration_s")
        )
    if watch.tolerance_s is not None:
        msg.tolerance.CopyFrom(duration(watch.tolerance_s, "watch.tolerance_s"))
    return msg


def schedule_spec_to_pb(spec: ScheduleSpec) -> schedule_service_pb2.ScheduleSpec:
    """The message for a spec; the template is :func:`submit_request` of ``spec.task``
    or :func:`workflow_template_to_pb` of ``spec.workflow`` (the one builder of each).
    Raises TypeError/ValueError for what cannot be encoded, naming the argument."""
    msg = schedule_service_pb2.ScheduleSpec(
        name=spec.name,
        timezone=spec.timezone or "",
        catchup_policy=catchup_to_pb(spec.catchup),
        overlap_policy=overlap_to_pb(spec.overlap),
        job_id=spec.job_id or "",
        watch=watch_to_pb(spec.watch),
    )
    argument = "task" if spec.workflow is None else "workflow"
    try:
        if spec.workflow is not None:
            msg.workflow_template.CopyFrom(workflow_template_to_pb(spec.workflow))
        elif spec.task is not None:
            msg.task_template.CopyFrom(submit_request(spec.task))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{argument}: {exc}") from exc
    if spec.cron is not None:
        msg.cron = spec.cron
    elif spec.interval_s is not None:
        msg.interval.CopyFrom(duration(spec.interval_s, "interval_s"))
    _set_time(msg, "start_at", spec.start_at)
    _set_time(msg, "end_at", spec.end_at)
    if spec.catchup_limit is not None:
        limit = spec.catchup_limit
        # uint32 on the wire: protobuf's own error for -1 would not name the argument.
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 2**32:
            raise ValueError(f"catchup_limit must be an int >= 0, got {limit!r}")
        msg.catchup_limit = limit
    if spec.misfire_grace_s is not None:
        msg.misfire_grace.CopyFrom(duration(spec.misfire_grace_s, "misfire_grace_s"))
    return msg


def backfill_request(
    schedule: str, start: datetime, end: datetime
) -> schedule_service_pb2.BackfillScheduleRequest:
    return schedule_service_pb2.BackfillScheduleRequest(
        id=schedule, start=timestamp(start, "start"), end=timestamp(end, "end")
    )


def schedule_run_to_pb(run: ScheduleRun) -> schedule_service_pb2.ScheduleRun:
    """The inverse of :func:`schedule_run_from_pb` (for test doubles and round trips)."""
    msg = schedule_service_pb2.ScheduleRun(
        logical_date=timestamp(run.logical_date, "logical_date"),
        origin=run.origin.value,
        task_id=run.task_id or "",
        workflow_id=run.workflow_id or "",
        status=(
            common_pb2.TASK_STATUS_UNSPECIFIED if run.status is None else status_to_pb(run.status)
        ),
    )
    _set_time(msg, "finished_at", run.finished_at)
    return msg


def schedule_to_pb(schedule: Schedule) -> schedule_service_pb2.Schedule:
    """The inverse of :func:`schedule_from_pb` (for test doubles and round trips)."""
    msg = schedule_service_pb2.Schedule(
        id=schedule.id,
        tenant_id=schedule.tenant_id,
        spec=schedule_spec_to_pb(schedule.spec),
        paused=schedule.paused,
    )
    for name in ("next_occurrence", "created_at", "updated_at"):
        _set_time(msg, name, getattr(schedule, name))
    return msg


# --- schedules: messages -> types ----------------------------------------------------------


def _optional_enum(
    enum: type[_E], pb_enum: Any, prefix: str, value: int, *, lower: bool
) -> _E | None:
    """UNSPECIFIED (the field was not given) is None; anything else as _enum_from_pb."""
    if value == 0:
        return None
    return _enum_from_pb(enum, pb_enum, prefix, value, lower=lower)


def _string_enum(enum: type[_E], value: str, what: str) -> _E:
    try:
        return enum(value)
    except ValueError:
        raise ProtocolError(
            f"server sent {what} {value!r}, which this client does not know "
            "(is the client older than the server?)",
            reason="PROTOCOL_ERROR",
        ) from None


def watch_from_pb(msg: schedule_service_pb2.ScheduleWatch) -> ScheduleWatch:
    return ScheduleWatch(
        disabled=msg.disabled,
        expected_duration_s=_seconds(msg, "expected_duration"),
        tolerance_s=_seconds(msg, "tolerance"),
        severity=(
            None if not msg.severity else _string_enum(AlertSeverity, msg.severity, "severity")
        ),
    )


def schedule_spec_from_pb(msg: schedule_service_pb2.ScheduleSpec) -> ScheduleSpec:
    """Raises ProtocolError for a spec no :class:`ScheduleSpec` holds (no rule, no
    template or both, a template with a time or a key: the contract says the server
    never sends one)."""
    rule = msg.WhichOneof("rule")
    try:
        return ScheduleSpec(
            name=msg.name,
            task=task_spec_from_pb(msg.task_template) if msg.HasField("task_template") else None,
            workflow=(
                workflow_template_from_pb(msg.workflow_template)
                if msg.HasField("workflow_template")
                else None
            ),
            cron=msg.cron if rule == "cron" else None,
            interval_s=_seconds(msg, "interval") if rule == "interval" else None,
            timezone=_text(msg.timezone),
            start_at=_datetime(msg, "start_at"),
            end_at=_datetime(msg, "end_at"),
            catchup=_optional_enum(
                CatchupPolicy,
                schedule_service_pb2.CatchupPolicy,
                _CATCHUP_PREFIX,
                msg.catchup_policy,
                lower=True,
            ),
            catchup_limit=msg.catchup_limit if msg.HasField("catchup_limit") else None,
            overlap=_optional_enum(
                OverlapPolicy,
                schedule_service_pb2.OverlapPolicy,
                _OVERLAP_PREFIX,
                msg.overlap_policy,
                lower=True,
            ),
            job_id=_text(msg.job_id),
            watch=watch_from_pb(msg.watch),
            misfire_grace_s=_seconds(msg, "misfire_grace"),
        )
    except (TypeError, ValueError) as exc:
        raise ProtocolError(
            f"server sent schedule {msg.name!r} with a spec this client cannot read: {exc}",
            reason="PROTOCOL_ERROR",
        ) from exc


def schedule_from_pb(msg: schedule_service_pb2.Schedule) -> Schedule:
    return Schedule(
        id=msg.id,
        tenant_id=msg.tenant_id,
        spec=schedule_spec_from_pb(msg.spec),
        paused=msg.paused,
        next_occurrence=_datetime(msg, "next_occurrence"),
        created_at=_datetime(msg, "created_at"),
        updated_at=_datetime(msg, "updated_at"),
    )


def schedule_run_from_pb(msg: schedule_service_pb2.ScheduleRun) -> ScheduleRun:
    logical_date = _datetime(msg, "logical_date")
    if logical_date is None:  # the key of a run: a run without one is no run
        raise ProtocolError(
            "server sent a schedule run without its logical_date", reason="PROTOCOL_ERROR"
        )
    return ScheduleRun(
        logical_date=logical_date,
        origin=_string_enum(RunOrigin, msg.origin, "run origin"),
        task_id=_text(msg.task_id),
        workflow_id=_text(msg.workflow_id),
        status=_optional_enum(
            TaskStatus, common_pb2.TaskStatus, _STATUS_PREFIX, msg.status, lower=False
        ),
        finished_at=_datetime(msg, "finished_at"),
    )


def schedule_details_from_pb(msg: schedule_service_pb2.GetScheduleResponse) -> ScheduleDetails:
    return ScheduleDetails(
        schedule=schedule_from_pb(msg.schedule),
        next_occurrences=tuple(wire.timestamp_from_pb(t) for t in msg.next_occurrences),
        runs=tuple(schedule_run_from_pb(r) for r in msg.runs),
    )


def schedule_page_from_pb(msg: schedule_service_pb2.ListSchedulesResponse) -> SchedulePage:
    return SchedulePage(
        schedules=tuple(schedule_from_pb(s) for s in msg.schedules),
        next_page_token=msg.next_page_token or None,
    )


def backfill_result_from_pb(msg: schedule_service_pb2.BackfillScheduleResponse) -> BackfillResult:
    return BackfillResult(
        runs=tuple(schedule_run_from_pb(r) for r in msg.runs), existing=msg.existing
    )


# --- workflows: types -> messages ----------------------------------------------------------


def trigger_rule_to_pb(rule: TriggerRule | str) -> workflow_service_pb2.TriggerRule:
    """Always the rule itself, never UNSPECIFIED: what was sent is what is stored.
    Raises ValueError naming the choices for a string that is no TriggerRule."""
    member = coerce_enum(TriggerRule, rule, "trigger_rule")
    value: workflow_service_pb2.TriggerRule = _enum_to_pb(
        workflow_service_pb2.TriggerRule, _TRIGGER_PREFIX, member
    )
    return value


def workflow_state_to_pb(state: WorkflowState | str | None) -> workflow_service_pb2.WorkflowState:
    """None is UNSPECIFIED (a list filter of "any state")."""
    if state is None:
        return workflow_service_pb2.WORKFLOW_STATE_UNSPECIFIED
    member = coerce_enum(WorkflowState, state, "state")
    value: workflow_service_pb2.WorkflowState = _enum_to_pb(
        workflow_service_pb2.WorkflowState, _WORKFLOW_STATE_PREFIX, member
    )
    return value


def workflow_task_to_pb(task: WorkflowTask) -> workflow_service_pb2.WorkflowTask:
    """The task's spec through :func:`submit_request`, the one request builder."""
    if not isinstance(task, WorkflowTask):
        raise TypeError(f"must be a WorkflowTask, got {type(task).__name__}")
    try:
        template = submit_request(task.task)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"task: {exc}") from exc
    return workflow_service_pb2.WorkflowTask(
        ref=task.ref, task=template, trigger_rule=trigger_rule_to_pb(task.trigger_rule)
    )


def workflow_edge_to_pb(edge: WorkflowEdge | tuple[str, str]) -> workflow_service_pb2.WorkflowEdge:
    """An edge, or a ``(parent, child)`` pair of refs."""
    if isinstance(edge, WorkflowEdge):
        parent, child = edge.parent, edge.child
    elif isinstance(edge, tuple) and len(edge) == 2:
        parent, child = edge
    else:
        raise TypeError(
            f"must be a WorkflowEdge or a (parent, child) pair, got {type(edge).__name__}"
        )
    if not isinstance(parent, str) or not isinstance(child, str):
        raise TypeError("parent and child must be refs (str)")
    return workflow_service_pb2.WorkflowEdge(parent=parent, child=child)


def create_workflow_request(
    name: str,
    tasks: Iterable[WorkflowTask],
    edges: Iterable[WorkflowEdge | tuple[str, str]],
    *,
    at: datetime | None,
    delay_s: float | None,
    idempotency_key: str | None,
    job_id: str | None,
) -> workflow_service_pb2.CreateWorkflowRequest:
    """The whole request, built before any call. Raises TypeError/ValueError naming the
    item at fault (``tasks[3]: task: payload ...``, ``edges[7]: ...``): the indices are
    the request's, which are the ones the server's own errors name."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if at is not None and delay_s is not None:
        raise ValueError("give at most one of at and delay_s")
    request = workflow_service_pb2.CreateWorkflowRequest(
        name=name, idempotency_key=idempotency_key or "", job_id=job_id or ""
    )
    for index, task in enumerate(tasks):
        try:
            request.tasks.append(workflow_task_to_pb(task))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"tasks[{index}]: {exc}") from exc
    for index, edge in enumerate(edges):
        try:
            request.edges.append(workflow_edge_to_pb(edge))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"edges[{index}]: {exc}") from exc
    if at is not None:
        request.scheduled_at.CopyFrom(timestamp(at, "at"))
    elif delay_s is not None:
        request.delay.CopyFrom(duration(delay_s, "delay_s"))
    return request


def workflow_template_to_pb(
    template: WorkflowTemplate,
) -> workflow_service_pb2.CreateWorkflowRequest:
    """A schedule's workflow template: :func:`create_workflow_request` with no start, key
    or job (each occurrence and the schedule decide them)."""
    return create_workflow_request(
        template.name,
        template.tasks,
        template.edges,
        at=None,
        delay_s=None,
        idempotency_key=None,
        job_id=None,
    )


def list_workflows_request(
    state: WorkflowState | str | None, page_size: int, page_token: str | None
) -> workflow_service_pb2.ListWorkflowsRequest:
    if page_size < 0:
        raise ValueError(f"page_size must be >= 0 (0: the server default), got {page_size}")
    return workflow_service_pb2.ListWorkflowsRequest(
        page_size=page_size, page_token=page_token or "", state=workflow_state_to_pb(state)
    )


def workflow_to_pb(workflow: Workflow) -> workflow_service_pb2.Workflow:
    """The inverse of :func:`workflow_from_pb` (for test doubles and round trips)."""
    msg = workflow_service_pb2.Workflow(
        id=workflow.id,
        tenant_id=workflow.tenant_id,
        name=workflow.name,
        state=workflow_state_to_pb(workflow.state),
        task_count=workflow.task_count,
        edge_count=workflow.edge_count,
        idempotency_key=workflow.idempotency_key or "",
        job_id=workflow.job_id or "",
        schedule_id=workflow.schedule_id or "",
    )
    for name in ("scheduled_at", "created_at", "finished_at", "logical_date"):
        _set_time(msg, name, getattr(workflow, name))
    return msg


def workflow_create_result_to_pb(
    result: WorkflowCreateResult,
) -> workflow_service_pb2.CreateWorkflowResponse:
    """The inverse of :func:`workflow_create_result_from_pb`."""
    return workflow_service_pb2.CreateWorkflowResponse(
        workflow=workflow_to_pb(result.workflow),
        task_ids=dict(result.task_ids),
        created=result.created,
    )


def workflow_task_state_to_pb(state: WorkflowTaskState) -> workflow_service_pb2.WorkflowTaskState:
    """The inverse of :func:`workflow_task_state_from_pb`."""
    return workflow_service_pb2.WorkflowTaskState(
        ref=state.ref,
        task=task_to_pb(state.task),
        trigger_rule=trigger_rule_to_pb(state.trigger_rule),
        upstream_cause=state.upstream_cause or "",
    )


def workflow_detail_to_pb(detail: WorkflowDetail) -> workflow_service_pb2.GetWorkflowResponse:
    """The inverse of :func:`workflow_detail_from_pb`."""
    return workflow_service_pb2.GetWorkflowResponse(
        workflow=workflow_to_pb(detail.workflow),
        tasks=[workflow_task_state_to_pb(t) for t in detail.tasks],
        edges=[workflow_edge_to_pb(e) for e in detail.edges],
    )


def workflow_page_to_pb(page: WorkflowPage) -> workflow_service_pb2.ListWorkflowsResponse:
    """The inverse of :func:`workflow_page_from_pb`."""
    return workflow_service_pb2.ListWorkflowsResponse(
        workflows=[workflow_to_pb(w) for w in page.workflows],
        next_page_token=page.next_page_token or "",
    )


def workflow_cancel_result_to_pb(
    result: WorkflowCancelResult,
) -> workflow_service_pb2.CancelWorkflowResponse:
    """The inverse of :func:`workflow_cancel_result_from_pb`."""
    return workflow_service_pb2.CancelWorkflowResponse(
        workflow=workflow_to_pb(result.workflow),
        cancelled=result.cancelled,
        stopping=result.stopping,
    )


def workflow_retry_result_to_pb(
    result: WorkflowRetryResult,
) -> workflow_service_pb2.RetryWorkflowResponse:
    """The inverse of :func:`workflow_retry_result_from_pb`."""
    return workflow_service_pb2.RetryWorkflowResponse(
        workflow=workflow_to_pb(result.workflow), reopened=result.reopened
    )


# --- workflows: messages -> types ----------------------------------------------------------


def _trigger_rule_from_pb(value: int) -> TriggerRule:
    # The proto documents UNSPECIFIED as "not given: ALL_SUCCESS".
    if value == workflow_service_pb2.TRIGGER_RULE_UNSPECIFIED:
        return TriggerRule.ALL_SUCCESS
    return _enum_from_pb(
        TriggerRule, workflow_service_pb2.TriggerRule, _TRIGGER_PREFIX, value, lower=True
    )


def workflow_task_from_pb(msg: workflow_service_pb2.WorkflowTask) -> WorkflowTask:
    """The inverse of :func:`workflow_task_to_pb` (for test doubles of the server and
    round trips). Raises ProtocolError for a task no WorkflowTask holds (a template with
    a time or a key of its own)."""
    try:
        return WorkflowTask(
            ref=msg.ref,
            task=task_spec_from_pb(msg.task),
            trigger_rule=_trigger_rule_from_pb(msg.trigger_rule),
        )
    except (TypeError, ValueError) as exc:
        raise ProtocolError(
            f"workflow task {msg.ref!r} cannot be read: {exc}", reason="PROTOCOL_ERROR"
        ) from exc


def workflow_from_pb(msg: workflow_service_pb2.Workflow) -> Workflow:
    return Workflow(
        id=msg.id,
        tenant_id=msg.tenant_id,
        name=msg.name,
        state=_enum_from_pb(
            WorkflowState,
            workflow_service_pb2.WorkflowState,
            _WORKFLOW_STATE_PREFIX,
            msg.state,
            lower=False,
        ),
        scheduled_at=_datetime(msg, "scheduled_at"),
        created_at=_datetime(msg, "created_at"),
        finished_at=_datetime(msg, "finished_at"),
        task_count=msg.task_count,
        edge_count=msg.edge_count,
        idempotency_key=_text(msg.idempotency_key),
        job_id=_text(msg.job_id),
        schedule_id=_text(msg.schedule_id),
        logical_date=_datetime(msg, "logical_date"),
    )


def workflow_create_result_from_pb(
    msg: workflow_service_pb2.CreateWorkflowResponse,
) -> WorkflowCreateResult:
    return WorkflowCreateResult(
        workflow=workflow_from_pb(msg.workflow),
        task_ids=dict(msg.task_ids),
        created=msg.created,
    )


def workflow_edge_from_pb(msg: workflow_service_pb2.WorkflowEdge) -> WorkflowEdge:
    return WorkflowEdge(parent=msg.parent, child=msg.child)


def workflow_template_from_pb(msg: workflow_service_pb2.CreateWorkflowRequest) -> WorkflowTemplate:
    """The inverse of :func:`workflow_template_to_pb`: ``schedules update`` sends back
    what it read, so this loses nothing, and refuses (ProtocolError) what a template
    cannot hold rather than dropping it: a start, a key or a job of its own."""
    held = [
        name
        for name, given in (
            ("scheduled_at", msg.HasField("scheduled_at")),
            ("delay", msg.HasField("delay")),
            ("idempotency_key", bool(msg.idempotency_key)),
            ("job_id", bool(msg.job_id)),
        )
        if given
    ]
    if held:
        raise ProtocolError(
            f"server sent a workflow template with {held[0]} set, which each occurrence decides",
            reason="PROTOCOL_ERROR",
        )
    return WorkflowTemplate(
        name=msg.name,
        tasks=tuple(workflow_task_from_pb(t) for t in msg.tasks),
        edges=tuple(workflow_edge_from_pb(e) for e in msg.edges),
    )


def workflow_task_state_from_pb(msg: workflow_service_pb2.WorkflowTaskState) -> WorkflowTaskState:
    return WorkflowTaskState(
        ref=msg.ref,
        task=task_from_pb(msg.task),
        trigger_rule=_trigger_rule_from_pb(msg.trigger_rule),
        upstream_cause=_text(msg.upstream_cause),
    )


def workflow_detail_from_pb(msg: workflow_service_pb2.GetWorkflowResponse) -> WorkflowDetail:
    return WorkflowDetail(
        workflow=workflow_from_pb(msg.workflow),
        tasks=tuple(workflow_task_state_from_pb(t) for t in msg.tasks),
        edges=tuple(workflow_edge_from_pb(e) for e in msg.edges),
    )


def workflow_page_from_pb(msg: workflow_service_pb2.ListWorkflowsResponse) -> WorkflowPage:
    return WorkflowPage(
        workflows=tuple(workflow_from_pb(w) for w in msg.workflows),
        next_page_token=msg.next_page_token or None,
    )


def workflow_cancel_result_from_pb(
    msg: workflow_service_pb2.CancelWorkflowResponse,
) -> WorkflowCancelResult:
    return WorkflowCancelResult(
        workflow=workflow_from_pb(msg.workflow), cancelled=msg.cancelled, stopping=msg.stopping
    )


def workflow_retry_result_from_pb(
    msg: workflow_service_pb2.RetryWorkflowResponse,
) -> WorkflowRetryResult:
    return WorkflowRetryResult(workflow=workflow_from_pb(msg.workflow), reopened=msg.reopened)

"""The rows the store reads and writes, as frozen dataclasses, and submit validation.

:class:`NewTask` is what a caller hands the store to insert: every field already
decided (id, shard, ``due_at`` with its jitter), because policy lives in the pure
modules (``ids``, ``sharding``, ``jitter``) and the API, not in SQL. :func:`prepare`
checks a ``NewTask`` completely, without I/O, before anything is written, and computes
the two derived values the insert needs: the payload's JSON text (whose size is what the
limit bounds) and the request fingerprint that tells an idempotent repeat from a reuse
of the same key for a different request.

The fingerprint covers what the client asked for, not what the server derived: a
repeat of a submit gets a fresh task id, hence a different shard and jitter, yet must
be recognised as the same request. Trace context and the submitting identity are left
out for the same reason: a retried RPC carries a new trace.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple

from chronoshard.scheduler.api import payloads
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.states import AttemptState, Resolution, TaskStatus
from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.wire import DEFAULT_QUEUE

DEFAULT_PAYLOAD_LIMIT_BYTES = 256 * 1024
DEFAULT_MAX_RETRIES = 3
DEFAULT_BACKOFF_INITIAL_S = 1.0
DEFAULT_BACKOFF_MAX_S = 300.0
DEFAULT_BACKOFF_MULTIPLIER = 2.0

MAX_TYPE_LENGTH = 200
MAX_KEY_LENGTH = 200
"""Idempotency keys and job ids."""
MAX_RETRIES_LIMIT = 10_000
MAX_SHARD = 32767
"""``tasks.shard`` is a smallint."""
QUEUE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")


class Priority(StrEnum):
    """Priority class of the fairness selector; the value is what ``tasks.priority`` holds."""

    CRITICAL = "critical"
    STANDARD = "standard"
    BULK = "bulk"


class TaskRef(NamedTuple):
    """Names one task row the way every hot-path statement does: partition key first."""

    scheduled_at: datetime
    id: uuid.UUID


@dataclass(frozen=True, slots=True)
class Tenant:
    id: uuid.UUID
    name: str
    tier: str
    rate_limit_rps: float
    max_concurrent_workers: int
    home_region: str
    api_key_hash: str
    created_at: datetime
    operator: bool = False
    """May call cluster-wide admin operations (``AdminService.DrainNode``)."""


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task to insert, with every server-side decision already made by the caller."""

    id: uuid.UUID
    type: str
    scheduled_at: datetime
    due_at: datetime
    shard: int
    payload: dict[str, Any]
    priority: Priority = Priority.STANDARD
    queue: str = DEFAULT_QUEUE
    max_retries: int = DEFAULT_MAX_RETRIES
    timeout_s: float | None = None
    strict_timing: bool = False
    idempotent: bool = False
    idempotency_key: str | None = None
    job_id: str | None = None
    jitter_mode: JitterMode = JitterMode.SYMMETRIC
    backoff_initial_s: float = DEFAULT_BACKOFF_INITIAL_S
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S
    backoff_multiplier: float = DEFAULT_BACKOFF_MULTIPLIER
    workflow_id: uuid.UUID | None = None
    unresolved_dependencies: int = 0
    schedule_id: uuid.UUID | None = None
    logical_date: datetime | None = None
    trace_context: dict[str, str] | None = None
    submitted_by: str | None = None

    @property
    def ref(self) -> TaskRef:
        return TaskRef(self.scheduled_at, self.id)


@dataclass(frozen=True, slots=True)
class Task:
    """One row of ``tasks`` as stored."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    type: str
    scheduled_at: datetime
    due_at: datetime
    status: TaskStatus
    fencing_token: int
    idempotency_key: str | None
    retry_count: int
    max_retries: int
    backoff_initial_s: float
    backoff_max_s: float
    backoff_multiplier: float
    jitter_mode: JitterMode
    payload: dict[str, Any]
    result_payload: Any
    shard: int
    priority: Priority
    queue: str
    strict_timing: bool
    idempotent: bool
    timeout_s: float | None
    lease_expires_at: datetime | None
    worker_id: str | None
    attempt: int
    checkpoint: bytes | None
    job_id: str | None
    workflow_id: uuid.UUID | None
    unresolved_dependencies: int
    schedule_id: uuid.UUID | None
    logical_date: datetime | None
    trace_context: dict[str, str] | None
    last_error: str | None
    submitted_by: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    cancel_reason: str | None

    @property
    def ref(self) -> TaskRef:
        return TaskRef(self.scheduled_at, self.id)


@dataclass(frozen=True, slots=True)
class TaskAttempt:
    """One row of ``task_attempts``: one dispatch of a task."""

    task_id: uuid.UUID
    attempt: int
    scheduled_at: datetime
    fencing_token: int
    state: AttemptState
    worker_id: str | None
    entered_at: datetime
    finished_at: datetime | None
    error: str | None
    resolution: Resolution | None = None
    """How an operator resolved this attempt's unknown outcome, if it did."""


@dataclass(frozen=True, slots=True)
class SubmitResult:
    """The outcome of one submitted task: ``created`` is False when an idempotency key
    matched an earlier identical request, and ``task`` is then that request's task."""

    task: Task
    created: bool


@dataclass(frozen=True, slots=True)
class PreparedTask:
    """A validated :class:`NewTask` with what its insert needs computed once."""

    new: NewTask
    payload_json: str
    fingerprint: str


# --- validation ------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    # bool is an int subclass; True retries are a bug, not a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


def _require_aware(field: str, value: object) -> None:
    if not isinstance(value, datetime):
        raise InvalidArgument(field, f"must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, "must be timezone-aware")


def _optional_text(field: str, value: object, max_length: int) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.strip() or len(value) > max_length:
        raise InvalidArgument(field, f"must be a non-blank string of at most {max_length} chars")


def _optional_uuid(field: str, value: object) -> None:
    if value is not None and not isinstance(value, uuid.UUID):
        raise InvalidArgument(field, "must be a UUID")


def _check_fields(new: NewTask) -> None:
    if not isinstance(new.id, uuid.UUID):
        raise InvalidArgument("id", "must be a UUID")
    if not isinstance(new.type, str) or not new.type.strip() or len(new.type) > MAX_TYPE_LENGTH:
        raise InvalidArgument(
            "type", f"must be a non-blank string of at most {MAX_TYPE_LENGTH} chars"
        )
    _require_aware("scheduled_at", new.scheduled_at)
    _require_aware("due_at", new.due_at)
    if not _is_int(new.shard) or not 0 <= new.shard <= MAX_SHARD:
        raise InvalidArgument("shard", f"must be an integer in 0..{MAX_SHARD}")
    if new.priority not in set(Priority):
        raise InvalidArgument("priority", f"must be one of {', '.join(Priority)}")
    if not isinstance(new.queue, str) or not QUEUE_PATTERN.match(new.queue):
        raise InvalidArgument("queue", f"must match {QUEUE_PATTERN.pattern}")
    if not _is_int(new.max_retries) or not 0 <= new.max_retries <= MAX_RETRIES_LIMIT:
        raise InvalidArgument("max_retries", f"must be an integer in 0..{MAX_RETRIES_LIMIT}")
    if new.timeout_s is not None and not (_finite_number(new.timeout_s) and new.timeout_s > 0):
        raise InvalidArgument("timeout_s", "must be a positive number of seconds, or None")
    for field in ("strict_timing", "idempotent"):
        if not isinstance(getattr(new, field), bool):
            raise InvalidArgument(field, "must be a bool")
    _optional_text("idempotency_key", new.idempotency_key, MAX_KEY_LENGTH)
    _optional_text("job_id", new.job_id, MAX_KEY_LENGTH)
    _optional_text("submitted_by", new.submitted_by, MAX_KEY_LENGTH)
    if new.jitter_mode not in set(JitterMode):
        raise InvalidArgument("jitter_mode", f"must be one of {', '.join(JitterMode)}")
    if not (_finite_number(new.backoff_initial_s) and new.backoff_initial_s > 0):
        raise InvalidArgument("backoff_initial_s", "must be a positive number of seconds")
    if not (_finite_number(new.backoff_max_s) and new.backoff_max_s >= new.backoff_initial_s):
        raise InvalidArgument("backoff_max_s", "must be at least backoff_initial_s")
    if not (_finite_number(new.backoff_multiplier) and new.backoff_multiplier >= 1):
        raise InvalidArgument("backoff_multiplier", "must be a number >= 1")
    _optional_uuid("workflow_id", new.workflow_id)
    _optional_uuid("schedule_id", new.schedule_id)
    if not _is_int(new.unresolved_dependencies) or new.unresolved_dependencies < 0:
        raise InvalidArgument("unresolved_dependencies", "must be an integer >= 0")
    if new.logical_date is not None:
        _require_aware("logical_date", new.logical_date)
    if new.trace_context is not None and not (
        isinstance(new.trace_context, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in new.trace_context.items())
    ):
        raise InvalidArgument("trace_context", "must map strings to strings")


def _utc_text(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def request_fingerprint(new: NewTask, payload_json: str) -> str:
    """SHA-256 over the client-chosen fields of ``new`` (see the module docstring)."""
    request = {
        "type": new.type,
        "scheduled_at": _utc_text(new.scheduled_at),
        "payload": payload_json,
        "priority": str(new.priority),
        "queue": new.queue,
        "max_retries": new.max_retries,
        "timeout_s": None if new.timeout_s is None else float(new.timeout_s),
        "strict_timing": new.strict_timing,
        "idempotent": new.idempotent,
        "job_id": new.job_id,
        "jitter_mode": str(new.jitter_mode),
        "backoff": [
            float(new.backoff_initial_s),
            float(new.backoff_max_s),
            float(new.backoff_multiplier),
        ],
        "workflow_id": None if new.workflow_id is None else str(new.workflow_id),
        "schedule_id": None if new.schedule_id is None else str(new.schedule_id),
        "logical_date": _utc_text(new.logical_date),
    }
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def prepare(new: NewTask, *, payload_limit_bytes: int, fingerprint: bool = True) -> PreparedTask:
    """Validate ``new`` completely and compute its payload text and fingerprint.

    ``fingerprint=False`` leaves the fingerprint empty, for a caller that computes its
    own (the API fingerprints the request as sent).

    Raises:
        InvalidArgument: a field is invalid (``field`` names it); the payload is not a
            JSON object or breaks a rule of :mod:`chronoshard.scheduler.api.payloads` (exact numbers
            of at most 1000 digits, nesting, storable strings).
        PayloadTooLarge: the payload's stored text
        (:func:`chronoshard.scheduler.api.payloads.canonical`) is over
            ``payload_limit_bytes``.
    """
    _check_fields(new)
    if not isinstance(new.payload, dict):
        raise InvalidArgument("payload", "must be a JSON object")
    payload_json = payloads.canonical(new.payload, "payload", payload_limit_bytes)
    return PreparedTask(
        new, payload_json, request_fingerprint(new, payload_json) if fingerprint else ""
    )

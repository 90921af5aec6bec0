"""The rows the store reads and writes, as frozen dataclasses, and the request fingerprint.

:class:`NewTask` is a task to insert: every field already decided (id, shard, ``due_at``
with its jitter), because policy lives in the pure modules (``ids``, ``sharding``,
``jitter``) and the API, not in SQL. What the store inserts is a
:class:`PreparedTask`: the ``NewTask`` with the payload's stored JSON text (whose size
is what the payload limit bounds) and its request fingerprint, which tells an idempotent
repeat from a reuse of the same key for a different request.

A submit is validated once, at the wire:
:func:`chronoshard.scheduler.api.task_requests.submit_from_pb` checks every request field
(naming it as the request spells it), computes the payload's text with
:func:`chronoshard.scheduler.api.payloads.canonical` and builds the ``PreparedTask``.
This module checks nothing again and imports nothing from ``api``: it holds the types
and the computed fields (:func:`request_fingerprint`), so the rules of a valid submit
live in one place, next to the request they are about.

The fingerprint covers what the client asked for, not what the server derived: a
repeat of a submit gets a fresh task id, hence a different shard and jitter, yet must
be recognised as the same request. Trace context and the submitting identity are left
out for the same reason: a retried RPC carries a new trace.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple

from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.states import AttemptState, Resolution, TaskStatus
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
"""The most ``max_retries`` a task may have, whatever the node's ``limits.max_retries_limit``."""
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
    submit_rate_limit_rps: float | None = None
    """Tasks per second the tenant may submit, cluster-wide; None: no limit."""


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
    upstream_cause: uuid.UUID | None
    """For UPSTREAM_FAILED: the workflow task whose failure it descends from."""

    @property
    def ref(self) -> TaskRef:
        return TaskRef(self.scheduled_at, self.id)


def inserted_task(
    tenant_id: uuid.UUID, new: NewTask, created_at: datetime, payload: dict[str, Any]
) -> Task:
    """The row a submit inserts for ``new`` (``insert_tasks`` in store/sql/submits.sql),
    as a Task: every field as sent, the column defaults of a task that never ran, and
    what PostgreSQL chose: ``created_at`` (``now()``, which ``updated_at`` is too) and
    ``payload`` as it came back (jsonb writes numbers its own way). The submit path
    builds its answer with this instead of reading its rows back column by column
    (issue 14: a third of a batch's CPU on the node);
    tests/integration/test_submitted_rows.py holds it equal to what ``get_task`` reads."""
    return Task(
        id=new.id,
        tenant_id=tenant_id,
        type=new.type,
        scheduled_at=new.scheduled_at,
        due_at=new.due_at,
        status=TaskStatus.SCHEDULED,
        fencing_token=0,
        idempotency_key=new.idempotency_key,
        retry_count=0,
        max_retries=new.max_retries,
        backoff_initial_s=float(new.backoff_initial_s),
        backoff_max_s=float(new.backoff_max_s),
        backoff_multiplier=float(new.backoff_multiplier),
        jitter_mode=new.jitter_mode,
        payload=payload,
        result_payload=None,
        shard=new.shard,
        priority=new.priority,
        queue=new.queue,
        strict_timing=new.strict_timing,
        idempotent=new.idempotent,
        timeout_s=None if new.timeout_s is None else float(new.timeout_s),
        lease_expires_at=None,
        worker_id=None,
        attempt=0,
        checkpoint=None,
        job_id=new.job_id,
        workflow_id=new.workflow_id,
        unresolved_dependencies=new.unresolved_dependencies,
        schedule_id=new.schedule_id,
        logical_date=new.logical_date,
        trace_context=new.trace_context,
        last_error=None,
        submitted_by=new.submitted_by,
        created_at=created_at,
        updated_at=created_at,
        started_at=None,
        finished_at=None,
        cancel_requested_at=None,
        cancel_reason=None,
        upstream_cause=None,
    )


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
    """A :class:`NewTask` with what its insert needs computed once: the payload as the
    text to store, and the request fingerprint (empty when the task has no idempotency
    key: only a key's owner is ever compared by fingerprint).

    Built by the wire (``api.task_requests.submit_from_pb``), which validated every
    field; the store trusts it."""

    new: NewTask
    payload_json: str
    fingerprint: str


# --- the request fingerprint --------------------------------------------------------


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

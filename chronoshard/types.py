"""What users of the client see: frozen dataclasses and string enums, no protobuf.

The client converts every gRPC message to these types at the edge (``chronoshard._convert``)
so code that submits tasks never touches generated classes. The conventions are the ones a
Python caller expects rather than the wire's: instants are timezone-aware ``datetime``
objects in UTC, durations are ``float`` seconds, JSON documents (payload, result) are
decoded Python values, and an absent optional string is ``None`` rather than ``""``.
Enum values are the state machine's strings (``TaskStatus.DEAD_LETTER == "DEAD_LETTER"``,
``Priority.BULK == "bulk"``) so they can be logged, compared with strings and passed
through JSON as they are.

:class:`TaskSpec` is the one description of "a task to submit": ``Client.submit`` builds one
from its keyword arguments and ``Client.submit_batch`` takes a list of them, so both paths
validate the same way. Its checks are the cheap and unambiguous ones (a naive datetime, both
``at`` and ``delay_s``, an unknown enum name); everything else is the server's to judge.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

__all__ = [
    "AttemptState",
    "JitterMode",
    "Priority",
    "Resolution",
    "RetryPolicy",
    "SubmitResult",
    "Task",
    "TaskAttempt",
    "TaskPage",
    "TaskSpec",
    "TaskStatus",
    "require_aware",
]


class TaskStatus(StrEnum):
    """A task's lifecycle state (docs/architecture.md#d4); the value is the name stored in the
    database."""

    SCHEDULED = "SCHEDULED"
    PRELOADED = "PRELOADED"
    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    RETRYING = "RETRYING"
    DEAD_LETTER = "DEAD_LETTER"
    CANCELLED = "CANCELLED"
    UPSTREAM_FAILED = "UPSTREAM_FAILED"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    """Held: a non-idempotent attempt's lease ran out with no settlement, so whether it
    ran is unknown. Not re-run on its own: resolve it (:meth:`Client.resolve`)."""

    @property
    def is_terminal(self) -> bool:
        """True for states a task leaves only by an operator retry (or never)."""
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        TaskStatus.COMPLETED,
        TaskStatus.CANCELLED,
        TaskStatus.DEAD_LETTER,
        TaskStatus.UPSTREAM_FAILED,
    }
)


class Priority(StrEnum):
    """Priority class used by the scheduler's fairness selector (docs/architecture.md#d6)."""

    CRITICAL = "critical"
    """Has reserved dispatch capacity."""
    STANDARD = "standard"
    """The default."""
    BULK = "bulk"
    """Runs on capacity the other classes leave idle."""


class JitterMode(StrEnum):
    """How the scheduler spreads ``due_at`` around ``scheduled_at`` (docs/architecture.md#d6)."""

    SYMMETRIC = "symmetric"
    """``due_at`` in ``scheduled_at ± window/2``, never earlier than the submit."""
    NONE = "none"
    """No jitter: ``due_at == scheduled_at``."""
    DELAY_ONLY = "delay_only"
    """Only later, never earlier: ``due_at`` in ``scheduled_at + [0, window)``."""


class AttemptState(StrEnum):
    """The state of one attempt (one row of ``task_attempts``)."""

    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    RELEASED = "RELEASED"
    ABANDONED = "ABANDONED"
    CANCELLED = "CANCELLED"
    FENCED = "FENCED"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"


class Resolution(StrEnum):
    """An operator's decision about a task whose outcome is unknown (:meth:`Client.resolve`)."""

    RETRY = "RETRY"
    """Run it again under a new fencing token (a late write of the old attempt is refused
    wherever the token fences it)."""
    MARK_FAILED = "MARK_FAILED"
    """Dead-letter it with the reason given."""


@dataclass(frozen=True)
class RetryPolicy:
    """Retries after a failed attempt: attempt n waits ``min(initial * multiplier**(n-1),
    max)`` plus jitter chosen by the server.

    On submit, a field left ``None`` takes the server's default. On a :class:`Task` read
    back from the server every field the server reported is filled.
    """

    max_retries: int | None = None
    initial_backoff_s: float | None = None
    max_backoff_s: float | None = None
    multiplier: float | None = None


@dataclass(frozen=True)
class TaskAttempt:
    """One dispatch of a task, oldest first in :attr:`Task.attempts`."""

    attempt: int
    fencing_token: int
    state: AttemptState
    worker_id: str | None
    entered_at: datetime | None
    finished_at: datetime | None
    error: str | None
    resolution: Resolution | None = None
    """How an operator resolved this attempt's unknown outcome, if it did."""


@dataclass(frozen=True)
class Task:
    """A task as the server reported it. Read-only; fields the server left unset are None.

    ``payload`` and ``result`` are the decoded JSON documents (``result`` is None until the
    task completes). ``attempts`` is filled only by ``Client.get(..., attempts=True)``.
    """

    id: str
    tenant_id: str
    type: str
    status: TaskStatus
    scheduled_at: datetime | None
    due_at: datetime | None
    priority: Priority
    queue: str
    """Worker queue; ``""`` is the default queue."""
    payload: Any
    result: Any
    last_error: str | None
    attempt: int
    fencing_token: int
    retry_count: int
    retry_policy: RetryPolicy
    timeout_s: float | None
    strict_timing: bool
    idempotent: bool
    idempotency_key: str | None
    job_id: str | None
    worker_id: str | None
    lease_expires_at: datetime | None
    checkpoint: bytes | None
    """Opaque bytes stored by a worker for the next attempt."""
    shard: int
    trace_context: Mapping[str, str]
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None
    workflow_id: str | None
    unresolved_dependencies: int
    schedule_id: str | None
    logical_date: datetime | None
    attempts: tuple[TaskAttempt, ...] = ()

    @property
    def max_retries(self) -> int | None:
        return self.retry_policy.max_retries


@dataclass(frozen=True)
class SubmitResult:
    """The outcome of one submit: the task, and False in ``created`` when an idempotency key
    repeat returned the task created earlier."""

    task: Task
    created: bool


@dataclass(frozen=True)
class TaskPage:
    """One page of ``Client.list``; ``next_page_token`` is None on the last page."""

    tasks: tuple[Task, ...]
    next_page_token: str | None


def require_aware(value: datetime, argument: str) -> datetime:
    """Return ``value`` if it is timezone-aware, else raise ValueError naming the argument.

    A naive datetime is ambiguous (local time? UTC?) and a task scheduled an hour off is
    exactly the silent failure a scheduler must not have, so the client refuses it at once.
    """
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise ValueError(
            f"{argument} must be a timezone-aware datetime (got naive {value.isoformat()}); "
            "use e.g. datetime.now(UTC) or dt.replace(tzinfo=ZoneInfo(...))"
        )
    return value


@dataclass(frozen=True)
class TaskSpec:
    """A task to submit; the fields mirror the keyword arguments of ``Client.submit``.

    ``payload`` must be a JSON object (a dict); it is encoded when the request is built.
    ``at`` (an aware datetime) and ``delay_s`` are exclusive; neither means "now".
    ``priority``, ``jitter`` and ``queue`` left unset take the server's (or tenant's)
    defaults. ``max_retries`` is a shorthand for ``retry.max_retries``; giving both with
    different values is an error. ``timeout_s`` bounds one attempt of the handler (it is
    not the RPC deadline).
    """

    type: str
    payload: Mapping[str, Any] | None = None
    at: datetime | None = None
    delay_s: float | None = None
    priority: Priority | None = None
    queue: str = ""
    max_retries: int | None = None
    retry: RetryPolicy | None = None
    timeout_s: float | None = None
    strict_timing: bool = False
    jitter: JitterMode | None = None
    jitter_window_s: float | None = None
    idempotent: bool = False
    idempotency_key: str | None = None
    job_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.type, str):
            raise TypeError(f"type must be a str, got {type(self.type).__name__}")
        if self.payload is not None and not isinstance(self.payload, Mapping):
            raise TypeError(
                f"payload must be a dict (a JSON object), got {type(self.payload).__name__}"
            )
        if self.at is not None:
            if not isinstance(self.at, datetime):
                raise TypeError(f"at must be a datetime, got {type(self.at).__name__}")
            require_aware(self.at, "at")
            if self.delay_s is not None:
                raise ValueError("give at most one of at and delay_s")
        if self.priority is not None:
            object.__setattr__(self, "priority", coerce_enum(Priority, self.priority, "priority"))
        if self.jitter is not None:
            object.__setattr__(self, "jitter", coerce_enum(JitterMode, self.jitter, "jitter"))
        if (
            self.max_retries is not None
            and self.retry is not None
            and self.retry.max_retries is not None
            and self.retry.max_retries != self.max_retries
        ):
            raise ValueError(
                f"max_retries={self.max_retries} contradicts "
                f"retry.max_retries={self.retry.max_retries}; give one"
            )

    @property
    def effective_max_retries(self) -> int | None:
        if self.max_retries is not None:
            return self.max_retries
        return self.retry.max_retries if self.retry is not None else None


_E = TypeVar("_E", bound=StrEnum)


def coerce_enum(enum: type[_E], value: object, argument: str) -> _E:
    """Accept an enum member or its string value; anything else is a ValueError naming
    the argument and the accepted values."""
    try:
        return enum(value)  # type: ignore[arg-type]  # any value: a wrong one is the error
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum)
        raise ValueError(f"{argument} must be one of {allowed}, got {value!r}") from None

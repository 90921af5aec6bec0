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

:class:`ScheduleSpec` describes a recurring schedule (``Client.create_schedule``,
``Client.update_schedule``); what each occurrence submits is a :class:`TaskSpec` (its
``task``), the same description ``submit`` builds, without the fields the occurrence
decides (``at``, ``delay_s``, ``idempotency_key``) or the schedule owns (``job_id``), or
a workflow (its ``workflow``, a :class:`WorkflowTemplate`: ``create_workflow``'s
arguments without those same fields).

A workflow (``Client.create_workflow``) is :class:`WorkflowTask` items, each a
:class:`TaskSpec` named by a local ``ref``, and :class:`WorkflowEdge` items between refs;
its tasks carry no time or key of their own (the workflow's start and key apply to all).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

__all__ = [
    "AlertSeverity",
    "AttemptState",
    "BackfillResult",
    "CatchupPolicy",
    "JitterMode",
    "OverlapPolicy",
    "Priority",
    "Resolution",
    "RetryPolicy",
    "RunOrigin",
    "Schedule",
    "ScheduleDetails",
    "SchedulePage",
    "ScheduleRun",
    "ScheduleSpec",
    "ScheduleWatch",
    "SubmitResult",
    "Task",
    "TaskAttempt",
    "TaskPage",
    "TaskSpec",
    "TaskStatus",
    "TriggerRule",
    "WorkerSession",
    "WorkerSessionPage",
    "Workflow",
    "WorkflowCancelResult",
    "WorkflowCreateResult",
    "WorkflowDetail",
    "WorkflowEdge",
    "WorkflowPage",
    "WorkflowRetryResult",
    "WorkflowState",
    "WorkflowTask",
    "WorkflowTaskState",
    "WorkflowTemplate",
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
    waiting_reason: str | None = None
    """Why a task that is due still waits, when its tenant's quotas hold it
    (``Client.get`` only): ``"TENANT_RATE_LIMIT"`` or ``"TENANT_CONCURRENCY_LIMIT"``."""

    @property
    def max_retries(self) -> int | None:
        return self.retry_policy.max_retries


class SubmitResult:
    """The outcome of one submit: the task, and False in ``created`` when an idempotency key
    repeat returned the task created earlier.

    An answer from the scheduler is turned into ``task`` when ``task`` is first read, not
    before: a producer that submits thousands of tasks in batches and looks only at
    ``created`` (or at nothing) does not pay for a thousand Task objects per call, which
    were three fifths of such a producer's CPU (issue 14). Immutable, compared by value,
    like the dataclasses here."""

    __slots__ = ("_decode", "_task", "created")

    _task: Task | None
    _decode: Callable[[], Task] | None
    created: bool

    def __init__(self, task: Task, created: bool) -> None:
        object.__setattr__(self, "_task", task)
        object.__setattr__(self, "_decode", None)
        object.__setattr__(self, "created", created)

    @classmethod
    def decoded_later(cls, decode: Callable[[], Task], created: bool) -> SubmitResult:
        """A result whose task ``decode()`` makes, once, when ``task`` is first read."""
        result = cls.__new__(cls)
        object.__setattr__(result, "_task", None)
        object.__setattr__(result, "_decode", decode)
        object.__setattr__(result, "created", created)
        return result

    @property
    def task(self) -> Task:
        task = self._task
        if task is None:
            assert self._decode is not None
            task = self._decode()
            object.__setattr__(self, "_task", task)
            object.__setattr__(self, "_decode", None)
        return task

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"SubmitResult is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"SubmitResult is immutable: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SubmitResult):
            return NotImplemented
        return (self.task, self.created) == (other.task, other.created)

    def __hash__(self) -> int:
        # In-process only (sets and dicts of results), as the frozen dataclass this
        # replaced hashed: nothing routes or jitters by it (those use blake2b).
        return hash((self.task, self.created))

    def __repr__(self) -> str:
        return f"SubmitResult(task={self.task!r}, created={self.created!r})"


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


# --- schedules ---------------------------------------------------------------------------


class CatchupPolicy(StrEnum):
    """What a schedule does about occurrences missed while no node could create them
    (docs/architecture.md#d13); unset on a spec means the server's default, SKIP."""

    SKIP = "skip"
    """Missed occurrences are not run."""
    LATEST = "latest"
    """Only the newest missed occurrence runs."""
    ALL = "all"
    """Every missed occurrence runs, up to ``catchup_limit`` (the newest ones)."""


class OverlapPolicy(StrEnum):
    """What an occurrence does while the previous one (its task, or its workflow run)
    still runs; unset on a spec means the server's default, ALLOW. SKIP and BUFFER_ONE
    need the template's ``timeout_s`` (for a workflow, every task's)."""

    ALLOW = "allow"
    """Runs regardless."""
    SKIP = "skip"
    """Is skipped (recorded as a run with no task)."""
    BUFFER_ONE = "buffer_one"
    """Waits and runs once the previous one finishes; while one waits, later ones are
    skipped."""


class AlertSeverity(StrEnum):
    """The severity of the watchdog's alert for a schedule that is late."""

    CRITICAL = "critical"
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class RunOrigin(StrEnum):
    """Why a schedule run exists."""

    SCHEDULE = "SCHEDULE"
    """An occurrence of the rule, created on time."""
    CATCHUP = "CATCHUP"
    """A missed occurrence run by the catchup policy."""
    TRIGGER = "TRIGGER"
    """``trigger_schedule``."""
    BACKFILL = "BACKFILL"
    """``backfill_schedule``."""
    BUFFERED = "BUFFERED"
    """An occurrence the BUFFER_ONE overlap policy held until the previous one finished."""


@dataclass(frozen=True)
class ScheduleWatch:
    """How the watchdog watches a schedule: each occurrence must complete by its logical
    date + ``expected_duration_s`` + ``tolerance_s``, else one alert opens. ``None``
    fields take the server's defaults (the template's timeout if set, for a workflow the
    sum of the timeouts along its longest chain, else 60 s if a task has none; 60 s;
    critical)."""

    disabled: bool = False
    expected_duration_s: float | None = None
    tolerance_s: float | None = None
    severity: AlertSeverity | None = None

    def __post_init__(self) -> None:
        if self.severity is not None:
            object.__setattr__(
                self, "severity", coerce_enum(AlertSeverity, self.severity, "watch.severity")
            )


@dataclass(frozen=True)
class ScheduleSpec:
    """A recurring schedule, as a client sets it on create and update.

    The rule is a ``cron`` expression (5 fields, 6 with seconds first, or ``@daily`` and
    the like), read in the IANA ``timezone`` (None: UTC), or a fixed ``interval_s``
    (occurrences at ``start_at`` + k * interval, whatever the zone): exactly one of the
    two. ``start_at``/``end_at`` (aware datetimes) bound the occurrences; None: from
    creation, never ending. Each occurrence submits ``task`` or creates a run of
    ``workflow``: exactly one of the two. ``task`` is a :class:`TaskSpec` without ``at``,
    ``delay_s``, ``idempotency_key`` (the occurrence decides them) and ``job_id`` (the
    schedule's ``job_id``; None: the schedule's name). ``workflow`` is a
    :class:`WorkflowTemplate`: every task of a run carries the occurrence's logical date
    and the schedule's id, and the run completes the schedule's job when it SUCCEEDS.
    Fields left None take the server's defaults (catchup SKIP, overlap ALLOW, misfire
    grace 60 s). ``catchup_limit`` is required with ``CatchupPolicy.ALL``; the server
    judges it.
    """

    name: str
    task: TaskSpec | None = None
    cron: str | None = None
    interval_s: float | None = None
    timezone: str | None = None
    start_at: datetime | None = None
    end_at: datetime | None = None
    catchup: CatchupPolicy | None = None
    catchup_limit: int | None = None
    overlap: OverlapPolicy | None = None
    job_id: str | None = None
    watch: ScheduleWatch = ScheduleWatch()
    misfire_grace_s: float | None = None
    workflow: WorkflowTemplate | None = None
    # Last, not beside ``task``: a positional call written before workflows existed
    # (name, task, cron, ...) keeps its meaning.

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        if (self.task is None) == (self.workflow is None):
            raise ValueError("give exactly one of task and workflow")
        if self.task is not None and not isinstance(self.task, TaskSpec):
            raise TypeError(f"task must be a TaskSpec, got {type(self.task).__name__}")
        if self.workflow is not None and not isinstance(self.workflow, WorkflowTemplate):
            raise TypeError(
                f"workflow must be a WorkflowTemplate, got {type(self.workflow).__name__}"
            )
        if (self.cron is None) == (self.interval_s is None):
            raise ValueError("give exactly one of cron and interval_s")
        if self.cron is not None and not isinstance(self.cron, str):
            raise TypeError(f"cron must be a str, got {type(self.cron).__name__}")
        for argument in ("start_at", "end_at"):
            value = getattr(self, argument)
            if value is not None:
                if not isinstance(value, datetime):
                    raise TypeError(f"{argument} must be a datetime, got {type(value).__name__}")
                require_aware(value, argument)
        # The occurrence decides these; the server would refuse them, but naming the
        # argument here is clearer than `spec.task_template.scheduled_at`. A workflow
        # template has no such fields to refuse (its tasks refuse their own).
        if self.task is not None:
            for argument, why in (
                ("at", "each occurrence runs at its own time"),
                ("delay_s", "each occurrence runs at its own time"),
                ("idempotency_key", "each occurrence is keyed by its logical date"),
                ("job_id", "give the schedule's job_id instead"),
            ):
                if getattr(self.task, argument) is not None:
                    raise ValueError(f"task.{argument} must be unset in a schedule: {why}")
        if self.catchup is not None:
            object.__setattr__(self, "catchup", coerce_enum(CatchupPolicy, self.catchup, "catchup"))
        if self.overlap is not None:
            object.__setattr__(self, "overlap", coerce_enum(OverlapPolicy, self.overlap, "overlap"))
        if not isinstance(self.watch, ScheduleWatch):
            raise TypeError(f"watch must be a ScheduleWatch, got {type(self.watch).__name__}")


@dataclass(frozen=True)
class Schedule:
    """A schedule as the server reported it. ``next_occurrence`` is the first occurrence
    not created yet (None once the schedule has ended)."""

    id: str
    tenant_id: str
    spec: ScheduleSpec
    paused: bool
    next_occurrence: datetime | None
    created_at: datetime | None
    updated_at: datetime | None

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class ScheduleRun:
    """One occurrence that ran or was decided: the task it submitted (``task_id``) or,
    for a schedule of a workflow, the run it created (``workflow_id``); both are None
    when the overlap policy skipped it. ``status`` is the task's now, or the run's state
    read as a task status (RUNNING, COMPLETED for SUCCEEDED, DEAD_LETTER for FAILED,
    CANCELLED); None when skipped, or once the task or run is gone (retention)."""

    logical_date: datetime
    origin: RunOrigin
    task_id: str | None
    status: TaskStatus | None
    finished_at: datetime | None
    workflow_id: str | None = None


@dataclass(frozen=True)
class ScheduleDetails:
    """``Client.get_schedule``: the schedule, its next occurrences from now (UTC
    instants, soonest first) and its latest runs (newest first)."""

    schedule: Schedule
    next_occurrences: tuple[datetime, ...]
    runs: tuple[ScheduleRun, ...]


@dataclass(frozen=True)
class SchedulePage:
    """One page of ``Client.list_schedules``, ordered by name; ``next_page_token`` is None
    on the last page."""

    schedules: tuple[Schedule, ...]
    next_page_token: str | None


@dataclass(frozen=True)
class BackfillResult:
    """``Client.backfill_schedule``: the runs created (oldest first), and how many
    occurrences of the range already had a run (left alone)."""

    runs: tuple[ScheduleRun, ...]
    existing: int


# --- workflows ---------------------------------------------------------------------------


class TriggerRule(StrEnum):
    """When a task of a workflow runs, given its parents (docs/architecture.md#d9)."""

    ALL_SUCCESS = "all_success"
    """When every parent COMPLETED; a parent that ends DEAD_LETTER, CANCELLED or
    UPSTREAM_FAILED makes this task UPSTREAM_FAILED at once."""
    ALL_DONE = "all_done"
    """When every parent is terminal, whatever its outcome."""


class WorkflowState(StrEnum):
    """The state of a workflow run, read off its tasks' states."""

    RUNNING = "RUNNING"
    """Some task is not terminal."""
    SUCCEEDED = "SUCCEEDED"
    """Every task COMPLETED."""
    FAILED = "FAILED"
    """Some task ended DEAD_LETTER or UPSTREAM_FAILED."""
    CANCELLED = "CANCELLED"
    """Every task that did not complete was cancelled."""

    @property
    def is_finished(self) -> bool:
        """True once no task of the run is left to run (what ``retry_workflow`` needs)."""
        return self is not WorkflowState.RUNNING


@dataclass(frozen=True)
class WorkflowTask:
    """One task of a workflow to create: a :class:`TaskSpec` named by ``ref``, unique in
    the workflow (1-100 of ``[A-Za-z0-9_.-]``, starting with a letter or digit; the
    server judges it). The spec has no ``at``, ``delay_s`` or ``idempotency_key``: the
    workflow's start and key apply to all of its tasks."""

    ref: str
    task: TaskSpec
    trigger_rule: TriggerRule = TriggerRule.ALL_SUCCESS

    def __post_init__(self) -> None:
        if not isinstance(self.ref, str):
            raise TypeError(f"ref must be a str, got {type(self.ref).__name__}")
        if not isinstance(self.task, TaskSpec):
            raise TypeError(f"task must be a TaskSpec, got {type(self.task).__name__}")
        # The server would refuse them as `tasks[i].task.scheduled_at`; the argument's own
        # name says more.
        for argument, why in (
            ("at", "the workflow's start applies to all of its tasks"),
            ("delay_s", "the workflow's start applies to all of its tasks"),
            ("idempotency_key", "the workflow's key applies to all of its tasks"),
        ):
            if getattr(self.task, argument) is not None:
                raise ValueError(f"task.{argument} must be unset in a workflow: {why}")
        object.__setattr__(
            self, "trigger_rule", coerce_enum(TriggerRule, self.trigger_rule, "trigger_rule")
        )


@dataclass(frozen=True)
class WorkflowEdge:
    """``child`` runs after ``parent`` (both refs of the same workflow)."""

    parent: str
    child: str


@dataclass(frozen=True)
class WorkflowTemplate:
    """A workflow that a schedule creates a run of per occurrence
    (:attr:`ScheduleSpec.workflow`): ``create_workflow``'s arguments without the start,
    the key and the job, which the occurrence and the schedule decide. An empty ``name``
    is the schedule's. Its tasks and edges are checked as ``create_workflow`` checks
    them, by the server, when the schedule is created."""

    name: str = ""
    tasks: tuple[WorkflowTask, ...] = ()
    edges: tuple[WorkflowEdge, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a str, got {type(self.name).__name__}")
        # Tuples whatever sequence was given: the template is frozen and compared whole.
        for argument, kind in (("tasks", WorkflowTask), ("edges", WorkflowEdge)):
            items = tuple(getattr(self, argument))
            for index, item in enumerate(items):
                if not isinstance(item, kind):
                    raise TypeError(
                        f"{argument}[{index}] must be a {kind.__name__}, got {type(item).__name__}"
                    )
            object.__setattr__(self, argument, items)


@dataclass(frozen=True)
class Workflow:
    """A workflow run as the server reported it. ``scheduled_at`` is when its tasks
    without parents were due (before jitter); ``finished_at`` is None while it runs.
    ``job_id`` is the watchdog's job the run completes when it SUCCEEDS; ``schedule_id``
    and ``logical_date`` are set when a schedule's occurrence created the run."""

    id: str
    tenant_id: str
    name: str
    state: WorkflowState
    scheduled_at: datetime | None
    created_at: datetime | None
    finished_at: datetime | None
    task_count: int
    edge_count: int
    idempotency_key: str | None
    job_id: str | None = None
    schedule_id: str | None = None
    logical_date: datetime | None = None


@dataclass(frozen=True)
class WorkflowCreateResult:
    """``Client.create_workflow``: the run, each ref's task id, and False in ``created``
    when an idempotency key repeat returned the workflow created earlier."""

    workflow: Workflow
    task_ids: Mapping[str, str]
    created: bool


@dataclass(frozen=True)
class WorkflowTaskState:
    """A task of a workflow as it is now. ``upstream_cause`` is set when the task is
    UPSTREAM_FAILED: the ref of the task whose failure (DEAD_LETTER or CANCELLED) it
    descends from."""

    ref: str
    task: Task
    trigger_rule: TriggerRule
    upstream_cause: str | None


@dataclass(frozen=True)
class WorkflowDetail:
    """``Client.get_workflow``: the run, its tasks (parents before children) and its
    edges."""

    workflow: Workflow
    tasks: tuple[WorkflowTaskState, ...]
    edges: tuple[WorkflowEdge, ...]


@dataclass(frozen=True)
class WorkflowPage:
    """One page of ``Client.list_workflows``, newest first; ``next_page_token`` is None
    on the last page."""

    workflows: tuple[Workflow, ...]
    next_page_token: str | None


@dataclass(frozen=True)
class WorkflowCancelResult:
    """``Client.cancel_workflow``: the run, the tasks cancelled at once, and the running
    ones asked to stop (they end CANCELLED when their workers acknowledge)."""

    workflow: Workflow
    cancelled: int
    stopping: int


@dataclass(frozen=True)
class WorkflowRetryResult:
    """``Client.retry_workflow``: the run and how many of its tasks went back to
    SCHEDULED."""

    workflow: Workflow
    reopened: int


@dataclass(frozen=True)
class Incident:
    """One of the watchdog's incidents about the tenant's jobs (``Client.list_incidents``):
    ``kind`` says what fired (``"job_overdue"``, ``"schedule_missed"``), ``severity``
    the expectation's (``"critical"`` .. ``"info"``); ``resolved_at`` is None while it
    is open."""

    id: int
    kind: str
    job_id: str | None
    severity: str
    summary: str
    opened_at: datetime
    resolved_at: datetime | None
    tenant_id: str | None = None
    """Whose job it is, in an operator's listing of every tenant's (``all_tenants``); None
    there for the cluster's own incidents, and in a tenant's own listing."""
    tenant_name: str = ""


@dataclass(frozen=True)
class WorkerSession:
    """One worker's stream with one scheduler node (``Client.list_worker_sessions``).

    ``tenant_id``/``tenant_name`` name the tenant whose API key opened the stream (workers
    serve every tenant's tasks: this says whose worker it is). ``credits`` are the ones
    the worker granted the node and the node has not used; ``running`` the tasks the
    node sent on the stream that the worker has not settled. Both are as of
    ``reported_at``: the node's last record of its sessions (every
    ``workers.session_timeout_s / 3``), or the answer's time for the answering node's
    own sessions. ``connected_at`` is None for a record an older node wrote."""

    worker_id: str
    node_id: str
    session_id: str
    tenant_id: str | None
    tenant_name: str
    queues: tuple[str, ...]
    task_types: tuple[str, ...]
    slots: int
    credits: int
    running: int
    draining: bool
    connected_at: datetime | None
    reported_at: datetime


@dataclass(frozen=True)
class WorkerSessionPage:
    """One page of ``Client.list_worker_sessions``, ordered by worker id then node id;
    ``next_page_token`` is None on the last page. ``restricted`` is True when the key is
    not an operator's: only the sessions its own tenant's workers opened are listed.
    ``answered_by`` is the node that answered (its own sessions' figures are live)."""

    sessions: tuple[WorkerSession, ...]
    next_page_token: str | None
    restricted: bool
    answered_by: str

"""The task state machine: one table, written as data, that every write obeys.

docs/architecture.md#d4 is transcribed below as ``TRANSITIONS``, a mapping ``(status, event) ->
status``. Nothing else in the scheduler decides whether a move is legal: the store asks
:func:`sources` for the states a write may start from and puts them in its ``WHERE status =
ANY(%s)`` clause, so a stale or invalid move changes 0 rows instead of corrupting the row, and
in-memory code asks :func:`transition`, which raises
:class:`~chronoshard.scheduler.errors.InvalidTransition`. The strings of :class:`TaskStatus` and
:class:`AttemptState` are what PostgreSQL stores; renaming a member is a migration.

Two readings of the table are decisions worth writing down:

* ``CANCEL`` from RUNNING is the *acknowledgement* of a cooperative cancel. A handler that
  is executing cannot be stopped from outside, so the API records the request, the worker
  is told, and the row becomes CANCELLED when the worker confirms. From SCHEDULED,
  PRELOADED, DISPATCHED and RETRYING the API applies it at once (a DISPATCHED worker
  learns on its ack or next heartbeat that its token is no longer valid).
* DISPATCHED -> PRELOADED covers two causes with two events: ``LEASE_EXPIRED`` (the
  lease ran out on an idempotent task, or the node knows the worker never got the
  attempt) and ``RELEASE`` (the worker handed the task back: draining, or it could not
  take it). RUNNING -> PRELOADED uses the same two events, ``RELEASE`` carrying the
  checkpoint.
* OUTCOME_UNKNOWN is the one state docs/architecture.md#d4 does not have (issue 12). A
  non-idempotent attempt whose lease ran out with no settlement may or may not have run its side
  effect: the node cannot tell a dead worker from a partitioned or paused one, so it neither re-runs
  the task nor calls it failed (``ATTEMPT_LOST``). It is left by a late settlement of that same
  attempt, which makes the outcome known (``COMPLETE``,
  ``FAIL``, ``RELEASE``), or by an operator (``OPERATOR_RETRY`` runs it again under a new
  token, ``OPERATOR_FAIL`` dead-letters it, ``CANCEL``). It is not terminal: a workflow
  waits for it, retention keeps it.

Acks are group-committed and a completion may be accepted by any node (docs/architecture.md#d5,
#d7), so a worker's COMPLETE or FAIL can reach the database before its ACK.
docs/architecture.md#d5's completion write therefore accepts DISPATCHED as well as RUNNING. The
table stays exactly as drawn there; the ``implied_ack`` flag of :func:`transition` and
:func:`sources` composes ``ACK`` with the event instead of widening the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from chronoshard.scheduler.errors import InvalidTransition


class TaskStatus(StrEnum):
    """A task's lifecycle state; the value is the string stored in ``tasks.status``."""

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
    """A non-idempotent attempt's lease ran out unsettled: held for its late settlement or
    an operator's decision (never re-run on its own)."""


class TaskEvent(StrEnum):
    """Something that happens to a task; each names one or more moves of docs/architecture.md#d4."""

    PRELOAD = "PRELOAD"
    """The preloader pulled a SCHEDULED task due within the lookahead into the wheel."""
    DISPATCH = "DISPATCH"
    """The dispatch intent was committed (token+1, attempt+1); the assignment follows."""
    ACK = "ACK"
    """The worker acknowledged the assignment and started the handler."""
    COMPLETE = "COMPLETE"
    """The handler returned successfully."""
    FAIL = "FAIL"
    """The handler raised or timed out; a retry will follow after backoff."""
    LEASE_EXPIRED = "LEASE_EXPIRED"
    """The attempt is given back to run again: an idempotent task's lease ran out, or the
    node knows the worker never got the attempt."""
    ATTEMPT_LOST = "ATTEMPT_LOST"
    """A non-idempotent task's lease ran out (plus the margin) with no settlement: whether
    the attempt ran is unknown."""
    RELEASE = "RELEASE"
    """The worker handed the task back (draining, possibly with a checkpoint)."""
    HANDOFF = "HANDOFF"
    """The shard is moving to another node; the task goes back to the database."""
    BACKOFF_ELAPSED = "BACKOFF_ELAPSED"
    """A RETRYING task's backoff is over and the preloader pulled it into the wheel."""
    EXHAUST = "EXHAUST"
    """A failure left no retries (``retry_count`` reached ``max_retries``)."""
    CANCEL = "CANCEL"
    """Cancelled by the API; from RUNNING, the worker acknowledged a cooperative cancel."""
    OPERATOR_RETRY = "OPERATOR_RETRY"
    """An operator re-queued a dead-lettered task, or one whose outcome is unknown, for a
    new attempt."""
    OPERATOR_FAIL = "OPERATOR_FAIL"
    """An operator declared an attempt whose outcome is unknown failed (dead-lettered)."""
    UPSTREAM_FAIL = "UPSTREAM_FAIL"
    """A workflow parent was dead-lettered; this blocked task will never run."""
    WORKFLOW_RETRY = "WORKFLOW_RETRY"
    """A finished workflow is retried from its failures on (``RetryWorkflow``): each of
    its tasks that did not complete waits again for its reopened parents."""


class AttemptState(StrEnum):
    """The state of one ``task_attempts`` row; each dispatch inserts a new row."""

    DISPATCHED = "DISPATCHED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"
    ABANDONED = "ABANDONED"
    """The worker never acknowledged, or its lease expired; the task was re-dispatched."""
    RELEASED = "RELEASED"
    """The worker handed the task back (drain, or it could not take it)."""
    FENCED = "FENCED"
    """A newer attempt superseded this one; its worker's token went stale."""
    CANCELLED = "CANCELLED"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    """Its lease ran out with no settlement and the task is not idempotent: whether it ran
    is unknown. A late settlement replaces this with what happened; an operator's
    resolution is recorded beside it (``task_attempts.resolution``)."""


class Resolution(StrEnum):
    """How an operator resolved an attempt whose outcome is unknown (``ResolveTask``); the
    value is what ``task_attempts.resolution`` stores."""

    RETRY = "RETRY"
    """Run the task again under a new fencing token (OUTCOME_UNKNOWN -> SCHEDULED)."""
    MARK_FAILED = "MARK_FAILED"
    """Declare the attempt failed (OUTCOME_UNKNOWN -> DEAD_LETTER)."""

    @property
    def event(self) -> TaskEvent:
        return TaskEvent.OPERATOR_RETRY if self is Resolution.RETRY else TaskEvent.OPERATOR_FAIL


_S = TaskStatus
_E = TaskEvent

# docs/architecture.md#d4, one line per arrow, then the arrows issue 12 added. Keep this literal:
# tests/unit/test_states.py spells the same table out independently so a change to either
# side is noticed.
TRANSITIONS: Mapping[tuple[TaskStatus, TaskEvent], TaskStatus] = MappingProxyType(
    {
        (_S.SCHEDULED, _E.PRELOAD): _S.PRELOADED,
        (_S.SCHEDULED, _E.CANCEL): _S.CANCELLED,
        (_S.SCHEDULED, _E.UPSTREAM_FAIL): _S.UPSTREAM_FAILED,
        (_S.PRELOADED, _E.DISPATCH): _S.DISPATCHED,
        (_S.PRELOADED, _E.CANCEL): _S.CANCELLED,
        (_S.PRELOADED, _E.HANDOFF): _S.SCHEDULED,
        (_S.DISPATCHED, _E.ACK): _S.RUNNING,
        (_S.DISPATCHED, _E.LEASE_EXPIRED): _S.PRELOADED,
        (_S.DISPATCHED, _E.RELEASE): _S.PRELOADED,
        (_S.DISPATCHED, _E.CANCEL): _S.CANCELLED,
        (_S.RUNNING, _E.COMPLETE): _S.COMPLETED,
        (_S.RUNNING, _E.FAIL): _S.RETRYING,
        (_S.RUNNING, _E.LEASE_EXPIRED): _S.PRELOADED,
        (_S.RUNNING, _E.RELEASE): _S.PRELOADED,
        (_S.RUNNING, _E.CANCEL): _S.CANCELLED,
        (_S.RETRYING, _E.BACKOFF_ELAPSED): _S.PRELOADED,
        (_S.RETRYING, _E.EXHAUST): _S.DEAD_LETTER,
        (_S.RETRYING, _E.CANCEL): _S.CANCELLED,
        (_S.DEAD_LETTER, _E.OPERATOR_RETRY): _S.SCHEDULED,
        (_S.DEAD_LETTER, _E.WORKFLOW_RETRY): _S.SCHEDULED,
        (_S.CANCELLED, _E.WORKFLOW_RETRY): _S.SCHEDULED,
        (_S.UPSTREAM_FAILED, _E.WORKFLOW_RETRY): _S.SCHEDULED,
        # Issue 12: unknown outcomes of non-idempotent attempts are not guessed.
        (_S.DISPATCHED, _E.ATTEMPT_LOST): _S.OUTCOME_UNKNOWN,
        (_S.RUNNING, _E.ATTEMPT_LOST): _S.OUTCOME_UNKNOWN,
        (_S.OUTCOME_UNKNOWN, _E.COMPLETE): _S.COMPLETED,
        (_S.OUTCOME_UNKNOWN, _E.FAIL): _S.RETRYING,
        (_S.OUTCOME_UNKNOWN, _E.RELEASE): _S.PRELOADED,
        (_S.OUTCOME_UNKNOWN, _E.OPERATOR_RETRY): _S.SCHEDULED,
        (_S.OUTCOME_UNKNOWN, _E.OPERATOR_FAIL): _S.DEAD_LETTER,
        (_S.OUTCOME_UNKNOWN, _E.CANCEL): _S.CANCELLED,
    }
)

TERMINAL: frozenset[TaskStatus] = frozenset(
    {_S.COMPLETED, _S.CANCELLED, _S.DEAD_LETTER, _S.UPSTREAM_FAILED}
)
"""States nothing automatic ever leaves. Only an operator reopens one: a DEAD_LETTER task
by ``RetryTask``, any failed task of a finished workflow by ``RetryWorkflow``."""


def _index_sources() -> dict[TaskEvent, frozenset[TaskStatus]]:
    found: dict[TaskEvent, set[TaskStatus]] = {event: set() for event in TaskEvent}
    for status, event in TRANSITIONS:
        found[event].add(status)
    return {event: frozenset(states) for event, states in found.items()}


def _index_allowed() -> dict[TaskStatus, frozenset[TaskEvent]]:
    found: dict[TaskStatus, set[TaskEvent]] = {status: set() for status in TaskStatus}
    for status, event in TRANSITIONS:
        found[status].add(event)
    return {status: frozenset(events) for status, events in found.items()}


_SOURCES = _index_sources()
_ALLOWED = _index_allowed()


def _via_ack(current: TaskStatus, event: TaskEvent) -> TaskStatus | None:
    """Where ``event`` leads from ``current`` if the worker's ACK is taken as read."""
    acked = TRANSITIONS.get((current, TaskEvent.ACK))
    if acked is None:
        return None
    return TRANSITIONS.get((acked, event))


def transition(current: TaskStatus, event: TaskEvent, *, implied_ack: bool = False) -> TaskStatus:
    """The state ``event`` moves a task in ``current`` to.

    With ``implied_ack``, a move the table allows only after ACK (a worker's COMPLETE or
    FAIL overtaking its group-committed ack) is allowed from DISPATCHED too.

    Raises:
        InvalidTransition: the table has no such move.
    """
    target = TRANSITIONS.get((current, event))
    if target is None and implied_ack:
        target = _via_ack(current, event)
    if target is None:
        raise InvalidTransition(current.value, event.value)
    return target


def sources(event: TaskEvent, *, implied_ack: bool = False) -> frozenset[TaskStatus]:
    """Every state from which ``event`` is a legal move: the store's expected states.

    Exactly the states ``s`` for which ``transition(s, event, implied_ack=...)`` succeeds.
    """
    found = _SOURCES[event]
    if implied_ack:
        found = found | {s for s in TaskStatus if _via_ack(s, event) is not None}
    return found


def allowed_events(status: TaskStatus) -> frozenset[TaskEvent]:
    """Every event the table allows from ``status`` (empty for all terminal states but
    DEAD_LETTER)."""
    return _ALLOWED[status]

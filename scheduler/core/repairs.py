"""What the reconciler decides about in-flight work, pure: no I/O, ``now`` passed in.

:func:`decide` looks at one in-flight row as read (with the database's clock) and says
whether to keep it, give it back (PRELOADED, attempt ABANDONED or lease-expired), cancel
it, or mark its outcome unknown; :func:`workflow_outcome` says whether a run is over;
:func:`next_pass_in_s` how long the loop may sleep. The rules are
docs/architecture.md#d8 as issue 12 amended them (the loop's docstring,
:mod:`chronoshard.scheduler.cluster.reconciler`, tells them in words). The values here
are what the shell reads (:class:`Scan`) and writes (:class:`Repair`) through
:mod:`chronoshard.scheduler.store.repairs`.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from chronoshard.scheduler.core.models import TaskRef
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.core.states import (
    AttemptState,
    TaskEvent,
    TaskStatus,
    transition,
)
from chronoshard.scheduler.core.workflows import RunState, run_state


class Verdict(StrEnum):
    """What the reconciler does with one in-flight row."""

    KEEP = "KEEP"
    """Nothing: the attempt is (or may be) alive and its lease has not run out."""
    REDISPATCH = "REDISPATCH"
    """The attempt is ABANDONED; the task goes back to PRELOADED for a new dispatch."""
    CANCEL = "CANCEL"
    """The task's cancel was requested and its attempt is lost: it ends CANCELLED."""
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    """A non-idempotent attempt's lease ran out unsettled: the task is held, not re-run."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """A DISPATCHED or RUNNING row as the reconciler read it."""

    timer: TimerTask
    status: TaskStatus
    fencing_token: int
    attempt: int
    worker_id: str | None
    idempotent: bool
    cancel_requested: bool
    lease_expires_at: datetime | None
    updated_at: datetime
    """Any write to the row (intent, ack, heartbeat, cancel request) moves it."""

    @property
    def ref(self) -> TaskRef:
        return self.timer.ref


class Cause(StrEnum):
    """Why an attempt is given up (the split of the reconciler's counters)."""

    UNACKNOWLEDGED = "UNACKNOWLEDGED"
    LEASE_EXPIRED = "LEASE_EXPIRED"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    target: TaskStatus | None = None
    """The row's new status (every verdict but KEEP)."""
    attempt_state: AttemptState | None = None
    """What the attempt row records (every verdict but KEEP)."""
    cause: Cause | None = None
    reason: str = ""


KEEP = Decision(Verdict.KEEP)


def _give_back(row: InFlight, cause: Cause, reason: str) -> Decision:
    # A task whose cancel was requested never runs again, whatever took its worker away.
    if row.cancel_requested:
        return Decision(
            Verdict.CANCEL,
            transition(row.status, TaskEvent.CANCEL),
            AttemptState.CANCELLED,
            cause,
            f"{reason}; cancel requested",
        )
    return Decision(
        Verdict.REDISPATCH,
        transition(row.status, TaskEvent.LEASE_EXPIRED),
        AttemptState.ABANDONED,
        cause,
        reason,
    )


def decide(
    row: InFlight,
    now: datetime,
    *,
    ack_timeout_s: float,
    lease_margin_s: float,
    knows: bool | None,
    steady_s: float,
) -> Decision:
    """What to do with ``row`` at ``now`` (the database's clock).

    ``knows`` is the worker's session on this node asked about the attempt: True (this
    node sent it on the live session and it is unsettled), False (the worker has had a
    live session here for at least the ack timeout, which was never sent this attempt)
    or None (no such session: nothing can be learnt locally). ``steady_s`` is how long
    the database has taken writes without a break (:attr:`Scan.steady_s`).

    Why False is enough to run the attempt again, even a non-idempotent one: the row was
    untouched for the ack timeout — no ack, no heartbeat — while the worker had a live
    stream here for as long. A worker that held the attempt would have heartbeated it
    (heartbeats are more frequent than the ack timeout, and go to any usable node) or,
    had it finished, settled it (settlements are resent through any node, at most
    ~5 s apart). What remains is a worker that finished the handler and could not reach
    any node with its result for the whole ack timeout while it had a stream here.

    That reasoning needs the touches to have been recordable: while PostgreSQL was down
    (or refused this node) every ack, heartbeat and settlement failed, and a row is
    "untouched" only because nothing could touch it. So the ack timeout counts only the
    time the database has been steady: after a break the row must stay untouched for a
    whole ack timeout more (the worker resends its acks' settlements and heartbeats as
    soon as a node answers) before the session's "never got it" counts.

    Nothing else gives an attempt up before ``lease_expires_at + lease_margin_s``: not a
    closed stream, not a worker unseen everywhere (a partition looks exactly like that).
    """
    if row.status not in (TaskStatus.DISPATCHED, TaskStatus.RUNNING):
        return KEEP
    untouched_s = min((now - row.updated_at).total_seconds(), steady_s)
    overdue_ack = row.status is TaskStatus.DISPATCHED and untouched_s >= ack_timeout_s
    # Never delivered (the worker's session here was never sent it, and no heartbeat
    # touched the row): nobody runs it, whatever its lease says.
    if overdue_ack and knows is False:
        return _give_back(
            row, Cause.UNACKNOWLEDGED, "not acknowledged; the worker's session never got it"
        )
    if row.lease_expires_at is not None and now < row.lease_expires_at + timedelta(
        seconds=lease_margin_s
    ):
        return KEEP
    # When the lease ran out goes on record: no write of the attempt's worker should land
    # after it (the commit helpers bound their transactions by it).
    expired = "" if row.lease_expires_at is None else f" at {row.lease_expires_at.isoformat()}"
    if row.idempotent or row.cancel_requested:
        return _give_back(row, Cause.LEASE_EXPIRED, f"lease expired{expired}")
    # The worker stopped the attempt by now (it fences itself before its lease runs
    # out), but whether its side effect happened is unknown: running it again could do it
    # twice, calling it failed could lose it. The task waits for an answer.
    return Decision(
        Verdict.OUTCOME_UNKNOWN,
        transition(row.status, TaskEvent.ATTEMPT_LOST),
        AttemptState.OUTCOME_UNKNOWN,
        Cause.LEASE_EXPIRED,
        f"lease expired{expired} with no settlement from worker {row.worker_id or '-'}; the "
        "task is not idempotent, so it is not run again: outcome unknown until its worker "
        "reports or an operator resolves it",
    )


def workflow_outcome(statuses: Collection[TaskStatus]) -> RunState | None:
    """The terminal state of a run whose tasks are in ``statuses`` (each distinct status
    once is enough), or None while any of them can still change on its own: the
    workflow rule (:func:`.workflows.run_state`), as the reconciler's repair asks it."""
    state = run_state(statuses)
    return None if state is RunState.RUNNING else state


# ---- what the shell writes and reads -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Repair:
    """A decided write: the row as read (the compare) and what it becomes (the set)."""

    row: InFlight
    decision: Decision


@dataclass(frozen=True, slots=True)
class RepairResult:
    ready: list[TimerTask]
    """Tasks now PRELOADED: back onto the wheel."""
    cancelled: list[uuid.UUID]
    unknown: list[uuid.UUID]
    """Tasks now OUTCOME_UNKNOWN."""
    applied: frozenset[uuid.UUID]
    lost_shards: frozenset[int]
    released: list[tuple[int, datetime]] = field(default_factory=list)
    """(shard, due_at) of workflow tasks a cancel here made due (``all_done`` children)."""


@dataclass(frozen=True, slots=True)
class RunCandidate:
    id: uuid.UUID
    created_at: datetime
    statuses: frozenset[TaskStatus] | None
    """Distinct statuses of its tasks; None while one of them is not terminal."""


@dataclass(frozen=True, slots=True)
class RunOutcome:
    id: uuid.UUID
    shard: int
    state: RunState


@dataclass(frozen=True, slots=True)
class Scan:
    now: datetime
    rows: list[InFlight]
    next_expiry: datetime | None = None
    """The earliest lease of an in-flight row of the shards not yet due for action (later
    than ``now - lease_margin_s``): the next pass is due at it plus the margin."""
    outcome_unknown: int = 0
    """OUTCOME_UNKNOWN tasks of the shards, as read with the rows."""
    next_ack_due: datetime | None = None
    """When the next DISPATCHED row, untouched since, reaches the ack timeout: an intent
    never delivered (its owner crashed after the commit) is given back then."""
    steady_s: float = math.inf
    """How long, at ``now``, the database has taken writes without a break: since
    PostgreSQL last started, and since this node last saw a call fail for the database's
    reasons (a refused or lost connection, none to be had in time). Touches that fell in
    a break were lost, so :func:`decide` counts no ack timeout across one."""


ACK_DEADLINE_SLACK_S = 0.05
"""Wake this long after a row's ack deadline, so that it is past it when scanned."""
MIN_PASS_GAP_S = 0.01
"""The shortest sleep between passes: a lease due "now" that lost its repair race is
looked at again next pass, not in a busy loop."""


def next_pass_in_s(
    scan: Scan | None,
    *,
    interval_s: float,
    lease_s: float,
    lease_margin_s: float,
    since_start_s: float,
    ack_timeout_s: float,
    since_scan_s: float = 0.0,
) -> float:
    """How long to sleep, at the end of a pass, until the next one.

    The interval counts from the pass's start (``since_start_s`` ago), so a pass that
    overran it is followed at once by the next, never by a second one beside it. It is
    capped at ``lease_s``: a task dispatched right after this pass, whose worker dies at
    once, expires one lease later, and the next pass must see it before then to know
    when to wake. The wake-ups for the earliest lease the scan saw (``scan.next_expiry``
    plus the margin) and for the next ack deadline (``scan.next_ack_due``), both on the
    database's clock of ``scan.now``, count from the scan (``since_scan_s`` ago); so does
    the end of the ack timeout after a break of the database (``scan.steady_s``).
    """
    gap_s = min(interval_s, lease_s) - since_start_s
    if scan is not None and scan.next_expiry is not None:
        due_s = (scan.next_expiry - scan.now).total_seconds() + lease_margin_s
        gap_s = min(gap_s, due_s - since_scan_s)
    if scan is not None and scan.next_ack_due is not None:
        # A little after the deadline: the row must be past it when scanned.
        due_s = (scan.next_ack_due - scan.now).total_seconds() + ACK_DEADLINE_SLACK_S
        gap_s = min(gap_s, due_s - since_scan_s)
    if scan is not None and scan.steady_s < ack_timeout_s:
        # Rows held back by a break of the database come due when it has been steady
        # for the ack timeout.
        due_s = ack_timeout_s - scan.steady_s + ACK_DEADLINE_SLACK_S
        gap_s = min(gap_s, due_s - since_scan_s)
    return max(MIN_PASS_GAP_S, gap_s)

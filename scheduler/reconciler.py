"""The reconcile loop: in-flight work that nobody is looking after goes back to work.

A node keeps no memory across crashes (DESIGN §6 "intent before action"): an intent can
be committed and never sent, an assignment sent and never acknowledged, a worker lost
with its lease. Every ``reconcile.interval_s`` the reconciler reads the in-flight rows
of the node's shards and repairs them (DESIGN §8):

1. **Unconfirmed dispatch.** A DISPATCHED row that nothing touched for
   ``workers.ack_timeout_s`` (a worker that holds a task refreshes its row with every
   heartbeat, so "untouched" means "not delivered or not running") whose worker has a
   session on this node that does not know the attempt, or whose worker is gone, is
   given back: the attempt ABANDONED, the task PRELOADED and on the wheel again, where
   the next intent gives it a new token.
2. **Expired lease.** An idempotent task is given back the same way. A non-idempotent
   one is *held* while its worker may still be alive (a stalled handler must not run
   twice) and counted as stalled; it is given back once no node has seen the worker's
   session for ``workers.session_timeout_s``. A task whose cancel was requested ends
   CANCELLED instead of running again.
3. **Finished workflow runs** still marked RUNNING (no task left that is not terminal)
   are made terminal. A run belongs to the shard of its id.

The decisions are the pure functions :func:`decide` and :func:`workflow_outcome` (no
I/O; ``now`` is the database's clock, read with the rows, so node clock skew cannot
expire a lease early). :class:`Reconciler` is the thin shell: read, decide, write,
hand the freed tasks to the dispatcher. Every write is a compare-and-set on the row as
it was read — status, fencing token and ``updated_at`` — under the shard epochs, in one
transaction (:mod:`.reconcile_store`), so two reconcilers over one shard (old and new
owner in a handoff, or a pass that overran its interval) cannot both win, and a
completion or heartbeat that lands between the read and the write wins: the row changed,
the write changes nothing, and the next pass looks again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from chronoshard.clock import Clock
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.dispatch_store import TimerTask
from chronoshard.scheduler.errors import CommitOutcomeUnknown, StoreUnavailable
from chronoshard.scheduler.models import TaskRef
from chronoshard.scheduler.sharding import shard_of
from chronoshard.scheduler.states import (
    TERMINAL,
    AttemptState,
    TaskEvent,
    TaskStatus,
    transition,
)

log = logging.getLogger(__name__)

# ---- the pure core -------------------------------------------------------------------------


class Verdict(StrEnum):
    """What the reconciler does with one in-flight row."""

    KEEP = "KEEP"
    """Nothing: the attempt is (or may be) alive and its lease has not run out."""
    REDISPATCH = "REDISPATCH"
    """The attempt is ABANDONED; the task goes back to PRELOADED for a new dispatch."""
    CANCEL = "CANCEL"
    """The task's cancel was requested and its attempt is lost: it ends CANCELLED."""
    HOLD = "HOLD"
    """A non-idempotent task's lease expired while its worker may be alive: stalled."""


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
    worker_gone: bool
    """No node has seen a session of ``worker_id`` for ``workers.session_timeout_s``."""

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
    """The row's new status (REDISPATCH, CANCEL)."""
    attempt_state: AttemptState | None = None
    """What the attempt row records (REDISPATCH, CANCEL)."""
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


def decide(row: InFlight, now: datetime, *, ack_timeout_s: float, knows: bool | None) -> Decision:
    """What to do with ``row`` at ``now`` (the database's clock).

    ``knows`` is the worker's session on this node asked about the attempt: True (this
    node sent it on the live session and it is unsettled), False (the worker has had a
    live session here for at least the ack timeout, which was never sent this attempt)
    or None (no such session: nothing can be learnt locally).

    Why False is enough to run the attempt again, even a non-idempotent one: the row was
    untouched for the ack timeout — no ack, no heartbeat — while the worker had a live
    stream here for as long. A worker that held the attempt would have heartbeated it
    (heartbeats are more frequent than the ack timeout, and go to any usable node) or,
    had it finished, settled it (settlements are resent through any node, at most
    ~5 s apart). What remains is a worker that finished the handler and could not reach
    any node with its result for the whole ack timeout while it had a stream here.
    """
    if row.status not in (TaskStatus.DISPATCHED, TaskStatus.RUNNING):
        return KEEP
    unacked = Cause.UNACKNOWLEDGED
    untouched_s = (now - row.updated_at).total_seconds()
    overdue_ack = row.status is TaskStatus.DISPATCHED and untouched_s >= ack_timeout_s
    # Never delivered (the worker's session here was never sent it, and no heartbeat
    # touched the row): nobody runs it, whatever its lease says.
    if overdue_ack and knows is False:
        return _give_back(row, unacked, "not acknowledged; the worker's session never got it")
    expired = Cause.LEASE_EXPIRED
    if row.lease_expires_at is None or row.lease_expires_at <= now:
        if row.idempotent or row.cancel_requested:
            return _give_back(row, expired, "lease expired")
        if row.worker_gone:
            return _give_back(row, expired, "lease expired and the worker's session is gone")
        # Re-running it could run it twice: the worker may be paused, not dead.
        return Decision(Verdict.HOLD, cause=expired, reason="lease expired; worker may be alive")
    if overdue_ack and row.worker_gone:
        return _give_back(row, unacked, "not acknowledged and the worker's session is gone")
    return KEEP


class RunState(StrEnum):
    """``workflow_runs.state``."""

    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


_FAILED_TASKS = frozenset({TaskStatus.DEAD_LETTER, TaskStatus.UPSTREAM_FAILED})


def workflow_outcome(statuses: Collection[TaskStatus]) -> RunState | None:
    """The terminal state of a run whose tasks are in ``statuses`` (each distinct status
    once is enough), or None while any of them can still change on its own.

    A failed task fails the run; otherwise a cancelled one cancels it; a run whose every
    task completed (or that has none) succeeded.
    """
    if any(s not in TERMINAL for s in statuses):
        return None
    if any(s in _FAILED_TASKS for s in statuses):
        return RunState.FAILED
    if TaskStatus.CANCELLED in statuses:
        return RunState.CANCELLED
    return RunState.SUCCEEDED


# ---- the shell -----------------------------------------------------------------------------


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
    applied: frozenset[uuid.UUID]
    lost_shards: frozenset[int]


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


class ReconcileRuns(Protocol):
    """The statements the reconciler issues (:class:`.reconcile_store.ReconcileStore`)."""

    async def scan_inflight(
        self,
        shards: Collection[int],
        *,
        ack_timeout_s: float,
        lease_s: float,
        session_timeout_s: float,
        limit: int,
    ) -> Scan: ...

    async def repair(
        self, epochs: Mapping[int, int], repairs: Sequence[Repair]
    ) -> RepairResult: ...

    async def scan_runs(
        self, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[RunCandidate]: ...

    async def finish_runs(
        self, epochs: Mapping[int, int], outcomes: Sequence[RunOutcome]
    ) -> tuple[list[uuid.UUID], frozenset[int]]: ...


class Shards(Protocol):
    def epochs(self) -> Mapping[int, int]: ...

    def dispatch_allowed(self) -> bool: ...

    def epochs_lost(self, shards: Collection[int]) -> None: ...


class Sessions(Protocol):
    """The worker gateway, asked about attempts it sent."""

    def knows(
        self, worker_id: str, task_id: uuid.UUID, token: int, *, min_age_s: float = 0.0
    ) -> bool | None: ...

    def attempt_superseded(self, task_id: uuid.UUID, token: int) -> None: ...


class Wheel(Protocol):
    """The dispatcher: freed tasks go back onto its wheel (only those of owned shards)."""

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None: ...

    def preloaded_unknown(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PassReport:
    examined: int
    redispatched: int
    cancelled: int
    held: int
    lost_races: int
    runs_finished: int


WORKFLOW_SCAN_LIMIT = 500


class Reconciler:
    def __init__(
        self,
        config: SchedulerConfig,
        clock: Clock,
        runs: ReconcileRuns,
        shards: Shards,
        sessions: Sessions,
        wheel: Wheel,
        shard_count: int,
    ) -> None:
        self._config = config
        self._clock = clock
        self._runs = runs
        self._shards = shards
        self._sessions = sessions
        self._wheel = wheel
        self._shard_count = shard_count
        self._run_cursor: tuple[datetime, uuid.UUID] | None = None
        self.stalled = 0
        """Non-idempotent tasks held by the last pass (lease expired, worker maybe alive)."""
        self.stats: dict[str, int] = {
            "passes": 0,
            "redispatched": 0,
            "abandoned_unacknowledged": 0,
            "abandoned_lease_expired": 0,
            "cancelled": 0,
            "lost_races": 0,
            "workflow_runs_finished": 0,
            "store_errors": 0,
        }

    async def run(self) -> None:
        interval_s = self._config.reconcile.interval_s
        while True:
            started = self._clock.monotonic()
            if self._shards.dispatch_allowed():
                try:
                    await self.reconcile_once()
                except StoreUnavailable as exc:
                    self.stats["store_errors"] += 1
                    log.warning("reconcile pass failed; next pass", extra={"error": str(exc)})
            # A pass that overran its interval is followed at once by the next, never by
            # a second one running beside it (a second one would be safe, only wasteful).
            elapsed = self._clock.monotonic() - started
            await asyncio.sleep(max(0.0, interval_s - elapsed))

    async def reconcile_once(self) -> PassReport:
        """One pass over the owned shards: in-flight rows, then workflow runs."""
        epochs = dict(self._shards.epochs())
        self.stats["passes"] += 1
        if not epochs:
            self.stalled = 0
            return PassReport(0, 0, 0, 0, 0, 0)
        workers = self._config.workers
        scan = await self._runs.scan_inflight(
            epochs.keys(),
            ack_timeout_s=workers.ack_timeout_s,
            lease_s=workers.task_lease_s,
            session_timeout_s=workers.session_timeout_s,
            limit=self._config.reconcile.batch_limit,
        )
        repairs: list[Repair] = []
        held = 0
        for row in scan.rows:
            knows = None
            if row.worker_id is not None:
                # Only a session open for the whole ack timeout can say "never got it": a
                # younger one may belong to a worker that holds the attempt from an
                # earlier stream (or an earlier owner) and has not heartbeated it here yet.
                knows = self._sessions.knows(
                    row.worker_id,
                    row.timer.id,
                    row.fencing_token,
                    min_age_s=workers.ack_timeout_s,
                )
            decision = decide(row, scan.now, ack_timeout_s=workers.ack_timeout_s, knows=knows)
            if decision.verdict is Verdict.HOLD:
                held += 1
            elif decision.verdict is not Verdict.KEEP:
                repairs.append(Repair(row, decision))
        self.stalled = held
        result = RepairResult([], [], frozenset(), frozenset())
        if repairs:
            try:
                result = await self._runs.repair(epochs, repairs)
            except CommitOutcomeUnknown:
                # Repaired rows may be PRELOADED now and on no wheel: read them back.
                self._wheel.preloaded_unknown()
                raise
            self._after_repair(repairs, result)
        runs_finished = await self._finish_runs(epochs)
        lost = len(repairs) - len(result.applied)
        return PassReport(
            examined=len(scan.rows),
            redispatched=len(result.ready),
            cancelled=len(result.cancelled),
            held=held,
            lost_races=lost,
            runs_finished=runs_finished,
        )

    def _after_repair(self, repairs: Sequence[Repair], result: RepairResult) -> None:
        if result.lost_shards:
            self._shards.epochs_lost(result.lost_shards)
        for repair in repairs:
            row, decision = repair.row, repair.decision
            if row.timer.id not in result.applied:
                # A completion, heartbeat, ack or another reconciler got there first.
                self.stats["lost_races"] += 1
                continue
            # Its worker (if its session is here) is told at its next heartbeat; the
            # session stops counting the attempt against the tenant's concurrency now.
            self._sessions.attempt_superseded(row.timer.id, row.fencing_token)
            if decision.verdict is Verdict.CANCEL:
                self.stats["cancelled"] += 1
            elif decision.cause is Cause.UNACKNOWLEDGED:
                self.stats["abandoned_unacknowledged"] += 1
            else:
                self.stats["abandoned_lease_expired"] += 1
            log.info(
                "reconciler repaired a task",
                extra={
                    "task_id": str(row.timer.id),
                    "fencing_token": row.fencing_token,
                    "worker_id": row.worker_id,
                    "verdict": decision.verdict.value,
                    "reason": decision.reason,
                },
            )
        self.stats["redispatched"] += len(result.ready)
        if result.ready:
            self._wheel.tasks_ready_again(result.ready)

    async def _finish_runs(self, epochs: Mapping[int, int]) -> int:
        candidates = await self._runs.scan_runs(self._run_cursor, WORKFLOW_SCAN_LIMIT)
        # Keyset paging across passes bounds each pass's cost however many runs are
        # active; a short page means the end was reached and the next pass starts over.
        if len(candidates) < WORKFLOW_SCAN_LIMIT:
            self._run_cursor = None
        else:
            last = candidates[-1]
            self._run_cursor = (last.created_at, last.id)
        outcomes: dict[uuid.UUID, RunOutcome] = {}
        for run in candidates:
            shard = shard_of(run.id, self._shard_count)
            if run.statuses is None or shard not in epochs:
                continue
            state = workflow_outcome(run.statuses)
            if state is not None:
                outcomes[run.id] = RunOutcome(run.id, shard, state)
        if not outcomes:
            return 0
        finished, lost = await self._runs.finish_runs(epochs, list(outcomes.values()))
        if lost:
            self._shards.epochs_lost(lost)
        self.stats["workflow_runs_finished"] += len(finished)
        for run_id in finished:
            log.info(
                "reconciler finished a workflow run",
                extra={"workflow_id": str(run_id), "state": outcomes[run_id].state.value},
            )
        return len(finished)

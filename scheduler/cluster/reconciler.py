"""The reconcile loop: in-flight work that nobody is looking after goes back to work.

A node keeps no memory across crashes (docs/architecture.md#d6 "intent before action"): an intent
can be committed and never sent, an assignment sent and never acknowledged, a worker lost with its
lease. The reconciler reads the in-flight rows of the node's shards and repairs them
(docs/architecture.md#d8, with issue 12's rules for leases):

1. **Unconfirmed dispatch.** A DISPATCHED row that nothing touched for
   ``workers.ack_timeout_s`` (a worker that holds a task refreshes its row with every
   heartbeat, so "untouched" means "not delivered or not running"; time while the
   database was down or failing this node's calls does not count, since no touch could
   land then) whose worker has a session on this node that does not know the attempt is
   given back: the attempt
   ABANDONED, the task PRELOADED and on the wheel again, where the next intent gives it
   a new token. This is the one case where the node *knows* the attempt never ran, so it
   holds for non-idempotent tasks too (a crash between intent and send).
2. **Expired lease.** Acted on only ``workers.lease_margin_s`` after
   ``lease_expires_at`` (the database's clock): the worker stops the attempt on its own
   that margin *before* its lease runs out (worker self-fencing, docs/worker-sdk.md), so
   by then nothing of the attempt is running. An idempotent task is given back as
   above. A non-idempotent one may have run its side effect or not — a dead worker, a
   partitioned one and a paused one look the same from here — so it is never run again
   on a guess: the task becomes OUTCOME_UNKNOWN, its attempt recorded as such, counted
   by a gauge, until its own late settlement makes the outcome known or an operator
   resolves it (``ResolveTask``). A task whose cancel was requested ends CANCELLED.
3. **Finished workflow runs** still marked RUNNING (no task left that is not terminal)
   are made terminal. A run belongs to the shard of its id.

A pass runs every ``reconcile.interval_s``, and also at the next lease expiry (plus the
margin) that the previous pass saw coming, so an expired lease is acted on within the
pass's own latency of ``lease_expires_at + lease_margin_s``, not up to an interval later.

The decisions are the pure functions of :mod:`chronoshard.scheduler.core.repairs`
(:func:`~chronoshard.scheduler.core.repairs.decide`, ``workflow_outcome``; no I/O; ``now``
is the database's clock, read with the rows, so node clock skew cannot expire a lease
early). :class:`Reconciler` is the thin shell: read, decide, write, hand the freed tasks to
the dispatcher. Every write is a compare-and-set on the row as it was read — status, fencing
token and ``updated_at`` — under the shard epochs, in one transaction
(:mod:`chronoshard.scheduler.store.repairs`), so two reconcilers over one shard (old and new
owner in a handoff, or a pass that overran its interval) cannot both win, and a completion
or heartbeat that lands between the read and the write wins: the row changed, the write
changes nothing, and the next pass looks again."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Protocol

from chronoshard.clock import Clock
from chronoshard.events import wait_event
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.repairs import (
    MIN_PASS_GAP_S,
    Cause,
    Repair,
    RepairResult,
    RunCandidate,
    RunOutcome,
    Scan,
    Verdict,
    decide,
    next_pass_in_s,
    workflow_outcome,
)
from chronoshard.scheduler.core.runs import TimerTask
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.errors import CommitOutcomeUnknown, StoreUnavailable

log = logging.getLogger(__name__)


class ReconcileRuns(Protocol):
    """The statements the reconciler issues
    (:class:`chronoshard.scheduler.store.repairs.RepairStore`)."""

    async def scan_inflight(
        self,
        shards: Collection[int],
        *,
        ack_timeout_s: float,
        lease_s: float,
        lease_margin_s: float,
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
    """The worker sessions (``dispatch/sessions.py``), asked about attempts this node sent."""

    def knows(
        self, worker_id: str, task_id: uuid.UUID, token: int, *, min_age_s: float = 0.0
    ) -> bool | None: ...

    def attempt_superseded(self, task_id: uuid.UUID, token: int) -> None: ...


class Wheel(Protocol):
    """The dispatcher: freed tasks go back onto its wheel (only those of owned shards)."""

    def tasks_ready_again(self, tasks: Sequence[TimerTask]) -> None: ...

    def task_due(self, shard: int, due_at: datetime) -> None: ...

    def preloaded_unknown(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PassReport:
    examined: int
    redispatched: int
    cancelled: int
    outcome_unknown: int
    """Tasks this pass moved to OUTCOME_UNKNOWN."""
    lost_races: int
    runs_finished: int
    next_pass_in_s: float
    """How long the loop sleeps before the next pass (the interval, or less when a lease
    expires sooner)."""


WORKFLOW_SCAN_LIMIT = 500


def plan_repairs(
    scan: Scan, sessions: Sessions, *, ack_timeout_s: float, lease_margin_s: float
) -> list[Repair]:
    """The repairs a pass makes of ``scan``'s rows: each row decided
    (:func:`~chronoshard.scheduler.core.repairs.decide`) with what this node's worker
    sessions know of its attempt; the rows to keep are left out."""
    repairs: list[Repair] = []
    for row in scan.rows:
        knows = None
        if row.worker_id is not None:
            # Only a session open for the whole ack timeout can say "never got it": a
            # younger one may belong to a worker that holds the attempt from an earlier
            # stream (or an earlier owner) and has not heartbeated it here yet.
            knows = sessions.knows(
                row.worker_id, row.timer.id, row.fencing_token, min_age_s=ack_timeout_s
            )
        decision = decide(
            row,
            scan.now,
            ack_timeout_s=ack_timeout_s,
            lease_margin_s=lease_margin_s,
            knows=knows,
            steady_s=scan.steady_s,
        )
        if decision.verdict is not Verdict.KEEP:
            repairs.append(Repair(row, decision))
    return repairs


class Reconciler:
    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

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
        self.outcome_unknown = 0
        """OUTCOME_UNKNOWN tasks of the owned shards after the last pass (a gauge)."""
        self._wake = asyncio.Event()
        self._stats: dict[str, int] = {
            "passes": 0,
            "redispatched": 0,
            "abandoned_unacknowledged": 0,
            "abandoned_lease_expired": 0,
            "cancelled": 0,
            "outcome_unknown": 0,
            "lost_races": 0,
            "workflow_runs_finished": 0,
            "store_errors": 0,
        }

    def _gap_s(self, started: float, scan: Scan | None = None, scanned_at: float = 0.0) -> float:
        now = self._clock.monotonic()
        return next_pass_in_s(
            scan,
            interval_s=self._config.reconcile.interval_s,
            lease_s=self._config.workers.task_lease_s,
            lease_margin_s=self._config.workers.lease_margin_s,
            since_start_s=now - started,
            since_scan_s=now - scanned_at,
            ack_timeout_s=self._config.workers.ack_timeout_s,
        )

    def wake(self) -> None:
        """Pass now (a shard was just claimed: its previous owner's undelivered intents
        may be overdue already)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            # Cleared before the pass: a wake-up during it (a claim) is not lost.
            self._wake.clear()
            started = self._clock.monotonic()
            gap_s = None
            if self._shards.dispatch_allowed():
                try:
                    gap_s = (await self.reconcile_once()).next_pass_in_s
                except StoreUnavailable as exc:
                    self._stats["store_errors"] += 1
                    log.warning("reconcile pass failed; next pass", extra={"error": str(exc)})
            await wait_event(self._wake, self._gap_s(started) if gap_s is None else gap_s)

    async def reconcile_once(self) -> PassReport:
        """One pass over the owned shards: in-flight rows, then workflow runs."""
        started = self._clock.monotonic()
        epochs = dict(self._shards.epochs())
        self._stats["passes"] += 1
        if not epochs:
            self.outcome_unknown = 0
            return PassReport(0, 0, 0, 0, 0, 0, self._gap_s(started))
        workers = self._config.workers
        scan = await self._runs.scan_inflight(
            epochs.keys(),
            ack_timeout_s=workers.ack_timeout_s,
            lease_s=workers.task_lease_s,
            lease_margin_s=workers.lease_margin_s,
            limit=self._config.reconcile.batch_limit,
        )
        scanned_at = self._clock.monotonic()
        repairs = plan_repairs(
            scan,
            self._sessions,
            ack_timeout_s=workers.ack_timeout_s,
            lease_margin_s=workers.lease_margin_s,
        )
        result = await self._repair(epochs, repairs)
        self.outcome_unknown = scan.outcome_unknown + len(result.unknown)
        runs_finished = await self._finish_runs(epochs)
        gap_s = self._gap_s(started, scan, scanned_at)
        if len(scan.rows) >= self._config.reconcile.batch_limit:
            # A full batch: more rows may be waiting behind it (a mass failure). Go on.
            gap_s = MIN_PASS_GAP_S
        return PassReport(
            examined=len(scan.rows),
            redispatched=len(result.ready),
            cancelled=len(result.cancelled),
            outcome_unknown=len(result.unknown),
            lost_races=len(repairs) - len(result.applied),
            runs_finished=runs_finished,
            next_pass_in_s=gap_s,
        )

    async def _repair(self, epochs: Mapping[int, int], repairs: Sequence[Repair]) -> RepairResult:
        """Write ``repairs`` (compare-and-set, under ``epochs``) and act on what applied."""
        if not repairs:
            return RepairResult([], [], [], frozenset(), frozenset())
        try:
            result = await self._runs.repair(epochs, repairs)
        except CommitOutcomeUnknown:
            # Repaired rows may be PRELOADED now and on no wheel: read them back.
            self._wheel.preloaded_unknown()
            raise
        self._after_repair(repairs, result)
        return result

    def _after_repair(self, repairs: Sequence[Repair], result: RepairResult) -> None:
        if result.lost_shards:
            self._shards.epochs_lost(result.lost_shards)
        for repair in repairs:
            row, decision = repair.row, repair.decision
            if row.timer.id not in result.applied:
                # A completion, heartbeat, ack or another reconciler got there first.
                self._stats["lost_races"] += 1
                continue
            # Its worker (if its session is here) is told at its next heartbeat; the
            # session stops counting the attempt against the tenant's concurrency now.
            self._sessions.attempt_superseded(row.timer.id, row.fencing_token)
            if decision.verdict is Verdict.CANCEL:
                self._stats["cancelled"] += 1
            elif decision.verdict is Verdict.OUTCOME_UNKNOWN:
                self._stats["outcome_unknown"] += 1
            elif decision.cause is Cause.UNACKNOWLEDGED:
                self._stats["abandoned_unacknowledged"] += 1
            else:
                self._stats["abandoned_lease_expired"] += 1
            unknown = decision.verdict is Verdict.OUTCOME_UNKNOWN
            # An unknown outcome needs an operator (or the worker's late report): a
            # warning, where a routine repair is information.
            log.log(
                logging.WARNING if unknown else logging.INFO,
                "task outcome unknown; held for resolution"
                if unknown
                else "reconciler repaired a task",
                extra={
                    "task_id": str(row.timer.id),
                    "tenant_id": str(row.timer.tenant_id),
                    "shard": row.timer.shard,
                    "fencing_token": row.fencing_token,
                    "worker_id": row.worker_id,
                    "verdict": decision.verdict.value,
                    "reason": decision.reason,
                },
            )
        self._stats["redispatched"] += len(result.ready)
        if result.ready:
            self._wheel.tasks_ready_again(result.ready)
        for shard, due_at in result.released:
            self._wheel.task_due(shard, due_at)

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
        self._stats["workflow_runs_finished"] += len(finished)
        for run_id in finished:
            log.info(
                "reconciler finished a workflow run",
                extra={"workflow_id": str(run_id), "state": outcomes[run_id].state.value},
            )
        return len(finished)

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)

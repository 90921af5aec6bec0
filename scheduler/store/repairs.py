"""PostgreSQL for the reconcile loop: its scans, repairs and workflow-run endings.

Issues the named statements of ``sql/repairs.sql`` over the :class:`.database.Store`'s
pool. Like :class:`.runs.RunStore`, it holds no policy: the reconciler
decides (:func:`chronoshard.scheduler.core.repairs.decide`), this writes the decisions, each a
compare-and-set on the row as read, in one transaction that first locks the shards' ``shard_owners``
rows ``FOR SHARE`` and writes only for the shards whose epoch is still the caller's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from chronoshard.scheduler.core.repairs import (
    InFlight,
    Repair,
    RepairResult,
    RunCandidate,
    RunOutcome,
    Scan,
)
from chronoshard.scheduler.core.states import TaskStatus
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.runs import batch_keys, timer_from_row
from chronoshard.scheduler.store.workflow_progress import finish_runs, finished_rows, settle

_BEFORE_EVERY_RUN = (datetime.fromisoformat("0001-01-01T00:00:00+00:00"), uuid.UUID(int=0))


def _in_flight(row: Mapping[str, Any]) -> InFlight:
    return InFlight(
        timer=timer_from_row(row),
        status=TaskStatus(row["status"]),
        fencing_token=row["fencing_token"],
        attempt=row["attempt"],
        worker_id=row["worker_id"],
        idempotent=row["idempotent"],
        cancel_requested=row["cancel_requested"],
        lease_expires_at=row["lease_expires_at"],
        updated_at=row["updated_at"],
    )


class RepairStore:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load("repairs.sql")

    async def scan_inflight(
        self,
        shards: Collection[int],
        *,
        ack_timeout_s: float,
        lease_s: float,
        lease_margin_s: float,
        limit: int,
    ) -> Scan:
        """The in-flight rows of ``shards`` that may need repair, with the database's now,
        the next lease to expire, the count of OUTCOME_UNKNOWN tasks and how long the
        database has been steady (since PostgreSQL started, and since this node's last
        failed call)."""
        params = {
            "shards": sorted(shards),
            "horizon_s": max(0.0, lease_s - ack_timeout_s),
            "margin_s": lease_margin_s,
            "ack_timeout_s": ack_timeout_s,
            "limit": limit,
        }
        # Taken before now() is: the database's steadiness is never overstated.
        since_failure_s = time.monotonic() - self._store.last_failure_at
        # One transaction: now() is the same instant in both statements.
        async with self._store.transaction() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["pass_state"], params)
            state = await cur.fetchone()
            assert state is not None
            await cur.execute(self._q["scan_inflight"], params)
            rows = await cur.fetchall()
        return Scan(
            now=state["now"],
            rows=[_in_flight(r) for r in rows],
            next_expiry=state["next_expiry"],
            outcome_unknown=state["outcome_unknown"],
            next_ack_due=state["next_ack_due"],
            steady_s=min(state["up_s"], since_failure_s),
        )

    async def repair(self, epochs: Mapping[int, int], repairs: Sequence[Repair]) -> RepairResult:
        """Apply the decided repairs whose shard is still ours and whose row is unchanged."""
        shards = {r.row.timer.shard for r in repairs}
        wanted = {s: epochs[s] for s in shards if s in epochs}
        async with self._store.transaction() as conn:
            owned = await self._store.owned_shards(conn, wanted)
            mine = [r for r in repairs if r.row.timer.shard in owned]
            lost = frozenset(shards - owned)
            if not mine:
                return RepairResult([], [], [], frozenset(), lost)
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["repair"],
                {
                    **batch_keys(
                        [r.row.timer.scheduled_at for r in mine], [r.row.timer.id for r in mine]
                    ),
                    "statuses": [str(r.row.status) for r in mine],
                    "tokens": [r.row.fencing_token for r in mine],
                    "updated_ats": [r.row.updated_at for r in mine],
                    "targets": [str(r.decision.target) for r in mine],
                    "attempt_states": [str(r.decision.attempt_state) for r in mine],
                    "reasons": [r.decision.reason for r in mine],
                    "shards": sorted(owned),
                },
            )
            rows = await cur.fetchall()
            # A cancelled workflow task settles its run in this transaction.
            released = await settle(conn, finished_rows(rows))
        ready = [timer_from_row(r) for r in rows if r["status"] == TaskStatus.PRELOADED]
        cancelled = [r["id"] for r in rows if r["status"] == TaskStatus.CANCELLED]
        unknown = [r["id"] for r in rows if r["status"] == TaskStatus.OUTCOME_UNKNOWN]
        return RepairResult(
            ready,
            cancelled,
            unknown,
            frozenset(r["id"] for r in rows),
            lost,
            [(t.shard, t.due_at) for t in released],
        )

    async def scan_runs(
        self, after: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[RunCandidate]:
        created_at, run_id = after or _BEFORE_EVERY_RUN
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["scan_runs"],
                {"after_created_at": created_at, "after_id": run_id, "limit": limit},
            )
            rows = await cur.fetchall()
        return [
            RunCandidate(
                id=r["id"],
                created_at=r["created_at"],
                statuses=None
                if r["statuses"] is None
                else frozenset(TaskStatus(s) for s in r["statuses"]),
            )
            for r in rows
        ]

    async def finish_runs(
        self, epochs: Mapping[int, int], outcomes: Sequence[RunOutcome]
    ) -> tuple[list[uuid.UUID], frozenset[int]]:
        """Make the runs terminal, under the epochs of their shards; (finished, lost)."""
        shards = {o.shard for o in outcomes}
        wanted = {s: epochs[s] for s in shards if s in epochs}
        async with self._store.transaction() as conn:
            owned = await self._store.owned_shards(conn, wanted)
            mine = [o for o in outcomes if o.shard in owned]
            lost = frozenset(shards - owned)
            if not mine:
                return [], lost
            # The settlement's own finish (row lock, live-task check, run_state, and the
            # ledger row of a run that succeeded): the scan's decision is made again there.
            return await finish_runs(conn, [o.id for o in mine]), lost

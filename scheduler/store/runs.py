"""Run state in PostgreSQL: preload, dispatch intent, and what workers report back.

The hot path of the scheduler, as batches: each method takes many tasks and issues one
statement for them (``sql/runs.sql``), so the callers can group-commit acks,
heartbeats and settlements arriving from many workers (docs/architecture.md#d7).

Shard writes (preload, intent, unload) run in one transaction that first locks every
touched shard's ``shard_owners`` row ``FOR SHARE`` and drops the shards whose epoch is
not the caller's (docs/architecture.md#d5): a node that lost a shard writes nothing for it, and
learns which shards it lost from the result.

Worker settlements are conditional on the fencing token and need no epoch: any node may
accept them (docs/architecture.md#d5). When a settlement changes nothing, :meth:`_classify` reads
the row back to tell an idempotent repeat (same token, the step already taken: answer OK) from a
stale token (another attempt owns the task).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

import psycopg
from psycopg.rows import dict_row

from chronoshard.scheduler.core.handoff import Cursor
from chronoshard.scheduler.core.models import Priority, Task, TaskRef
from chronoshard.scheduler.core.quotas import Admission
from chronoshard.scheduler.core.retry import RetryBudget, decide
from chronoshard.scheduler.core.runs import (
    Beat,
    Completion,
    Failure,
    Intent,
    IntentResult,
    Interner,
    LeaseUpdate,
    Release,
    Settle,
    SettleOutcome,
    SettleResult,
    TimerTask,
    intent_committed,
)
from chronoshard.scheduler.core.states import TaskStatus
from chronoshard.scheduler.core.workflows import Place
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection, Store, task_from_row
from chronoshard.scheduler.store.quotas import DispatchQuotaStore
from chronoshard.scheduler.store.workflow_progress import (
    Finished,
    finished_rows,
    places,
    settle,
)
from chronoshard.scheduler.turns import in_turns
from chronoshard.wire import DEFAULT_LEASE_MARGIN_S

log = logging.getLogger(__name__)


# What a repeated settlement may find when the step was already taken by the same token.
_ALREADY = {
    # A late ack of an attempt whose outcome became unknown changes nothing (only its
    # settlement does), and must not make its worker drop that settlement as stale.
    "ack": {
        TaskStatus.RUNNING,
        TaskStatus.COMPLETED,
        TaskStatus.RETRYING,
        TaskStatus.DEAD_LETTER,
        TaskStatus.OUTCOME_UNKNOWN,
    },
    "complete": {TaskStatus.COMPLETED},
    "fail": {TaskStatus.RETRYING, TaskStatus.DEAD_LETTER, TaskStatus.CANCELLED},
    "release": {TaskStatus.PRELOADED, TaskStatus.SCHEDULED},
}


# The fields a node's timers repeat, one object per distinct value (core.runs.Interner):
# tenants, queues and task types are few. (The shard and the instants are packed into
# one int by the TimerTask: no object of their own.)
_TENANTS: Interner[uuid.UUID] = Interner(100_000)
_NAMES: Interner[str] = Interner(100_000)


def timer_from_row(row: Mapping[str, Any]) -> TimerTask:
    """A wheel entry from a ``tasks`` row read with ``dict_row``; its repeated fields are
    shared with every other timer's (a million of them waiting made the node's RSS grow
    by ~800 bytes each)."""
    return TimerTask(
        id=row["id"],
        scheduled_at=row["scheduled_at"],
        shard=row["shard"],
        tenant_id=_TENANTS.get(row["tenant_id"]),
        priority=Priority(row["priority"]),
        queue=_NAMES.get(row["queue"]),
        type=_NAMES.get(row["type"]),
        due_at=row["due_at"],
        strict_timing=row["strict_timing"],
    )


def batch_keys(scheduled_ats: list[datetime], ids: list[uuid.UUID]) -> dict[str, list[Any]]:
    """A batch's keys as the statements of ``runs.sql`` take them: the arrays, and the
    batch's distinct instants for partition pruning. Not the per-key array: checked
    against every row a scan returns, an array of one entry per key made a batch of
    5,000 keys compare each row 5,000 times (a stampede shares one instant), and the
    preloader's load_due ran for 30 s per batch."""
    return {"scheduled_ats": scheduled_ats, "ids": ids, "instants": sorted(set(scheduled_ats))}


def _refs(items: Iterable[Settle]) -> dict[str, list[Any]]:
    items = list(items)
    return {
        **batch_keys([i.ref.scheduled_at for i in items], [i.ref.id for i in items]),
        "tokens": [i.token for i in items],
    }


def _keyset(after: Cursor | None) -> dict[str, Any]:
    """The ``after_due``/``after_id`` parameters of a keyset-paged statement."""
    return {"after_due": after[0] if after else None, "after_id": after[1] if after else None}


def _per_tenant(intents: Iterable[Intent]) -> dict[uuid.UUID, int]:
    counts: dict[uuid.UUID, int] = {}
    for intent in intents:
        counts[intent.task.tenant_id] = counts.get(intent.task.tenant_id, 0) + 1
    return counts


_Screen = Callable[[list[Intent]], Awaitable[list[Intent]]]
"""Cuts a round's intents (of owned shards) to those it may write, in its transaction."""

ROLLBACK_RETRIES = 3
_P = ParamSpec("_P")
_T = TypeVar("_T")


def _retry_rollbacks(
    method: Callable[_P, Awaitable[_T]],
) -> Callable[_P, Awaitable[_T]]:
    """Run a batch again when PostgreSQL rolled it back (deadlock, serialization).

    The batch statements lock rows in one order, so this should not happen; when it
    does anyway (a lock taken by something outside this module), the batch is safe to
    repeat: nothing of it committed.
    """

    @functools.wraps(method)
    async def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        for attempt in range(1, ROLLBACK_RETRIES + 1):
            try:
                return await method(*args, **kwargs)
            except StoreUnavailable as exc:
                rolled_back = isinstance(
                    exc.__cause__,
                    psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure,
                )
                if not rolled_back or attempt == ROLLBACK_RETRIES:
                    raise
                log.warning(
                    "batch rolled back; retrying",
                    extra={"operation": method.__name__, "attempt": attempt, "error": str(exc)},
                )
        raise AssertionError("unreachable")

    return run


class RunStore:
    """Batch run-state statements over the :class:`Store`'s pool.

    With ``quotas`` (a node's), every dispatch round is checked against its tenants'
    cluster-wide quotas in the transaction that writes its intents (:mod:`.quotas`);
    without (the store's own tests), intents are written as asked.
    """

    def __init__(self, store: Store, quotas: DispatchQuotaStore | None = None) -> None:
        self._store = store
        self._q = queries.load("runs.sql")
        self._quotas = quotas

    def limits_changed(self, tenant_id: uuid.UUID) -> None:
        """A tenant's limits were changed: this node's allowance for it is given up."""
        if self._quotas is not None:
            self._quotas.allowances.drop(tenant_id)

    # ---- shard-fenced writes ------------------------------------------------------------

    async def load_due(
        self, epochs: Mapping[int, int], horizon: datetime, limit: int
    ) -> tuple[list[TimerTask], frozenset[int]]:
        """Move due SCHEDULED/RETRYING tasks of the shards to PRELOADED, earliest first.

        Returns the moved tasks and the shards whose epoch was lost (nothing moved there).
        """
        async with self._store.transaction() as conn:
            owned = await self._store.owned_shards(conn, epochs)
            if not owned:
                return [], frozenset(epochs)
            cur = await conn.execute(
                self._q["due_refs"],
                {"shards": sorted(owned), "horizon": horizon, "limit": limit},
            )
            due = await cur.fetchall()
            if not due:
                return [], frozenset(epochs.keys() - owned)
            # Two statements: see load_due in sql/runs.sql (partition pruning).
            dict_cur = conn.cursor(row_factory=dict_row)
            await dict_cur.execute(
                self._q["load_due"],
                batch_keys([r[0] for r in due], [r[1] for r in due]),
            )
            rows = await dict_cur.fetchall()
        timers = await in_turns(rows, lambda _, row: timer_from_row(row))
        return timers, frozenset(epochs.keys() - owned)

    async def load_preloaded(
        self,
        epochs: Mapping[int, int],
        *,
        after: Cursor | None = None,
        limit: int | None = None,
    ) -> list[TimerTask]:
        """The PRELOADED tasks of shards just claimed (left by a previous owner), in
        ``(due_at, id)`` order: those after ``after``, at most ``limit``."""
        async with self._store.transaction() as conn:
            owned = await self._store.owned_shards(conn, epochs)
            if not owned:
                return []
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["load_preloaded"],
                {"shards": sorted(owned), "limit": limit, **_keyset(after)},
            )
            return [timer_from_row(r) for r in await cur.fetchall()]

    async def read_warm(
        self, shard: int, horizon: datetime, after: Cursor | None, limit: int
    ) -> list[TimerTask]:
        """A shard's tasks due before ``horizon`` that are or will be PRELOADED, in
        ``(due_at, id)`` order after ``after``: read for a shard another node still owns
        (planned handoff), so no epoch applies and nothing changes."""
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["read_warm"],
                {"shard": shard, "horizon": horizon, "limit": limit, **_keyset(after)},
            )
            return [timer_from_row(r) for r in await cur.fetchall()]

    async def read_back_preloaded(self, epochs: Mapping[int, int]) -> list[TimerTask]:
        """Every PRELOADED task of the shards, once no write whose outcome is unknown can
        still commit (a read-back: see the preloader's resync)."""
        await self._store.end_lost_transactions()
        return await self.load_preloaded(epochs)

    async def load_preloaded_refs(
        self, epochs: Mapping[int, int], refs: Sequence[TaskRef]
    ) -> list[TimerTask]:
        """The given tasks, if they are PRELOADED and in a shard we own (under its epoch)."""
        if not refs:
            return []
        async with self._store.transaction() as conn:
            owned = await self._store.owned_shards(conn, epochs)
            if not owned:
                return []
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["load_preloaded_refs"],
                {
                    **batch_keys([r.scheduled_at for r in refs], [r.id for r in refs]),
                    "shards": sorted(owned),
                },
            )
            return [timer_from_row(r) for r in await cur.fetchall()]

    async def unload_preloaded(
        self, epochs: Mapping[int, int], *, after: Cursor | None = None
    ) -> int:
        """PRELOADED rows of the shards (after ``after`` in ``(due_at, id)`` order, if
        given) back to SCHEDULED; how many moved."""
        async with self._store.transaction() as conn:
            owned = await self._store.owned_shards(conn, epochs)
            if not owned:
                return 0
            cur = await conn.execute(
                self._q["unload_preloaded"], {"shards": sorted(owned), **_keyset(after)}
            )
            return cur.rowcount

    @_retry_rollbacks
    async def write_intents(
        self, epochs: Mapping[int, int], intents: Sequence[Intent], lease_s: float
    ) -> IntentResult:
        """PRELOADED -> DISPATCHED (token+1, attempt+1, attempt row) for every intent whose
        shard is still ours and whose row is still PRELOADED, in one transaction.

        With quotas, each tenant's intents are first cut to what its quotas admit, in the
        order given (the selector's: earliest due first); the others are written nothing
        and come back in ``unwritten``, with the answer of every tenant checked in full
        in ``quotas`` (a tenant dispatched under this node's allowance is not checked:
        ``store/quotas.py``).

        Only after this returns may the assignments be sent (intent before action).
        """
        answers: dict[uuid.UUID, Admission] = {}
        refused: set[uuid.UUID] = set()
        quotas = self._quotas

        async def read_quotas(conn: Connection) -> _Screen | None:
            if quotas is None:
                return None
            pending = await quotas.read(conn, _per_tenant(intents))

            async def within_quotas(mine: list[Intent]) -> list[Intent]:
                decided = await pending.admit(_per_tenant(mine))
                answers.update(decided.checked)
                left = dict(decided.admitted)
                admitted = []
                for intent in mine:
                    tenant = intent.task.tenant_id
                    if left.get(tenant, 0) > 0:
                        left[tenant] -= 1
                        admitted.append(intent)
                    else:
                        refused.add(intent.task.id)
                return admitted

            return within_quotas

        rows, lost, places = await self._on_owned_intents(
            "write_intents",
            epochs,
            intents,
            lambda mine: {"worker_ids": [i.worker_id for i in mine], "lease_s": lease_s},
            screen=read_quotas,
        )
        return IntentResult(
            [task_from_row(r) for r in rows],
            lost,
            frozenset(refused),
            places=places,
            quotas=answers,
        )

    async def _on_owned_intents(
        self,
        query: str,
        epochs: Mapping[int, int],
        intents: Sequence[Intent],
        params: Callable[[list[Intent]], dict[str, Any]] = lambda mine: {},
        screen: Callable[[Connection], Awaitable[_Screen | None]] | None = None,
    ) -> tuple[list[dict[str, Any]], frozenset[int], dict[uuid.UUID, Place]]:
        """Run ``query`` for the intents of shards whose epoch is still ours, in one
        transaction under their fence (``screen`` may cut them further first, in the
        same transaction); its rows (``tasks`` rows), the shards found lost, and the
        places of the workflow tasks among the rows (read in the same transaction: a read
        failing after the intents committed would lose the assignments).

        Pipelined (:meth:`Store.pipelined_transaction`): the fence and what ``screen``
        reads go in one round trip; the statement, the places of all its tasks (a task
        outside any workflow has none: one key probe, cheaper than a round trip to ask
        only for those it returns) and the COMMIT in a second. One round trip each made
        seven of a dispatch round with quotas."""
        shards = {i.task.shard: epochs[i.task.shard] for i in intents if i.task.shard in epochs}
        async with self._store.pipelined_transaction() as conn:
            fence = await self._store.fence(conn, shards)
            cut = None if screen is None else await screen(conn)
            owned = await fence.owned()
            lost = frozenset(shards.keys() - owned)
            mine = [i for i in intents if i.task.shard in owned]
            if mine and cut is not None:
                mine = await cut(mine)
            if not mine:
                return [], lost, {}
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q[query],
                {
                    **batch_keys([i.task.scheduled_at for i in mine], [i.task.id for i in mine]),
                    "shards": sorted(owned),
                    **params(mine),
                },
            )
            in_runs = await places(conn, [i.task.id for i in mine])
            await self._store.queue_commit(conn)
            rows = await cur.fetchall()
            found = await in_runs.read()
        written = {row["id"] for row in rows}
        return rows, lost, {task_id: p for task_id, p in found.items() if task_id in written}

    async def read_back_intents(
        self, epochs: Mapping[int, int], intents: Sequence[Intent]
    ) -> IntentResult:
        """What became of ``intents`` whose :meth:`write_intents` commit outcome was
        unknown (:func:`intent_committed` for each), read under the shards' fence."""
        await self._store.end_lost_transactions()
        found, lost, found_places = await self._on_owned_intents("intent_outcomes", epochs, intents)
        rows = {r["id"]: r for r in found}
        dispatched: list[Task] = []
        unwritten: set[uuid.UUID] = set()
        for intent in intents:
            row = rows.get(intent.task.id)
            if row is None:
                continue  # a shard no longer ours: its new owner sees to the task
            committed = intent_committed(row, intent.worker_id, epochs[row["shard"]])
            if committed:
                dispatched.append(task_from_row(row))
            elif committed is False:
                unwritten.add(intent.task.id)
        return IntentResult(dispatched, lost, frozenset(unwritten), places=found_places)

    # ---- worker settlements (token-fenced, any node) ----------------------------------

    @_retry_rollbacks
    async def ack(self, acks: Sequence[Settle]) -> dict[uuid.UUID, SettleOutcome]:
        if not acks:
            return {}
        async with self._store.pipelined_transaction() as conn:
            cur = await conn.execute(self._q["ack"], _refs(acks))
            moved = {row[0] for row in await cur.fetchall()}
            return await self._classify(conn, acks, moved, "ack")

    @_retry_rollbacks
    async def extend_leases(
        self, beats: Sequence[Beat], lease_s: float, margin_s: float = DEFAULT_LEASE_MARGIN_S
    ) -> LeaseUpdate:
        """Extend the leases the beats hold to now + ``lease_s``; a lease that ran out more
        than ``margin_s`` ago is not extended (the beat is refused)."""
        if not beats:
            return LeaseUpdate(frozenset(), {})
        async with self._store.connection() as conn:
            cur = await conn.execute(
                self._q["extend_leases"],
                {
                    **_refs(beats),
                    "checkpoints": [b.checkpoint for b in beats],
                    "lease_s": lease_s,
                    "margin_s": margin_s,
                },
            )
            # Only the exceptions come back (sql/runs.sql): beats not extended, and
            # extended ones whose cancel was requested.
            rows = await cur.fetchall()
            refused = {(task_id, token) for task_id, token, extended, _, _ in rows if not extended}
            await self._mark_fenced(conn, [b for b in beats if (b.ref.id, b.token) in refused])
        return LeaseUpdate(
            frozenset(b.ref.id for b in beats if (b.ref.id, b.token) not in refused),
            {task_id: reason or "" for task_id, _, _, cancel, reason in rows if cancel},
        )

    @_retry_rollbacks
    async def complete(self, completions: Sequence[Completion]) -> SettleResult:
        if not completions:
            return SettleResult({}, [])
        async with self._store.pipelined_transaction() as conn:
            cur = await conn.execute(
                self._q["complete"],
                {**_refs(completions), "results": [c.result_json for c in completions]},
            )
            # Tuples, not dict rows: this is the hottest settlement, and only the rare
            # workflow task among its rows needs more than its id.
            rows = await cur.fetchall()
            finished = [
                Finished(task_id, run_id, at, TaskStatus.COMPLETED)
                for task_id, _, at, run_id in rows
                if run_id is not None
            ]
            released = await settle(conn, finished)
            outcomes = await self._classify(conn, completions, {r[0] for r in rows}, "complete")
        return SettleResult(outcomes, [(t.shard, t.due_at) for t in released])

    @_retry_rollbacks
    async def fail(self, failures: Sequence[Failure], now: datetime) -> SettleResult:
        if not failures:
            return SettleResult({}, [])
        by_id = {f.ref.id: f for f in failures}
        async with self._store.pipelined_transaction() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["lock_for_failure"], _refs(failures))
            rows = await cur.fetchall()
            decided = []
            for row in rows:
                failure = by_id[row["id"]]
                budget = RetryBudget(
                    task_id=row["id"],
                    retry_count=row["retry_count"],
                    max_retries=row["max_retries"],
                    backoff_initial_s=row["backoff_initial_s"],
                    backoff_max_s=row["backoff_max_s"],
                    backoff_multiplier=row["backoff_multiplier"],
                    cancel_requested=row["cancel_requested"],
                )
                decided.append((failure, decide(budget, failure.report, now)))
            due: list[tuple[int, datetime]] = []
            moved: set[uuid.UUID] = set()
            if decided:
                applied = conn.cursor(row_factory=dict_row)
                await applied.execute(
                    self._q["apply_failures"],
                    {
                        **_refs(f for f, _ in decided),
                        "statuses": [str(d.status) for _, d in decided],
                        "due_ats": [d.due_at for _, d in decided],
                        "errors": [f.error for f, _ in decided],
                        "attempt_states": [str(d.attempt_state) for _, d in decided],
                        "retry_counts": [d.retry_count for _, d in decided],
                    },
                )
                moved_rows = await applied.fetchall()
                for row in moved_rows:
                    moved.add(row["id"])
                    if row["status"] == TaskStatus.RETRYING:
                        due.append((row["shard"], row["due_at"]))
                released = await settle(conn, finished_rows(moved_rows))
                due.extend((t.shard, t.due_at) for t in released)
            outcomes = await self._classify(conn, failures, moved, "fail")
        return SettleResult(outcomes, due)

    @_retry_rollbacks
    async def release(
        self, releases: Sequence[Release]
    ) -> tuple[dict[uuid.UUID, SettleOutcome], list[TimerTask]]:
        """Give tasks back (PRELOADED again); the outcomes and the tasks now ready again."""
        if not releases:
            return {}, []
        async with self._store.pipelined_transaction() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["release"],
                {
                    **_refs(releases),
                    "checkpoints": [r.checkpoint for r in releases],
                    "attempt_states": [str(r.attempt_state) for r in releases],
                    "details": [r.detail for r in releases],
                },
            )
            ready = [timer_from_row(r) for r in await cur.fetchall()]
            outcomes = await self._classify(conn, releases, {t.id for t in ready}, "release")
        return outcomes, ready

    async def _classify(
        self, conn: Connection, items: Sequence[Settle], moved: set[uuid.UUID], kind: str
    ) -> dict[uuid.UUID, SettleOutcome]:
        outcomes = {i.ref.id: SettleOutcome.OK for i in items if i.ref.id in moved}
        unmoved = [i for i in items if i.ref.id not in moved]
        if not unmoved:
            return outcomes
        cur = await conn.execute(
            self._q["settlement_state"],
            batch_keys([i.ref.scheduled_at for i in unmoved], [i.ref.id for i in unmoved]),
        )
        found = {row[0]: (row[1], TaskStatus(row[2])) for row in await cur.fetchall()}
        for item in unmoved:
            current = found.get(item.ref.id)
            if current is None:
                outcomes[item.ref.id] = SettleOutcome.TASK_NOT_FOUND
                continue
            token, status = current
            if token == item.token and status in _ALREADY[kind]:
                outcomes[item.ref.id] = SettleOutcome.OK
            elif token == item.token and status is TaskStatus.CANCELLED:
                outcomes[item.ref.id] = SettleOutcome.TASK_CANCELLED
            else:
                outcomes[item.ref.id] = SettleOutcome.STALE_FENCING_TOKEN
        await self._mark_fenced(
            conn, [i for i in unmoved if outcomes[i.ref.id] is SettleOutcome.STALE_FENCING_TOKEN]
        )
        return outcomes

    async def _mark_fenced(self, conn: Connection, refused: Sequence[Settle]) -> None:
        """A worker spoke for an attempt the scheduler had given up (ABANDONED): it ran
        after all, and was refused. Its attempt row says so (FENCED)."""
        if refused:
            await conn.execute(
                self._q["mark_fenced"],
                {"ids": [i.ref.id for i in refused], "tokens": [i.token for i in refused]},
            )

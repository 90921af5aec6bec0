"""The store: every statement the scheduler sends PostgreSQL, issued by one class.

:class:`Store` owns an ``AsyncConnectionPool`` (with ``check=``, so a server restart
fails no request, docs/architecture.md#d12) and runs the named statements of ``sql/database.sql``.
It holds no policy: callers pass fully decided rows
(:class:`~chronoshard.scheduler.core.models.NewTask`) and the state machine (``states``) says which
moves a write may make. What it does own:

* **All or nothing.** ``insert_tasks`` validates every task before the first write and
  writes a batch in one transaction.
* **Idempotent submits.** A key is claimed in ``idempotency_keys`` (``ON CONFLICT DO
  NOTHING``) in the same transaction as its task, so of two concurrent submits of one key
  exactly one commits a task; the other waits for it, then answers with that task (same
  request fingerprint) or :class:`~.errors.IdempotencyConflict` (different request).
* **The shard fence, once.** Every write for a shard (preload, intent, unload, repairs)
  runs in a transaction that first calls :meth:`Store.owned_shards`, which reads the
  shards' ``shard_owners`` rows ``FOR SHARE`` and keeps only those whose epoch is the
  caller's. A new owner's claim updates that row, so it waits for the old owner's
  in-flight writes and every later write sees the new epoch.
* **One error boundary.** psycopg's ``OperationalError`` (lost connection, pool timeout,
  serialization failure, deadlock, lock timeout) becomes
  :class:`~.errors.StoreUnavailable` (retryable), chained ``from exc``. A connection lost
  while a transaction was committing becomes :class:`~.errors.CommitOutcomeUnknown`: the
  transaction may have committed (docs/architecture.md#d12). A pooled connection is waited for at
  most ``acquire_timeout_s``, so while PostgreSQL is down callers hear so within that
  bound instead of waiting for it to come back.
* **Unknown submit outcomes are read back.** A submit batch whose commit outcome is
  unknown is settled by reading its rows back once PostgreSQL answers again: found, the
  batch committed and each caller gets its task; not found, nothing was written and the
  caller may retry. It is never written again blindly (an unkeyed submit would then exist
  twice). A read-back is only sound once the lost transaction can no longer commit: its
  COMMIT may still be on its way to a server backend that lives on (a broken network
  rather than a restart). So every read-back first ends the backend that ran it
  (:meth:`Store.end_lost_transactions`: ``pg_terminate_backend``, then wait until it is
  gone), known by its pid and start time, recorded when the connection was made.

Timestamps are sent and returned timezone-aware; sessions run with ``TimeZone=UTC`` so
returned datetimes are in UTC whatever the server's default. JSON comes back with exact
numbers (``chronoshard.exact_json``): a Decimal where a float could not hold the number.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self, TypeVar
from weakref import WeakKeyDictionary

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool

from chronoshard import exact_json
from chronoshard.clock import Clock, ClockReading
from chronoshard.scheduler.core import states
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import (
    DEFAULT_PAYLOAD_LIMIT_BYTES,
    NewTask,
    PreparedTask,
    Priority,
    SubmitResult,
    Task,
    TaskAttempt,
    TaskRef,
    prepare,
)
from chronoshard.scheduler.core.states import AttemptState, Resolution, TaskStatus
from chronoshard.scheduler.errors import (
    CommitOutcomeUnknown,
    IdempotencyConflict,
    InvalidArgument,
    SchedulerError,
    StoreUnavailable,
    TaskNotFound,
    TenantNotFound,
)
from chronoshard.scheduler.store import queries, submits

DEFAULT_POOL_MIN_SIZE = 1
DEFAULT_POOL_MAX_SIZE = 10
DEFAULT_OPEN_TIMEOUT_S = 30.0
DEFAULT_ACQUIRE_TIMEOUT_S = 5.0
READ_BACK_TIMEOUT_S = 10.0
"""How long a submit whose commit outcome is unknown tries to read its rows back."""
READ_BACK_RETRY_S = 0.25
RECONNECT_GIVE_UP_S = 1.0
"""How long the pool retries one lost connection before giving it up (after open()).

psycopg_pool retries a lost connection with a backoff doubling from 1 s (1, 2, 4, 8 s
...), so after an 8 s outage the pool came back up to 7 s after PostgreSQL did: that was
most of the time to resume after a restart. Giving a connection up after 1 s lets the
next statement that waits for one start a fresh attempt at once (the pool grows on
demand), so reconnect tries are at most about a second apart while the node needs
connections, whatever the outage's length."""

Connection = psycopg.AsyncConnection[Any]
_R = TypeVar("_R")
_T = TypeVar("_T")

_TASK_FIELDS = frozenset(Task.__dataclass_fields__)
_TERMINAL = sorted(str(s) for s in states.TERMINAL)


def task_from_row(row: Mapping[str, Any]) -> Task:
    """A ``tasks`` row (``SELECT *``) as a Task; columns a later migration adds are ignored
    until Task grows a field for them."""
    fields = {name: row[name] for name in _TASK_FIELDS}
    fields["status"] = TaskStatus(row["status"])
    fields["priority"] = Priority(row["priority"])
    fields["jitter_mode"] = JitterMode(row["jitter_mode"])
    return Task(**fields)


def _attempt(row: Mapping[str, Any]) -> TaskAttempt:
    resolution = row["resolution"]
    return TaskAttempt(
        **{
            **row,
            "state": AttemptState(row["state"]),
            "resolution": None if resolution is None else Resolution(resolution),
        }
    )


def _require_aware(field: str, value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, "must be timezone-aware")


@dataclass(frozen=True)
class SessionLimits:
    """Per-connection safety limits (docs/architecture.md#d12).

    ``idle_in_transaction_s`` matters for failover: a scheduler frozen (SIGSTOP, a long
    GC or VM pause) inside a transaction holds its ``shard_owners`` row lock, and the new
    owner's epoch claim waits for it. PostgreSQL ends such a session after this long, so
    a frozen owner delays a takeover by at most this much.
    """

    statement_timeout_s: float = 30.0
    idle_in_transaction_s: float = 5.0


@dataclass(frozen=True)
class Backend:
    """The server process behind a connection: a pid alone may be reused after a restart."""

    pid: int
    started_at: datetime


def _configurer(
    limits: SessionLimits, backends: WeakKeyDictionary[Connection, Backend]
) -> Callable[[Connection], Awaitable[None]]:
    async def configure(conn: Connection) -> None:
        # jsonb keeps numbers exact; so must reading it (json.loads makes floats of them).
        set_json_loads(exact_json.loads, conn)
        # Returned timestamptz values take the session's zone; pin it so every datetime
        # the store hands out is UTC regardless of the server's or the DSN's default.
        await conn.execute("SET TIME ZONE 'UTC'")
        cur = await conn.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false),"
            " pg_backend_pid(),"
            " (SELECT backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid())",
            (
                f"{int(limits.statement_timeout_s * 1000)}ms",
                f"{int(limits.idle_in_transaction_s * 1000)}ms",
            ),
        )
        row = await cur.fetchone()
        if row is not None and row[3] is not None:
            backends[conn] = Backend(row[2], row[3])

    return configure


class Store:
    """The scheduler's PostgreSQL access. Create with :meth:`open`; ``close`` when done."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Connection],
        *,
        payload_limit_bytes: int = DEFAULT_PAYLOAD_LIMIT_BYTES,
    ) -> None:
        self._pool = pool
        # Filled by the pool's configure callback (see open()).
        self._backends: WeakKeyDictionary[Connection, Backend] = WeakKeyDictionary()
        # Backends whose transaction's commit outcome became unknown, not yet ended.
        self._lost: set[Backend] = set()
        self._q = queries.load("database.sql")
        self.payload_limit_bytes = payload_limit_bytes

    @classmethod
    async def open(
        cls,
        dsn: str,
        min_size: int = DEFAULT_POOL_MIN_SIZE,
        max_size: int = DEFAULT_POOL_MAX_SIZE,
        *,
        payload_limit_bytes: int = DEFAULT_PAYLOAD_LIMIT_BYTES,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
        acquire_timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S,
        session_limits: SessionLimits | None = None,
    ) -> Self:
        """A store with an open pool of ``min_size``..``max_size`` connections; a statement
        waits at most ``acquire_timeout_s`` for one.

        Raises:
            StoreUnavailable: ``min_size`` connections could not be made in
                ``open_timeout_s``.
        """
        backends: WeakKeyDictionary[Connection, Backend] = WeakKeyDictionary()
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            open=False,
            timeout=acquire_timeout_s,
            check=AsyncConnectionPool.check_connection,
            configure=_configurer(session_limits or SessionLimits(), backends),
            kwargs={"autocommit": True},
            name="chronoshard-store",
        )
        try:
            await pool.open(wait=True, timeout=open_timeout_s)
        except psycopg.OperationalError as exc:
            await pool.close()
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
        # Only now: the first connections may wait for PostgreSQL up to open_timeout_s.
        pool.reconnect_timeout = RECONNECT_GIVE_UP_S
        store = cls(pool, payload_limit_bytes=payload_limit_bytes)
        store._backends = backends
        return store

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- connections and transactions -------------------------------------------------

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled (autocommit) connection; driver failures inside the block become
        StoreUnavailable. For statements that need no shard fence."""
        try:
            async with self._pool.connection() as conn:
                yield conn
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(str(exc)) from exc

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A transaction on a pooled connection, committed when the block exits cleanly.

        Raises:
            CommitOutcomeUnknown: the connection failed during the COMMIT itself (the
                block had run): the transaction may or may not have committed.
            StoreUnavailable: it failed earlier: nothing of the block was committed.
        """
        async with self.connection() as conn:
            committing = False
            try:
                async with conn.transaction():
                    yield conn
                    committing = True
            except psycopg.OperationalError as exc:
                if committing:
                    backend = self._backends.get(conn)
                    if backend is not None:
                        self._lost.add(backend)
                    raise CommitOutcomeUnknown(f"while committing: {exc}") from exc
                raise

    async def end_lost_transactions(self) -> None:
        """Make sure no transaction whose commit outcome became unknown can still commit:
        end its backend if it lives on, and wait until it is gone. Every read-back of an
        unknown outcome calls this first (module docstring).

        Raises:
            StoreUnavailable: PostgreSQL cannot be asked (yet), or a backend outlived
                READ_BACK_TIMEOUT_S after it was told to end; call again.
        """
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while self._lost:
            lost = list(self._lost)
            async with self.connection() as conn:
                cur = await conn.execute(
                    "SELECT pid, backend_start, pg_terminate_backend(pid)"
                    " FROM pg_stat_activity"
                    " WHERE (pid, backend_start) IN (SELECT * FROM unnest(%s::int[],"
                    " %s::timestamptz[]))",
                    ([b.pid for b in lost], [b.started_at for b in lost]),
                )
                alive = {Backend(pid, started) for pid, started, _ in await cur.fetchall()}
            self._lost -= set(lost) - alive
            if alive:
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(f"backends {sorted(b.pid for b in alive)} live on")
                await asyncio.sleep(READ_BACK_RETRY_S / 5)

    async def owned_shards(self, conn: Connection, epochs: Mapping[int, int]) -> set[int]:
        """The shard fence: lock the owner rows of ``epochs``' shards ``FOR SHARE`` in
        ``conn``'s transaction and return the shards whose recorded epoch is still the
        caller's. Every write for a shard runs in a transaction that calls this first and
        writes only for the shards it returned: a newer owner's claim updates the row, so
        it waits for the writes in flight, and every later write sees the new epoch."""
        if not epochs:
            return set()
        cur = await conn.execute(self._q["lock_shard_epochs"], {"shards": sorted(epochs)})
        current = dict(await cur.fetchall())
        return {shard for shard, epoch in epochs.items() if current.get(shard) == epoch}

    # --- submit -----------------------------------------------------------------------

    async def insert_tasks(
        self, tenant_id: uuid.UUID, tasks: Sequence[NewTask]
    ) -> list[SubmitResult]:
        """Insert ``tasks`` for ``tenant_id`` in one transaction; one result per task, in
        order.

        A task whose idempotency key was used before by the same request is not inserted:
        its result is the original task with ``created=False``.

        Raises:
            InvalidArgument: a task is invalid (``field`` names what); or two tasks share
                an id.
            PayloadTooLarge: a payload is over ``payload_limit_bytes``.
            TenantNotFound: ``tenant_id`` does not exist.
            IdempotencyConflict: a key was used before with a different request.
            StoreUnavailable: PostgreSQL failed; the batch may be retried as a whole.
        Nothing is written when any of these is raised.
        """
        prepared = [prepare(t, payload_limit_bytes=self.payload_limit_bytes) for t in tasks]
        return await self.insert_prepared(tenant_id, prepared)

    async def insert_prepared(
        self, tenant_id: uuid.UUID, prepared: Sequence[PreparedTask]
    ) -> list[SubmitResult]:
        """:meth:`insert_tasks` for tasks the caller already ran through
        :func:`~chronoshard.scheduler.core.models.prepare`, so it may choose the request
        fingerprint: the API fingerprints the request as sent (a relative ``delay`` rather than the
        instant it resolved to), which ``prepare`` cannot know.

        Raises what :meth:`insert_tasks` raises, except the validation errors of
        ``prepare``; nothing is written when it raises. Of several failing tasks, the
        first in ``prepared`` order is reported.
        """
        if len({p.new.id for p in prepared}) != len(prepared):
            raise InvalidArgument("id", "two tasks in one batch share an id")
        if not prepared:
            return []
        requests = [(tenant_id, p) for p in prepared]
        try:
            async with self.transaction() as conn:
                outcomes = await self._write_submits(conn, requests, all_or_nothing=True)
        except CommitOutcomeUnknown as exc:
            outcomes = await self._read_back_submits(requests, exc, all_or_nothing=True)
        return [o for o in outcomes if isinstance(o, SubmitResult)]

    async def insert_each(
        self, requests: Sequence[submits.Request]
    ) -> list[SubmitResult | SchedulerError]:
        """Write submits of any tenants in one transaction, each with its own outcome.

        What group commit writes (``api.tasks.submit_committer``): a request that
        would fail alone (an unknown tenant, a key reused with a different request, an
        id already in the batch) gets its error in its place, and the others are written.

        Raises:
            StoreUnavailable: PostgreSQL failed; nothing was written.
        """
        if not requests:
            return []
        try:
            async with self.transaction() as conn:
                return await self._write_submits(conn, requests, all_or_nothing=False)
        except CommitOutcomeUnknown as exc:
            return await self._read_back_submits(requests, exc, all_or_nothing=False)

    async def _read_back_submits(
        self,
        requests: Sequence[submits.Request],
        unknown: CommitOutcomeUnknown,
        *,
        all_or_nothing: bool,
    ) -> list[SubmitResult | SchedulerError]:
        """Settle a submit batch whose commit outcome is unknown by reading it back.

        The batch was one transaction, so either every task it inserted exists or none
        does. None found: nothing was written (or the batch inserted nothing: repeats and
        conflicts only), so StoreUnavailable tells the callers to retry. Found: the batch
        committed; each request whose own row exists gets it, and the others (repeats of
        a key, conflicts, a request that failed on its own) are answered by writing them
        again, which for them inserts nothing.

        Raises:
            CommitOutcomeUnknown: PostgreSQL did not answer within READ_BACK_TIMEOUT_S.
        """
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while True:
            try:
                await self.end_lost_transactions()
                found = await self._find_submitted(requests)
                break
            except StoreUnavailable:
                if time.monotonic() >= deadline:
                    raise unknown from None
                await asyncio.sleep(READ_BACK_RETRY_S)
        if not found:
            raise StoreUnavailable(f"nothing was committed ({unknown}); retry") from unknown
        rest = [r for r in requests if r[1].new.id not in found]
        answers: list[SubmitResult | SchedulerError] = []
        if rest:
            async with self.transaction() as conn:
                answers = await self._write_submits(conn, rest, all_or_nothing=all_or_nothing)
        again = iter(answers)
        return [
            SubmitResult(found[p.new.id], created=True) if p.new.id in found else next(again)
            for _, p in requests
        ]

    async def _find_submitted(self, requests: Sequence[submits.Request]) -> dict[uuid.UUID, Task]:
        """The tasks of ``requests`` that exist, by id (their own ids: not key repeats)."""
        async with self.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["get_tasks_by_ref"],
                {
                    "tenant_ids": list({t for t, _ in requests}),
                    "scheduled_ats": [p.new.scheduled_at for _, p in requests],
                    "ids": [p.new.id for _, p in requests],
                },
            )
            return {task.id: task for task in map(task_from_row, await cur.fetchall())}

    async def _write_submits(
        self, conn: Connection, requests: Sequence[submits.Request], *, all_or_nothing: bool
    ) -> list[SubmitResult | SchedulerError]:
        """The batch, in the caller's transaction: tenants checked, keys claimed and
        resolved, new tasks inserted in one statement, repeats read back. With
        ``all_or_nothing``, the first request's error is raised before anything is
        inserted (the caller's transaction then rolls the key claims back)."""
        outcomes: list[SubmitResult | SchedulerError | None] = [None] * len(requests)
        cur = await conn.execute(
            self._q["tenants_exist"], {"tenant_ids": list({t for t, _ in requests})}
        )
        tenants = {row[0] for row in await cur.fetchall()}
        seen: set[uuid.UUID] = set()
        for i, (tenant_id, p) in enumerate(requests):
            if tenant_id not in tenants:
                outcomes[i] = TenantNotFound(tenant_id)
            elif p.new.id in seen:
                outcomes[i] = InvalidArgument("id", "two tasks in one batch share an id")
            seen.add(p.new.id)
        if all_or_nothing:
            _raise_first(outcomes)
        valid = [(i, r) for i, r in enumerate(requests) if outcomes[i] is None]
        owners = await self._claim_keys(conn, [r for _, r in valid])
        resolutions = submits.resolve_keys([r for _, r in valid], owners)
        for (i, _), resolution in zip(valid, resolutions, strict=True):
            if isinstance(resolution, IdempotencyConflict):
                outcomes[i] = resolution
        if all_or_nothing:
            _raise_first(outcomes)
        new = [(i, r) for (i, r), res in zip(valid, resolutions, strict=True) if res is None]
        inserted = await self._insert_new(conn, [r for _, r in new])
        for i, (_, p) in new:
            outcomes[i] = SubmitResult(inserted[p.new.id], created=True)
        repeats = [
            (i, (r[0], res))
            for (i, r), res in zip(valid, resolutions, strict=True)
            if isinstance(res, TaskRef)
        ]
        originals = await self._fetch_originals(conn, [ref for _, ref in repeats])
        for i, (_, ref) in repeats:
            outcomes[i] = SubmitResult(originals[ref.id], created=False)
        return [o for o in outcomes if o is not None]

    async def _claim_keys(
        self, conn: Connection, requests: Sequence[submits.Request]
    ) -> dict[tuple[uuid.UUID, str], submits.KeyOwner]:
        """Claim the batch's idempotency keys; who owns each key afterwards."""
        keyed = submits.keyed_in_claim_order(requests)
        if not keyed:
            return {}
        await conn.execute(
            self._q["claim_idempotency_keys"],
            {
                "tenant_ids": [t for t, _ in keyed],
                "keys": [p.new.idempotency_key for _, p in keyed],
                "task_ids": [p.new.id for _, p in keyed],
                "scheduled_ats": [p.new.scheduled_at for _, p in keyed],
                "fingerprints": [p.fingerprint for _, p in keyed],
            },
        )
        wanted = sorted({(t, str(p.new.idempotency_key)) for t, p in keyed}, key=str)
        cur = await conn.execute(
            self._q["get_idempotency_keys"],
            {"tenant_ids": [t for t, _ in wanted], "keys": [k for _, k in wanted]},
        )
        return {
            (tenant_id, key): submits.KeyOwner(task_id, at, fingerprint)
            for tenant_id, key, task_id, at, fingerprint in await cur.fetchall()
        }

    async def _insert_new(
        self, conn: Connection, requests: Sequence[submits.Request]
    ) -> dict[uuid.UUID, Task]:
        if not requests:
            return {}
        cur = conn.cursor(row_factory=dict_row)
        # One statement for the batch (arrays unnested into rows): no per-row parse,
        # bind or round trip.
        await cur.execute(self._q["insert_tasks"], submits.insert_columns(requests))
        return {task.id: task for task in map(task_from_row, await cur.fetchall())}

    async def _fetch_originals(
        self, conn: Connection, refs: Sequence[tuple[uuid.UUID, TaskRef]]
    ) -> dict[uuid.UUID, Task]:
        """The original tasks of repeated requests, as ``(tenant, ref)`` pairs."""
        if not refs:
            return {}
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            self._q["get_tasks_by_ref"],
            {
                "tenant_ids": list({t for t, _ in refs}),
                "scheduled_ats": [r.scheduled_at for _, r in refs],
                "ids": [r.id for _, r in refs],
            },
        )
        found = {task.id: task for task in map(task_from_row, await cur.fetchall())}
        for _, ref in refs:
            if ref.id not in found:
                # Retention deletes a task's key with its partition, so a key always has
                # its task; reaching this means the two were separated by hand.
                raise TaskNotFound(ref.id)
        return found

    # --- reads ------------------------------------------------------------------------

    async def get_task(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Task | None:
        """The task, or None if it does not exist *or belongs to another tenant*."""
        async with self.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["get_task"], {"id": task_id, "tenant_id": tenant_id})
            row = await cur.fetchone()
        return None if row is None else task_from_row(row)

    async def get_attempts(self, task_id: uuid.UUID) -> list[TaskAttempt]:
        """The task's attempts, oldest first (empty before its first dispatch)."""
        async with self.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["get_attempts"], {"task_id": task_id})
            return [_attempt(row) for row in await cur.fetchall()]

    # --- the database's clock ----------------------------------------------------------

    async def read_clock(self, count: int, clock: Clock) -> list[ClockReading]:
        """``count`` readings of PostgreSQL's clock, back to back on one connection, each
        timed by ``clock`` around its own round trip (the pool's wait is not in it).

        Raises:
            StoreUnavailable: the database could not be reached.
        """
        readings = []
        async with self.connection() as conn:
            for _ in range(count):
                sent = clock.monotonic()
                cur = await conn.execute(self._q["database_clock"])
                row = await cur.fetchone()
                received = clock.monotonic()
                assert row is not None
                readings.append(ClockReading(sent, received, row[0], clock.now()))
        return readings

    # --- shards -----------------------------------------------------------------------

    async def claim_shard_epoch(self, shard: int, epoch: int, node_id: str) -> bool:
        """Raise ``shard``'s epoch to ``epoch`` for ``node_id``; whether this claim holds.

        False when the recorded epoch is already higher (or equal, for another node):
        epochs only move forward. The same node repeating its claim gets True again.
        """
        async with self.connection() as conn:
            cur = await conn.execute(
                self._q["claim_shard_epoch"],
                {"shard": shard, "epoch": epoch, "node_id": node_id},
            )
            return await cur.fetchone() is not None


def _raise_first(outcomes: Sequence[SubmitResult | SchedulerError | None]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, SchedulerError):
            raise outcome


async def _all_results(cur: psycopg.AsyncCursor[_R], build: Callable[[_R], _T]) -> list[_T]:
    """Every row of every result set that ``executemany(..., returning=True)`` produced."""
    built: list[_T] = []
    while True:
        built.extend(build(row) for row in await cur.fetchall())
        if not cur.nextset():
            return built

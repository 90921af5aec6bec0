"""The store: the scheduler's PostgreSQL pool, its shard fence and error boundary.

:class:`Store` owns an ``AsyncConnectionPool`` (with ``check=``, so a server restart
fails no request, docs/architecture.md#d12: :func:`check_pooled`) and runs the named statements of
``sql/database.sql``: reads, shard epochs, the clock. It holds no policy: the state
machine (``states``) says which moves a write may make, and the stores over its pool
(``RunStore``, ``SubmitStore``, ``TenantStore``, ...) run their own statements through
:meth:`Store.connection` and :meth:`Store.transaction`. What it does own:

* **The shard fence, once.** Every write for a shard (preload, intent, unload, repairs)
  runs in a transaction that first calls :meth:`Store.owned_shards`, which reads the
  shards' ``shard_owners`` rows ``FOR SHARE`` and keeps only those whose epoch is the
  caller's. A new owner's claim updates that row, so it waits for the old owner's
  in-flight writes and every later write sees the new epoch.
* **One error boundary.** psycopg's ``OperationalError`` (lost connection, pool timeout,
  serialization failure, deadlock, lock timeout) becomes
  :class:`~.errors.StoreUnavailable` (retryable), chained ``from exc``. A connection lost
  while a transaction was committing (or while a self-committing statement ran,
  :meth:`Store.self_committing`) becomes :class:`~.errors.CommitOutcomeUnknown`: the
  transaction may have committed (docs/architecture.md#d12). A pooled connection is waited for at
  most ``acquire_timeout_s``, so while PostgreSQL is down callers hear so within that
  bound instead of waiting for it to come back.
* **Lost transactions are ended.** Before a transaction whose commit outcome is
  unknown may be read back (a submit batch, :mod:`.submits`), it must no longer be able to
  commit: its COMMIT may still be on its way to a server backend that lives on (a broken
  network rather than a restart). :meth:`Store.end_lost_transactions` ends that backend
  (``pg_terminate_backend``, then waits until it is gone), known by its pid and start
  time, recorded when the connection was made.

**The API's transactions run as their tenant** (:meth:`Store.tenant_transaction`,
docs/operations.md#row-level-security): role ``chronoshard_api`` and the setting
``chronoshard.tenant_id``, both ``SET LOCAL``, so PostgreSQL's row-level security
(migration 0014) admits only that tenant's rows, whatever a statement's own predicate
says. Everything else (the dispatch path, which works across tenants by shard, and the
API's group-committed submits) runs as the role the pool connected as, which owns the
tables and is not restricted.

**Every call is timed.** Each :meth:`Store.connection` block reports the wait for its
pooled connection and how long it held it to the :class:`DatabaseTimings` given at open
(the node's metrics), and remembers when a call last succeeded, so the node's health
knows the database is up without a probe of its own while work flows
(:meth:`Store.reachable`).

Timestamps are sent and returned timezone-aware; sessions run with ``TimeZone=UTC`` so
returned datetimes are in UTC whatever the server's default. JSON comes back with exact
numbers (``chronoshard.exact_json``): a Decimal where a float could not hold the number.
"""

from __future__ import annotations

import asyncio
import select
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, Self
from weakref import WeakKeyDictionary, WeakSet

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool

from chronoshard import exact_json
from chronoshard.clock import Clock, ClockReading
from chronoshard.scheduler.core import states
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import (
    Priority,
    Task,
    TaskAttempt,
)
from chronoshard.scheduler.core.states import AttemptState, Resolution, TaskStatus
from chronoshard.scheduler.errors import (
    CommitOutcomeUnknown,
    StoreUnavailable,
)
from chronoshard.scheduler.store import queries

API_ROLE = "chronoshard_api"
"""The role API transactions run as (migration 0014): row-level security applies to it."""
TENANT_SETTING = "chronoshard.tenant_id"
"""The setting that names the tenant the policies admit (``chronoshard_current_tenant()``)."""

DEFAULT_POOL_MIN_SIZE = 1
DEFAULT_POOL_MAX_SIZE = 10
DEFAULT_OPEN_TIMEOUT_S = 30.0
DEFAULT_ACQUIRE_TIMEOUT_S = 5.0
CONNECT_PROBE_TIMEOUT_S = 5
"""How long the one connection that asks why the pool could not open may take (libpq's
``connect_timeout``, whole seconds)."""
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

GENERIC_PLANS = b"SET LOCAL plan_cache_mode = force_generic_plan"
"""The dispatch path's transactions (:meth:`Store.pipelined_transaction`) run their
prepared statements with generic plans. Left to choose, PostgreSQL planned every execution
anew (a plan pruned to the batch's partitions always looks cheaper than the generic one,
whose pruning happens at run time): 60 % of the server's CPU in a stampede was planning
(issue 14, perf). tests/integration/test_hot_plans.py holds the generic plans to their
keys."""

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


# The server ended the session (SQLSTATE classes 08 and these of 57): whatever it had
# received may have committed before it went. (57014, a cancelled statement, is the
# server's own answer: that transaction rolled back.)
_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03", "57P04", "57P05"})


def answer_lost(exc: psycopg.Error, *, broken: bool = False) -> bool:
    """Whether ``exc``, raised on a connection that is ``broken`` or not, says the
    server's answer may never have come, rather than that the server refused: a broken
    connection, an error the client raised itself (no SQLSTATE: a failed send or flush)
    or the server ending the session. What a write whose statement (or COMMIT) went out
    then did is unknown; a refusal rolled it back.

    ``Connection.broken`` alone does not tell: libpq reports a failed write at once but
    marks the connection bad only when a read fails too, so a pipeline whose COMMIT went
    out in an earlier write, and whose next flush found the server gone (PostgreSQL
    stopped in immediate mode), raised "flush request failed" on a connection not yet
    broken: taken for "nothing committed", its intents were never sent and waited for
    the reconciler's ack timeout."""
    sqlstate = exc.sqlstate
    return broken or sqlstate is None or sqlstate.startswith("08") or sqlstate in _SESSION_ENDED


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


async def _connect_error(dsn: str) -> str | None:
    """Why a connection to ``dsn`` fails now (libpq's message); None if it does not."""
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, connect_timeout=CONNECT_PROBE_TIMEOUT_S)
    except psycopg.Error as exc:
        return str(exc).strip()
    await conn.close()
    return None


async def check_pooled(conn: Connection) -> None:
    """The pool's check of a connection it is about to hand out: raises if it is dead.

    A server that ends a connection (a restart, ``pg_terminate_backend``) sends a FATAL
    error and closes it, so an idle connection with anything to read has been ended or
    told something; only then does the check pay for a round trip (psycopg_pool's own
    check, an empty query). Asking every time cost one round trip per statement batch:
    9 % of the node's CPU in a stampede, and latency on every submit (issue 14). A
    connection cut without a word (a network gone silent) passes either check: its
    first statement fails instead, as it would have after a passed round trip."""
    if conn.closed or _has_input(conn):
        await AsyncConnectionPool.check_connection(conn)


def _has_input(conn: Connection) -> bool:
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:
        return True  # no socket to look at: let the full check tell
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


class Fence:
    """The shard fence taken (:meth:`Store.fence`), its answer read by :meth:`owned`."""

    def __init__(self, epochs: Mapping[int, int], locked: psycopg.AsyncCursor[Any] | None) -> None:
        self._epochs = epochs
        self._locked = locked

    async def owned(self) -> set[int]:
        """The shards whose recorded epoch is still the caller's (their rows locked)."""
        if self._locked is None:
            return set()
        current = dict(await self._locked.fetchall())
        return {shard for shard, epoch in self._epochs.items() if current.get(shard) == epoch}


class DatabaseTimings(Protocol):
    """Where the store reports its calls' latencies (the node's metrics)."""

    def acquired(self, wait_s: float) -> None:
        """A pooled connection was handed out after ``wait_s``."""

    def released(self, kind: str, held_s: float) -> None:
        """A ``kind`` call (``connection``, ``transaction``, ``statement``) held its
        connection for ``held_s``, whether it succeeded or not."""


class Store:
    """The scheduler's PostgreSQL access. Create with :meth:`open`; ``close`` when done."""

    def __init__(
        self, pool: AsyncConnectionPool[Connection], timings: DatabaseTimings | None = None
    ) -> None:
        self._pool = pool
        self._timings = timings
        # time.monotonic() of the last call that ended cleanly; -inf: none yet.
        self.last_success_at = float("-inf")
        # time.monotonic() of the last call that failed for the database's reasons (no
        # connection in time, a refused or lost one: StoreUnavailable); -inf: none yet.
        # Writes other callers made then may have failed too (the reconciler's ack rule).
        self.last_failure_at = float("-inf")
        # Filled by the pool's configure callback (see open()).
        self._backends: WeakKeyDictionary[Connection, Backend] = WeakKeyDictionary()
        # Backends whose transaction's commit outcome became unknown, not yet ended.
        self._lost: set[Backend] = set()
        # Connections whose pipelined transaction has its COMMIT queued (queue_commit).
        self._commit_queued: WeakSet[Connection] = WeakSet()
        self._q = queries.load("database.sql")

    @classmethod
    async def open(
        cls,
        dsn: str,
        min_size: int = DEFAULT_POOL_MIN_SIZE,
        max_size: int = DEFAULT_POOL_MAX_SIZE,
        *,
        open_timeout_s: float = DEFAULT_OPEN_TIMEOUT_S,
        acquire_timeout_s: float = DEFAULT_ACQUIRE_TIMEOUT_S,
        session_limits: SessionLimits | None = None,
        timings: DatabaseTimings | None = None,
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
            check=check_pooled,
            configure=_configurer(session_limits or SessionLimits(), backends),
            kwargs={"autocommit": True},
            name="chronoshard-store",
        )
        try:
            await pool.open(wait=True, timeout=open_timeout_s)
        except psycopg.OperationalError as exc:
            await pool.close()
            # The pool says only that it timed out; why its connections failed (a refused
            # connection, sslmode=require against a server without SSL, a certificate that
            # does not verify) is what the operator needs, so ask once more directly.
            reason = await _connect_error(dsn) or str(exc)
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {reason}") from exc
        # Only now: the first connections may wait for PostgreSQL up to open_timeout_s.
        pool.reconnect_timeout = RECONNECT_GIVE_UP_S
        store = cls(pool, timings)
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
        async with self._timed("connection") as conn:
            yield conn

    @asynccontextmanager
    async def _timed(self, kind: str) -> AsyncIterator[Connection]:
        asked = time.monotonic()
        try:
            async with self._pool.connection() as conn:
                got = time.monotonic()
                timings = self._timings
                if timings is not None:
                    timings.acquired(got - asked)
                try:
                    yield conn
                finally:
                    done = time.monotonic()
                    if timings is not None:
                        timings.released(kind, done - got)
                # Only a block that ended cleanly proves the database answers.
                self.last_success_at = done
        except psycopg.OperationalError as exc:
            self.last_failure_at = time.monotonic()
            raise StoreUnavailable(str(exc)) from exc

    async def reachable(self, timeout_s: float, *, within_s: float) -> bool:
        """Whether PostgreSQL answers: a call succeeded in the last ``within_s``, or a
        ``SELECT 1`` does within ``timeout_s`` (the pool's own acquire timeout may be
        longer: a health check must answer in seconds)."""
        if time.monotonic() - self.last_success_at < within_s:
            return True
        try:
            async with asyncio.timeout(timeout_s), self.connection() as conn:
                await conn.execute("SELECT 1")
        except (StoreUnavailable, TimeoutError, psycopg.Error):
            return False
        return True

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A transaction on a pooled connection, committed when the block exits cleanly.

        Raises:
            CommitOutcomeUnknown: the connection failed during the COMMIT itself (the
                block had run): the transaction may or may not have committed.
            StoreUnavailable: it failed earlier: nothing of the block was committed.
        """
        async with self._timed("transaction") as conn:
            committing = False
            try:
                async with conn.transaction():
                    yield conn
                    committing = True
            except psycopg.OperationalError as exc:
                if committing:
                    raise self._outcome_lost(conn, f"while committing: {exc}") from exc
                raise

    @asynccontextmanager
    async def pipelined_transaction(self) -> AsyncIterator[Connection]:
        """A transaction whose statements do not wait for each other (psycopg's pipeline
        mode), committed when the block exits cleanly.

        ``execute`` sends a statement without waiting for its result; reading a result
        (``fetch*``) waits for it, so one round trip carries every statement executed
        since the last read. ``BEGIN`` goes with the first of them and ``COMMIT`` with
        the last, at the exit: a block that reads its results once costs two round
        trips, where :meth:`transaction` costs one per statement plus two. Under load a
        round trip, not the statement, is what a node waits for: the event loop is busy
        with other work when the answer comes (issue 14: the dispatch round spent ~0.8 ms
        per round trip, seven of them, at ~0.05 ms of statement time each). A statement
        still costs the node's CPU on its own, round trip or not: psycopg writes each to
        the socket as it is executed and turns the event loop twice for it, ~0.03 ms
        per statement on the 2-core machine of bench/README.md (2026-12-07, second
        sitting), so a hot block keeps its statements few. A statement's ``rowcount``
        is known only once its result was read; COPY cannot run in it.

        A block that has queued its last statement may queue the COMMIT itself
        (:meth:`queue_commit`) before it reads their results: the reads then share the
        COMMIT's round trip. Nothing may be queued after it.

        Raises:
            CommitOutcomeUnknown: the connection failed in the round trip that carried
                the COMMIT: the transaction may or may not have committed.
            StoreUnavailable: it failed earlier: nothing of the block was committed.
        """
        async with self._timed("transaction") as conn, conn.pipeline() as pipeline:
            try:
                await conn.execute(b"BEGIN", prepare=False)
                await conn.execute(GENERIC_PLANS, prepare=False)
                yield conn
                if conn not in self._commit_queued:
                    await self.queue_commit(conn)
                await pipeline.sync()
            except psycopg.OperationalError as exc:
                if conn in self._commit_queued and answer_lost(exc, broken=conn.broken):
                    raise self._outcome_lost(conn, f"while committing: {exc}") from exc
                raise
            finally:
                self._commit_queued.discard(conn)
            # A statement that failed (the server skipped the rest of the pipeline), or a
            # block that raised, left the transaction open or aborted: the pool's
            # connection block rolls it back as the connection goes back.

    async def queue_commit(self, conn: Connection) -> None:
        """Queue the COMMIT of ``conn``'s :meth:`pipelined_transaction` now, so that the
        results still to be read come back with it; a connection lost from here on
        leaves the outcome unknown."""
        self._commit_queued.add(conn)
        await conn.execute(b"COMMIT", prepare=False)

    @asynccontextmanager
    async def tenant_transaction(self, tenant_id: uuid.UUID) -> AsyncIterator[Connection]:
        """A transaction (:meth:`transaction`) that sees and writes only ``tenant_id``'s
        rows: its first statement enters :data:`API_ROLE` with the tenant set (both
        ``SET LOCAL``: they end with the transaction, so the pooled connection goes back
        as it came). The one way an API call enters its tenant: row-level security is
        defence in depth under the statements' own ``tenant_id`` predicates.

        Raises:
            CommitOutcomeUnknown, StoreUnavailable: as :meth:`transaction`.
        """
        async with self.transaction() as conn:
            await self._enter_tenant(conn, tenant_id)
            yield conn

    @asynccontextmanager
    async def tenant_pipelined_transaction(self, tenant_id: uuid.UUID) -> AsyncIterator[Connection]:
        """A :meth:`pipelined_transaction` that sees and writes only ``tenant_id``'s rows,
        entered as :meth:`tenant_transaction` enters its tenant (the statement goes with
        the block's first one, in the same round trip).

        Raises:
            CommitOutcomeUnknown, StoreUnavailable: as :meth:`pipelined_transaction`.
        """
        async with self.pipelined_transaction() as conn:
            await self._enter_tenant(conn, tenant_id)
            yield conn

    async def _enter_tenant(self, conn: Connection, tenant_id: uuid.UUID) -> None:
        await conn.execute(
            self._q["enter_tenant"],
            {"role": API_ROLE, "setting": TENANT_SETTING, "tenant_id": tenant_id},
        )

    @asynccontextmanager
    async def self_committing(self) -> AsyncIterator[Connection]:
        """A pooled (autocommit) connection for one write statement, which commits by
        itself: all of it or nothing, one round trip instead of BEGIN, the statement
        and COMMIT.

        Raises:
            CommitOutcomeUnknown: the connection broke while the statement ran: it may
                have committed (the same as a connection lost during COMMIT).
            StoreUnavailable: no connection, or the server refused the statement (the
                connection lives on): nothing was committed.
        """
        async with self._timed("statement") as conn:
            try:
                yield conn
            except psycopg.OperationalError as exc:
                if not answer_lost(exc, broken=conn.broken):
                    raise  # the server answered with an error: the statement rolled back
                raise self._outcome_lost(conn, f"while writing: {exc}") from exc

    def _outcome_lost(self, conn: Connection, what: str) -> CommitOutcomeUnknown:
        """A commit on ``conn`` whose outcome is unknown: its backend is remembered, so a
        read-back ends it first (:meth:`end_lost_transactions`)."""
        backend = self._backends.get(conn)
        if backend is not None:
            self._lost.add(backend)
        return CommitOutcomeUnknown(what)

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
        return await (await self.fence(conn, epochs)).owned()

    async def fence(self, conn: Connection, epochs: Mapping[int, int]) -> Fence:
        """:meth:`owned_shards` in two steps: the lock is taken (in a pipelined
        transaction, queued) now, the owned shards read by :meth:`Fence.owned`, so
        that statements queued in between share its round trip."""
        if not epochs:
            return Fence(epochs, None)
        cur = await conn.execute(self._q["lock_shard_epochs"], {"shards": sorted(epochs)})
        return Fence(epochs, cur)

    # --- reads ------------------------------------------------------------------------

    async def get_task(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Task | None:
        """The task, or None if it does not exist *or belongs to another tenant*, read as
        that tenant (:meth:`tenant_transaction`)."""
        task, _ = await self.get_task_attempts(tenant_id, task_id, attempts=False)
        return task

    async def get_task_attempts(
        self, tenant_id: uuid.UUID, task_id: uuid.UUID, *, attempts: bool = True
    ) -> tuple[Task | None, list[TaskAttempt]]:
        """The task (None: not found, or another tenant's) and, with ``attempts``, its
        attempts oldest first, in one transaction as ``tenant_id`` (GetTask)."""
        async with self.tenant_transaction(tenant_id) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["get_task"], {"id": task_id, "tenant_id": tenant_id})
            row = await cur.fetchone()
            if row is None:
                return None, []
            found: list[TaskAttempt] = []
            if attempts:
                await cur.execute(self._q["get_attempts"], {"task_id": task_id})
                found = [_attempt(r) for r in await cur.fetchall()]
        return task_from_row(row), found

    async def get_attempts(self, task_id: uuid.UUID) -> list[TaskAttempt]:
        """The task's attempts, oldest first (empty before its first dispatch), read as
        the node (any tenant's: not for the API, which reads them with its task through
        :meth:`get_task_attempts`)."""
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

    async def highest_shard_epoch(self) -> int:
        """The highest epoch any shard's owner ever recorded (0 for none)."""
        async with self.connection() as conn:
            cur = await conn.execute(self._q["highest_shard_epoch"])
            row = await cur.fetchone()
            return int(row[0]) if row is not None else 0

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

"""Partition maintenance's statements: day partitions of ``tasks`` created ahead, finished
ones past retention dropped, new partitions given statistics.

Two callers share the statements of ``sql/partitions.sql`` and the parameters built
here: the operator's ``chronoshard partitions ensure|detach`` (:func:`ensure_partitions`,
:func:`detach_old_partitions`: synchronous, one :mod:`.direct` connection, waiting up to
:data:`CLI_LOCK_TIMEOUT_S` for the table lock) and a node's maintenance loop
(:class:`PartitionStore`, over the :class:`~.database.Store`'s pool). The loop's policy,
when to run a round and how long a step may wait, is
:mod:`chronoshard.scheduler.cluster.maintenance`; the work itself is done by migration
0002's SQL functions, which keep any partition still holding an unfinished or
dead-lettered task.

Creating or detaching a partition needs the ``tasks`` table's ACCESS EXCLUSIVE lock for
a moment, and while that request waits every other statement on ``tasks`` queues behind
it. So each step is one transaction under the caller's ``lock_timeout``: a step not
granted the lock in time fails with :class:`~.errors.StoreUnavailable` and leaves
nothing half done.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import date
from typing import LiteralString

import psycopg
from psycopg import sql

from chronoshard.scheduler.config import DEFAULT_RETENTION_DAYS
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection, Store
from chronoshard.scheduler.store.direct import connect

DEFAULT_DAYS_AHEAD = 7
CLI_LOCK_TIMEOUT_S = 10.0
"""How long ``chronoshard partitions`` waits for the ``tasks`` lock: an operator's run
may wait; a node's round waits ``maintenance.lock_timeout_s`` and retries later."""

_SQL = "partitions.sql"


def _ensure_params(days_ahead: int, from_day: date | None) -> dict[str, object]:
    if days_ahead < 0:
        raise ValueError(f"days_ahead must be >= 0, got {days_ahead}")
    return {"from_day": from_day, "days_ahead": days_ahead}


def _detach_params(retention_days: int) -> dict[str, object]:
    if retention_days < 0:
        raise ValueError(f"retention_days must be >= 0, got {retention_days}")
    return {"retention_days": retention_days}


def _lock_timeout(seconds: float) -> dict[str, object]:
    return {"lock_timeout": f"{int(seconds * 1000)}ms"}


# --- by hand: `chronoshard partitions` --------------------------------------------------


def ensure_partitions(
    dsn: str, days_ahead: int = DEFAULT_DAYS_AHEAD, *, from_day: date | None = None
) -> list[str]:
    """Create the missing day partitions of ``tasks`` from ``from_day`` (default: today,
    UTC) through ``days_ahead`` days later; the names created.

    Rows already waiting in the DEFAULT partition for a new day are moved into it.

    Raises:
        StoreUnavailable: the server cannot be reached or a lock was not granted in time.
        ValueError: ``days_ahead`` is negative.
    """
    return _run_step(dsn, "ensure_partitions", _ensure_params(days_ahead, from_day))


def detach_old_partitions(dsn: str, retention_days: int = DEFAULT_RETENTION_DAYS) -> list[str]:
    """Detach and drop day partitions that ended more than ``retention_days`` ago, except
    those still holding an unfinished or dead-lettered task; the names dropped.

    Raises:
        StoreUnavailable: the server cannot be reached or a lock was not granted in time.
        ValueError: ``retention_days`` is negative.
    """
    return _run_step(dsn, "detach_old_partitions", _detach_params(retention_days))


def _run_step(dsn: str, name: str, params: Mapping[str, object]) -> list[str]:
    q = queries.load(_SQL)
    with connect(dsn) as conn:
        try:
            with conn.transaction():
                conn.execute(q["set_lock_timeout"], _lock_timeout(CLI_LOCK_TIMEOUT_S))
                rows = conn.execute(q[name], params).fetchall()
        except psycopg.OperationalError as exc:
            # lock_timeout (55P03) lands here too: maintenance lost a race for the
            # table lock and the next run will retry.
            raise StoreUnavailable(f"partition maintenance failed: {exc}") from exc
    return [str(row[0]) for row in rows]


# --- on a node: the maintenance loop ----------------------------------------------------


class MaintenanceRound:
    """One node's maintenance round: its connection holds the session-level maintenance
    lock, so no other node runs a round meanwhile."""

    def __init__(self, conn: Connection, q: Mapping[str, LiteralString]) -> None:
        self._conn = conn
        self._q = q

    async def ensure_partitions(self, days_ahead: int, *, lock_timeout_s: float) -> list[str]:
        """Create the missing day partitions from today (UTC) through ``days_ahead`` days
        later; the names created.

        Raises:
            StoreUnavailable: the database is away or the lock was not granted in time.
        """
        return await self._step(
            "ensure_partitions", _ensure_params(days_ahead, None), lock_timeout_s
        )

    async def detach_old_partitions(
        self, retention_days: int, *, lock_timeout_s: float
    ) -> list[str]:
        """Detach and drop the finished day partitions past ``retention_days``; the names
        dropped.

        Raises:
            StoreUnavailable: the database is away or the lock was not granted in time.
        """
        return await self._step(
            "detach_old_partitions", _detach_params(retention_days), lock_timeout_s
        )

    async def _step(
        self, name: str, params: Mapping[str, object], lock_timeout_s: float
    ) -> list[str]:
        async with self._conn.transaction():
            await self._conn.execute(self._q["set_lock_timeout"], _lock_timeout(lock_timeout_s))
            cur = await self._conn.execute(self._q[name], params)
            return [str(row[0]) for row in await cur.fetchall()]


class PartitionStore:
    """A node's partition-maintenance statements, over the Store's pool."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load(_SQL)

    @asynccontextmanager
    async def maintenance_round(self) -> AsyncIterator[MaintenanceRound | None]:
        """The round, holding the maintenance lock until the block ends; None when
        another node holds it (that node is running the round).

        Raises:
            StoreUnavailable: the database is away (also for failures inside the block).
        """
        async with self._store.connection() as conn:
            cur = await conn.execute(self._q["try_maintenance_lock"])
            row = await cur.fetchone()
            if row is None or not row[0]:
                yield None
                return
            try:
                yield MaintenanceRound(conn, self._q)
            finally:
                # A broken connection has released the lock already.
                with contextlib.suppress(Exception):
                    await conn.execute(self._q["maintenance_unlock"])

    async def analyze_new_tables(self, min_changes: int) -> list[str]:
        """ANALYZE the hot tables that took ``min_changes`` rows but never had statistics;
        their names. Needs no lock: several nodes may run it, and only the first finds
        anything to do.

        Raises:
            StoreUnavailable: the database is away.
        """
        analyzed: list[str] = []
        async with self._store.connection() as conn:
            cur = await conn.execute(self._q["never_analyzed_tables"], {"min_changes": min_changes})
            for schema, table in await cur.fetchall():
                await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, table)))
                analyzed.append(f"{schema}.{table}")
        return analyzed

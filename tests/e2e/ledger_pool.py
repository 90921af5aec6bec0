"""The connection pool the e2e worker modules write their side-effect ledgers with, and
the one write of the history checker's ``effects`` ledger they share (:func:`record`).

Test bookkeeping: ``synchronous_commit = off`` so handlers do not hold their slots for a
disk flush each (the ledger, not the scheduler, would otherwise set the pace). Opened
once per process; concurrent first handlers wait for that one open.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from chronoshard.worker import TaskContext

_pools: dict[str, AsyncConnectionPool] = {}
_lock = asyncio.Lock()


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute("SET synchronous_commit = off")


async def ledger(dsn: str) -> AsyncConnectionPool:
    async with _lock:
        pool = _pools.get(dsn)
        if pool is None:
            pool = AsyncConnectionPool(
                dsn,
                min_size=1,
                max_size=8,
                kwargs={"autocommit": True},
                configure=_configure,
                open=False,
            )
            await pool.open(wait=True)
            _pools[dsn] = pool
    return pool


async def record(dsn: str, ctx: TaskContext, started_at: datetime, outcome: str) -> None:
    """One row of the ``effects`` ledger (tests/harness/history.py): this attempt of the
    task started at ``started_at`` (the worker's clock) and ended ``outcome``."""
    pool = await ledger(dsn)
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO effects (task_id, attempt, token, worker_id, started_at, due_at, outcome)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (
                ctx.task_id,
                ctx.attempt,
                ctx.fencing_token,
                ctx.worker_id,
                started_at,
                ctx.due_at,
                outcome,
            ),
        )

"""The connection pool the e2e worker modules write their side-effect ledgers with.

Test bookkeeping: ``synchronous_commit = off`` so handlers do not hold their slots for a
disk flush each (the ledger, not the scheduler, would otherwise set the pace). Opened
once per process; concurrent first handlers wait for that one open.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

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

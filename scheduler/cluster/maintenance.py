"""Partition maintenance on the scheduler nodes: future days created, old days dropped.

History must not slow the scheduler down (issue: durable run state): ``tasks`` is
partitioned by day, the hot statements prune to one partition or read only partial
indexes of live rows, and this loop keeps the partitions coming and going. Every
``maintenance.interval_s`` each node tries a session-level advisory lock; the one that
gets it (the others skip the round) creates the day partitions for the next
``partitions_ahead_days`` days and detaches and drops the finished ones past
``retention_days`` (the SQL functions of migration 0002, which keep any partition that
still holds an unfinished or dead-lettered task), then forgets worker-session rows
nobody refreshed for a day.

Statistics for new partitions: a day partition has none until autovacuum first analyzes
it, up to a minute after it takes rows, and meanwhile the planner's default guesses turn
the batched completion into a scan of the partition's in-flight index per row (measured:
85 ms per batch instead of 1 ms, at 1,000 tasks/s). So every ``stats_interval_s`` the
loop also analyzes any ``tasks`` partition (or ``task_attempts``) that took
:data:`ANALYZE_MIN_CHANGES` rows and was never analyzed; autovacuum keeps the statistics
current from then on. This needs no lock: several nodes may do it, and only the first
finds anything to do.

Without blocking dispatch: creating or detaching a partition needs the ``tasks`` table's
ACCESS EXCLUSIVE lock for a moment, and while that lock request waits (behind a long
reader, say) every other statement on ``tasks`` queues behind it. So each step runs with
a short ``lock_timeout`` (``maintenance.lock_timeout_s``); a step that is not granted
the lock in time gives up, nothing is held, and the round is retried after
``retry_interval_s``. Partitions are made days ahead, so a missed round costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import LiteralString

from psycopg import sql

from chronoshard.scheduler.config import MaintenanceConfig
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection, Store

log = logging.getLogger(__name__)

WORKER_SESSION_RETENTION_S = 86400.0
ANALYZE_MIN_CHANGES = 1000


@dataclass(frozen=True, slots=True)
class MaintenanceResult:
    created: list[str]
    dropped: list[str]
    worker_sessions_forgotten: int


class PartitionMaintenance:
    def __init__(self, config: MaintenanceConfig, store: Store) -> None:
        self._config = config
        self._store = store
        self._q = queries.load("repairs.sql")
        self._partitions = queries.load("migrate.sql")
        self.stats: dict[str, int] = {
            "rounds": 0,
            "skipped_lock_held": 0,
            "partitions_created": 0,
            "partitions_dropped": 0,
            "failures": 0,
            "tables_analyzed": 0,
        }

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_round = loop.time()
        while True:
            if loop.time() >= next_round:
                delay_s = self._config.interval_s
                try:
                    await self.run_once()
                except StoreUnavailable as exc:
                    self.stats["failures"] += 1
                    delay_s = min(delay_s, self._config.retry_interval_s)
                    log.warning(
                        "partition maintenance failed; will retry", extra={"error": str(exc)}
                    )
                next_round = loop.time() + delay_s
            try:
                await self.analyze_new_tables()
            except StoreUnavailable as exc:
                log.warning("analyzing new partitions failed", extra={"error": str(exc)})
            await asyncio.sleep(
                max(0.0, min(self._config.stats_interval_s, next_round - loop.time()))
            )

    async def analyze_new_tables(self) -> list[str]:
        """ANALYZE the hot tables that took rows but never had statistics; their names.

        Raises:
            StoreUnavailable: the database is away.
        """
        analyzed: list[str] = []
        async with self._store.connection() as conn:
            cur = await conn.execute(
                self._q["never_analyzed_tables"], {"min_changes": ANALYZE_MIN_CHANGES}
            )
            for schema, table in await cur.fetchall():
                await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(schema, table)))
                analyzed.append(f"{schema}.{table}")
        if analyzed:
            self.stats["tables_analyzed"] += len(analyzed)
            log.info("analyzed new tables", extra={"tables": analyzed})
        return analyzed

    async def run_once(self) -> MaintenanceResult | None:
        """One round; None when another node holds the maintenance lock.

        Raises:
            StoreUnavailable: the database is away or a table lock was not granted in
                ``lock_timeout_s`` (nothing is left half done: each step is one
                transaction).
        """
        async with self._store.connection() as conn:
            cur = await conn.execute(self._q["try_maintenance_lock"])
            row = await cur.fetchone()
            if row is None or not row[0]:
                self.stats["skipped_lock_held"] += 1
                return None
            try:
                self.stats["rounds"] += 1
                created = await self._step(
                    conn,
                    self._partitions["ensure_partitions"],
                    {"from_day": None, "days_ahead": self._config.partitions_ahead_days},
                )
                self.stats["partitions_created"] += len(created)
                dropped = await self._step(
                    conn,
                    self._partitions["detach_old_partitions"],
                    {"retention_days": self._config.retention_days},
                )
                self.stats["partitions_dropped"] += len(dropped)
                cur = await conn.execute(
                    self._q["forget_old_worker_sessions"],
                    {"older_than_s": WORKER_SESSION_RETENTION_S},
                )
                forgotten = cur.rowcount
            finally:
                # A broken connection has released the lock already.
                with contextlib.suppress(Exception):
                    await conn.execute(self._q["maintenance_unlock"])
        if created or dropped:
            log.info("partition maintenance", extra={"created": created, "dropped": dropped})
        return MaintenanceResult(created, dropped, forgotten)

    async def _step(
        self, conn: Connection, query: LiteralString, params: dict[str, object]
    ) -> list[str]:
        async with conn.transaction():
            await conn.execute(
                self._q["set_lock_timeout"],
                {"lock_timeout": f"{int(self._config.lock_timeout_s * 1000)}ms"},
            )
            cur = await conn.execute(query, params)
            return [str(row[0]) for row in await cur.fetchall()]

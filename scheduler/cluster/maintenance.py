"""Partition maintenance on the scheduler nodes: future days created, old days dropped.

History must not slow the scheduler down (issue: durable run state): ``tasks`` is
partitioned by day, the hot statements prune to one partition or read only partial
indexes of live rows, and this loop keeps the partitions coming and going. This module
is the loop and its policy (when a round runs, what it does, how long a step may wait);
the statements are :mod:`chronoshard.scheduler.store.partitions` and
:mod:`chronoshard.scheduler.store.sessions`. Every ``maintenance.interval_s`` each node
tries the maintenance lock; the one that gets it (the others skip the round) creates the
day partitions for the next ``partitions_ahead_days`` days and detaches and drops the
finished ones past ``retention_days`` (the SQL functions of migration 0002, which keep
any partition that still holds an unfinished or dead-lettered task), then forgets
worker-session rows nobody refreshed for a day.

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
import logging
from dataclasses import dataclass
from typing import ClassVar

from chronoshard.scheduler.config import MaintenanceConfig
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.partitions import PartitionStore
from chronoshard.scheduler.store.sessions import WorkerSessionStore

log = logging.getLogger(__name__)

WORKER_SESSION_RETENTION_S = 86400.0
ANALYZE_MIN_CHANGES = 1000


@dataclass(frozen=True, slots=True)
class MaintenanceResult:
    created: list[str]
    dropped: list[str]
    worker_sessions_forgotten: int


class PartitionMaintenance:
    STATS_GAUGES: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: MaintenanceConfig, store: Store) -> None:
        self._config = config
        self._partitions = PartitionStore(store)
        self._sessions = WorkerSessionStore(store)
        self._stats: dict[str, int] = {
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
                    self._stats["failures"] += 1
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
        analyzed = await self._partitions.analyze_new_tables(ANALYZE_MIN_CHANGES)
        if analyzed:
            self._stats["tables_analyzed"] += len(analyzed)
            log.info("analyzed new tables", extra={"tables": analyzed})
        return analyzed

    async def run_once(self) -> MaintenanceResult | None:
        """One round; None when another node holds the maintenance lock.

        Raises:
            StoreUnavailable: the database is away or a table lock was not granted in
                ``lock_timeout_s`` (nothing is left half done: each step is one
                transaction).
        """
        lock_timeout_s = self._config.lock_timeout_s
        async with self._partitions.maintenance_round() as round_:
            if round_ is None:
                self._stats["skipped_lock_held"] += 1
                return None
            self._stats["rounds"] += 1
            created = await round_.ensure_partitions(
                self._config.partitions_ahead_days, lock_timeout_s=lock_timeout_s
            )
            self._stats["partitions_created"] += len(created)
            dropped = await round_.detach_old_partitions(
                self._config.retention_days, lock_timeout_s=lock_timeout_s
            )
            self._stats["partitions_dropped"] += len(dropped)
        # After the lock is released (the round's connection back in the pool): only the
        # node that ran the round gets here, and deleting aged rows twice is harmless.
        forgotten = await self._sessions.forget_old_worker_sessions(WORKER_SESSION_RETENTION_S)
        if created or dropped:
            log.info("partition maintenance", extra={"created": created, "dropped": dropped})
        return MaintenanceResult(created, dropped, forgotten)

    def get_stats(self) -> dict[str, int]:
        return dict(self._stats)

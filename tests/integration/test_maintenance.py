"""Partition maintenance on a node, against a real PostgreSQL: one node per round, future
days created, finished days past retention dropped, and a lock it cannot get gives the
round up quickly instead of queueing dispatch behind it."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from fixtures.rows import session_reports
from fixtures.waiting import eventually

from chronoshard.scheduler.cluster.maintenance import (
    ANALYZE_MIN_CHANGES,
    WORKER_SESSION_RETENTION_S,
    PartitionMaintenance,
)
from chronoshard.scheduler.config import MaintenanceConfig
from chronoshard.scheduler.errors import StoreUnavailable
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.sessions import WorkerSessionStore

CONFIG = MaintenanceConfig(retention_days=30, partitions_ahead_days=7, lock_timeout_s=0.2)
# Far above the 0.2 s lock timeout: the round must give up, not wait for the lock holder.
GIVE_UP_BOUND_S = 5.0


# Rounds create and drop day partitions: every test on a database of its own.
pytestmark = pytest.mark.store(own_database=True)


def _day(offset: int) -> str:
    day = datetime.now(UTC).date() + timedelta(days=offset)
    return "tasks_p" + day.strftime("%Y%m%d")


def _partitions(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'tasks'::regclass"
        ).fetchall()
    return {str(r[0]) for r in rows}


def _old_finished_day(dsn: str, days_ago: int, status: str) -> str:
    """A day partition ``days_ago`` back holding one task in ``status``."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT chronoshard_ensure_partitions((now() AT TIME ZONE 'UTC')::date - %s, 0)",
            (days_ago,),
        )
        tenant = conn.execute(
            "INSERT INTO tenants (name, tier, rate_limit_rps, max_concurrent_workers,"
            " home_region, api_key_hash) VALUES (%s, 'standard', 1, 1, 'x', %s) RETURNING id",
            (f"t-{uuid.uuid4().hex}", uuid.uuid4().hex),
        ).fetchone()
        assert tenant is not None
        conn.execute(
            "INSERT INTO tasks (id, tenant_id, type, scheduled_at, due_at, status, max_retries,"
            " backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode, payload,"
            " shard, priority, queue) VALUES (gen_random_uuid(), %s, 't',"
            " date_trunc('day', now()) - make_interval(days => %s) + interval '1 hour',"
            " date_trunc('day', now()) - make_interval(days => %s) + interval '1 hour',"
            " %s, 3, 1, 60, 2, 'NONE', '{}', 0, 'standard', 'default')",
            (tenant[0], days_ago, days_ago, status),
        )
    return _day(-days_ago)


async def test_a_round_creates_future_days_and_drops_finished_days_past_retention(
    store: Store, fresh_db_dsn: str
) -> None:
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {_day(7)}")
    finished = _old_finished_day(fresh_db_dsn, 40, "COMPLETED")
    dead = _old_finished_day(fresh_db_dsn, 41, "DEAD_LETTER")
    recent = _old_finished_day(fresh_db_dsn, 10, "COMPLETED")
    maintenance = PartitionMaintenance(CONFIG, store)

    result = await maintenance.run_once()

    assert result is not None
    assert result.created == [_day(7)]
    assert result.dropped == [finished]
    partitions = _partitions(fresh_db_dsn)
    assert finished not in partitions
    # A dead-lettered task may still be retried by an operator; recent days are kept.
    assert {dead, recent, _day(7)} <= partitions
    assert maintenance.get_stats()["partitions_created"] == 1
    assert maintenance.get_stats()["partitions_dropped"] == 1
    # A second round finds nothing to do.
    again = await maintenance.run_once()
    assert again is not None and (again.created, again.dropped) == ([], [])


async def test_only_one_node_runs_a_round(store: Store, fresh_db_dsn: str) -> None:
    with psycopg.connect(fresh_db_dsn, autocommit=True) as other_node:
        other_node.execute("SELECT pg_advisory_lock(1667789423, 3)")
        maintenance = PartitionMaintenance(CONFIG, store)
        assert await maintenance.run_once() is None
        assert maintenance.get_stats()["skipped_lock_held"] == 1
    # The other node's session ended: its lock goes with it, as soon as PostgreSQL has
    # finished ending that backend (closing the socket does not wait for that).
    assert await eventually(maintenance.run_once, timeout_s=10, what="the lock released")


async def test_a_table_lock_it_cannot_get_fails_the_round_quickly(
    store: Store, fresh_db_dsn: str
) -> None:
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {_day(7)}")
    with psycopg.connect(fresh_db_dsn) as reader:
        # A long reader holds ACCESS SHARE on tasks: partition DDL must not wait for it
        # (every statement on tasks would queue behind the waiting DDL).
        reader.execute("SELECT count(*) FROM tasks")
        maintenance = PartitionMaintenance(CONFIG, store)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await maintenance.run_once()
        assert time.monotonic() - started < GIVE_UP_BOUND_S
        reader.rollback()
    # Nothing was left half done, and the lock is free for the next round.
    assert _day(7) not in _partitions(fresh_db_dsn)
    result = await maintenance.run_once()
    assert result is not None and result.created == [_day(7)]


async def test_a_round_forgets_worker_sessions_nobody_refreshed_for_a_day(
    store: Store, fresh_db_dsn: str
) -> None:
    sessions = WorkerSessionStore(store)
    await sessions.touch_worker_sessions("node-a", session_reports("fresh", "stale"))
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE worker_sessions SET last_seen_at = now() - make_interval(secs => %s)"
            " - interval '1 minute' WHERE worker_id = 'stale'",
            (WORKER_SESSION_RETENTION_S,),
        )

    result = await PartitionMaintenance(CONFIG, store).run_once()

    assert result is not None and result.worker_sessions_forgotten == 1
    with psycopg.connect(fresh_db_dsn) as conn:
        rows = conn.execute("SELECT worker_id FROM worker_sessions").fetchall()
    assert rows == [("fresh",)]


def _analyzed(dsn: str, table: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = %s",
            (table,),
        ).fetchone()
    return bool(row and row[0])


async def test_a_new_partition_that_took_rows_is_analyzed_once(
    store: Store, fresh_db_dsn: str
) -> None:
    today = _day(0)
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        # Autovacuum must not get there first: this test is about our own pass.
        conn.execute(f"ALTER TABLE {today} SET (autovacuum_enabled = false)")
        tenant = conn.execute(
            "INSERT INTO tenants (name, tier, rate_limit_rps, max_concurrent_workers,"
            " home_region, api_key_hash) VALUES ('stats', 'standard', 1, 1, 'x', 'h')"
            " RETURNING id"
        ).fetchone()
        assert tenant is not None
        conn.execute(
            "INSERT INTO tasks (id, tenant_id, type, scheduled_at, due_at, status, max_retries,"
            " backoff_initial_s, backoff_max_s, backoff_multiplier, jitter_mode, payload,"
            " shard, priority, queue)"
            " SELECT gen_random_uuid(), %s, 't', now(), now(), 'SCHEDULED', 3, 1, 60, 2,"
            " 'NONE', '{}', i %% 64, 'standard', 'default' FROM generate_series(1, %s) AS i",
            (tenant[0], ANALYZE_MIN_CHANGES + 200),
        )
    maintenance = PartitionMaintenance(CONFIG, store)
    assert not _analyzed(fresh_db_dsn, today)

    # Row counts reach pg_stat_user_tables within a second or so of the commit.
    analyzed = await eventually(
        maintenance.analyze_new_tables, timeout_s=10, what="the new partition analyzed"
    )
    assert analyzed == [f"public.{today}"]
    assert _analyzed(fresh_db_dsn, today)
    assert await maintenance.analyze_new_tables() == []  # autovacuum's from here on

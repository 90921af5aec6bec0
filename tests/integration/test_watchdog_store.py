"""The watchdog's SQL and its leader lock on a real PostgreSQL: newest completions per
expectation (paged, per tenant, index-backed), one open alert per key, owed resolves,
config expectations, canary bookkeeping from the scheduler's tables, and the advisory
lock that lets exactly one replica lead."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import LiteralString

import psycopg
import pytest
from fixtures.rows import sql, tenant_row

from chronoshard.clock import SystemClock
from chronoshard.watchdog.config import DatabaseConfig as WatchdogDatabase
from chronoshard.watchdog.config import (
    ElectionConfig,
    ExpectationConfig,
    WatchdogConfig,
)
from chronoshard.watchdog.election import Contact, Election, close_quietly
from chronoshard.watchdog.errors import DatabaseUnavailable
from chronoshard.watchdog.incidents import (
    CanaryStatus,
    Condition,
    Event,
    Kind,
    Severity,
)
from chronoshard.watchdog.store import CanaryUpdate, WatchdogStore


async def expect(dsn: str, tenant_id: uuid.UUID, job_id: str, interval_s: float = 60) -> None:
    await sql(
        dsn,
        "INSERT INTO expectations (tenant_id, job_id, interval_s, tolerance_s)"
        " VALUES (%s, %s, %s, 1)",
        (tenant_id, job_id, interval_s),
    )


async def complete(dsn: str, tenant_id: uuid.UUID, job_id: str, ago_s: float = 0) -> None:
    await sql(
        dsn,
        "INSERT INTO task_completions (job_id, task_id, tenant_id, completed_at)"
        " VALUES (%s, %s, %s, now() - make_interval(secs => %s))",
        (job_id, uuid.uuid4(), tenant_id, ago_s),
    )


@pytest.fixture
async def store(fresh_db_dsn: str) -> AsyncIterator[WatchdogStore]:
    async with await psycopg.AsyncConnection.connect(fresh_db_dsn, autocommit=True) as conn:
        await conn.execute("SET TIME ZONE 'UTC'")
        yield WatchdogStore(conn, timeout_s=10)


async def test_job_statuses_page_through_every_expectation_with_its_newest_completion(
    fresh_db_dsn: str, store: WatchdogStore
) -> None:
    acme, other = await tenant_row(fresh_db_dsn, "acme"), await tenant_row(fresh_db_dsn)
    for job in ("a", "b", "c", "d", "e"):
        await expect(fresh_db_dsn, acme, job)
    await expect(fresh_db_dsn, other, "a")
    await complete(fresh_db_dsn, acme, "a", ago_s=100)
    await complete(fresh_db_dsn, acme, "a", ago_s=10)
    await complete(fresh_db_dsn, other, "b", ago_s=1)  # another tenant's "b": not acme's
    await complete(fresh_db_dsn, other, "a", ago_s=1000)
    await sql(fresh_db_dsn, "UPDATE expectations SET enabled = false WHERE job_id = 'e'")

    db_now, statuses = await store.job_statuses(batch_size=2)

    assert db_now is not None
    got = {(s.expectation.tenant_id, s.expectation.job_id): s for s in statuses}
    assert set(got) == {(acme, j) for j in "abcd"} | {(other, "a")}
    acme_a = got[(acme, "a")].last_completed_at
    assert acme_a is not None and 9 <= (db_now - acme_a).total_seconds() <= 12
    assert got[(acme, "b")].last_completed_at is None
    other_a = got[(other, "a")].last_completed_at
    assert other_a is not None and (db_now - other_a).total_seconds() >= 999
    assert got[(acme, "a")].expectation.tenant_name == "acme"


async def test_the_newest_completion_is_found_through_the_index(
    fresh_db_dsn: str, store: WatchdogStore
) -> None:
    acme = await tenant_row(fresh_db_dsn)
    await expect(fresh_db_dsn, acme, "job-1")
    await sql(
        fresh_db_dsn,
        "INSERT INTO task_completions (job_id, task_id, tenant_id, completed_at)"
        " SELECT 'job-' || (i %% 50), gen_random_uuid(), %s, now() - make_interval(secs => i)"
        " FROM generate_series(1, 20000) AS i",
        (acme,),
    )
    await sql(fresh_db_dsn, "ANALYZE task_completions")
    from chronoshard.watchdog.store import JOB_STATUSES

    params = {"after_tenant": uuid.UUID(int=0), "after_job": "", "limit": 500}
    explain: LiteralString = "EXPLAIN " + JOB_STATUSES
    plan = "\n".join(r[0] for r in await sql(fresh_db_dsn, explain, params))
    assert "task_completions_tenant_job_idx" in plan, plan
    assert "Seq Scan on task_completions" not in plan, plan


async def test_one_open_alert_per_key_resolve_and_owed_notifications(
    store: WatchdogStore,
) -> None:
    condition = Condition(
        Kind.JOB_OVERDUE, "chronoshard/job/x/y", Severity.WARNING, "y is overdue",
        job_id="y", details={"at": datetime(2030, 1, 1).isoformat()},
    )  # fmt: skip
    opened = await store.open_alert(condition)
    assert opened is not None and opened.id is not None
    assert opened.severity is Severity.WARNING and opened.last_notified_at is None
    assert await store.open_alert(condition) is None  # still open: no second one

    [owed] = await store.alerts_to_plan(["job_overdue"], 3600)
    assert owed.id == opened.id and owed.is_open
    assert await store.alerts_to_plan(["canary_late"], 3600) == []

    await store.mark_notified(opened.id, Event.TRIGGER)
    resolved = await store.resolve_alert(opened.id, "a completion arrived")
    assert resolved is not None and resolved.resolved_at is not None
    assert resolved.details["resolution"] == "a completion arrived"
    assert resolved.notifications == 1 and resolved.last_notified_at is not None
    assert await store.resolve_alert(opened.id, "again") is None
    [pending] = await store.alerts_to_plan(["job_overdue"], 3600)
    assert pending.resolve_notified_at is None  # the resolve is owed

    await store.mark_notified(opened.id, Event.RESOLVE)
    assert await store.alerts_to_plan(["job_overdue"], 3600) == []
    reopened = await store.open_alert(condition)
    assert reopened is not None and reopened.id != opened.id


async def test_config_expectations_are_written_kept_and_removed(
    fresh_db_dsn: str, store: WatchdogStore
) -> None:
    acme = await tenant_row(fresh_db_dsn, "acme-cfg")
    await expect(fresh_db_dsn, acme, "from-api")
    wanted = [
        ExpectationConfig(tenant="acme-cfg", job_id="nightly", interval_s=86400, tolerance_s=60),
        ExpectationConfig(tenant="nobody", job_id="x", interval_s=1),
    ]
    synced = await store.sync_config(wanted)
    assert (synced.written, synced.removed, synced.unknown_tenants) == (1, 0, ("nobody",))
    [(source, created)] = await sql(
        fresh_db_dsn,
        "SELECT source, created_at FROM expectations WHERE job_id = 'nightly'",
    )
    assert source == "config"

    changed = [ExpectationConfig(tenant="acme-cfg", job_id="nightly", interval_s=3600)]
    await store.sync_config(changed)
    [(interval, created_again)] = await sql(
        fresh_db_dsn,
        "SELECT interval_s, created_at FROM expectations WHERE job_id = 'nightly'",
    )
    assert interval == 3600 and created_again == created  # registration time kept

    synced = await store.sync_config([])
    assert synced.removed == 1
    rows = await sql(fresh_db_dsn, "SELECT job_id, source FROM expectations ORDER BY job_id")
    assert rows == [("from-api", "api")]  # API expectations are never touched


async def test_canaries_learn_dispatch_and_completion_from_the_scheduler_tables(
    fresh_db_dsn: str, store: WatchdogStore
) -> None:
    acme = await tenant_row(fresh_db_dsn)
    done_id, lost_id, failed_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    done_task = uuid.uuid4()
    scheduled = await store.insert_canary(done_id)
    await store.set_canary_task(done_id, done_task)
    await store.insert_canary(lost_id)
    await store.set_canary_task(lost_id, uuid.uuid4())
    await store.insert_canary(failed_id)
    await store.set_canary_failed(failed_id, "submit failed: UNAVAILABLE")
    await sql(
        fresh_db_dsn,
        "INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token, state)"
        " VALUES (%s, 1, %s, 1, 'SUCCEEDED')",
        (done_task, scheduled),
    )
    await sql(
        fresh_db_dsn,
        "INSERT INTO task_completions (job_id, task_id, tenant_id, completed_at)"
        " VALUES ('chronoshard.canary', %s, %s, %s)",
        (done_task, acme, scheduled + timedelta(seconds=0.25)),
    )

    db_now, canaries = await store.recent_canaries(horizon_s=60, limit=10)

    assert db_now is not None
    by_id = {c.run.id: c for c in canaries}
    done = by_id[done_id]
    assert done.run.completed_at == scheduled + timedelta(seconds=0.25)
    assert done.run.dispatched_at is not None and done.stored_completed_at is None
    assert by_id[lost_id].run.completed_at is None
    assert by_id[failed_id].run.submit_failed and by_id[failed_id].status is CanaryStatus.FAILED

    await store.update_canaries(
        [
            CanaryUpdate(
                done_id, CanaryStatus.COMPLETED, done.run.dispatched_at, done.run.completed_at
            )
        ]
    )
    _, again = await store.recent_canaries(horizon_s=60, limit=10)
    stored = {c.run.id: c for c in again}[done_id]
    assert stored.status is CanaryStatus.COMPLETED
    assert stored.stored_completed_at == scheduled + timedelta(seconds=0.25)


def _config(dsn: str, lock_name: str, node_id: str) -> WatchdogConfig:
    return WatchdogConfig(
        node_id=node_id,
        database=WatchdogDatabase(dsn=dsn, connect_timeout_s=2, statement_timeout_s=5),
        election=ElectionConfig(lock_name=lock_name, retry_interval_s=0.1),
    )


async def test_exactly_one_replica_holds_the_lock_and_the_other_takes_over(
    fresh_db_dsn: str,
) -> None:
    lock = f"test-{uuid.uuid4().hex}"
    first = Election(_config(fresh_db_dsn, lock, "a"), Contact(SystemClock()))
    second_contact = Contact(SystemClock())
    second = Election(_config(fresh_db_dsn, lock, "b"), second_contact)
    leader = await first.acquire()
    waiting = asyncio.create_task(second.acquire())
    await asyncio.sleep(0.5)
    assert not waiting.done(), "two replicas hold the lock"
    assert second.attempts >= 2 and second_contact.up  # the standby talks to the database

    started = asyncio.get_running_loop().time()
    await close_quietly(leader)  # the leader's session ends: its lock goes with it
    successor = await asyncio.wait_for(waiting, timeout=5)
    took_s = asyncio.get_running_loop().time() - started
    assert took_s < 1.0, f"handover took {took_s:.2f} s"
    # Only the session that holds the lock can write: the old one is gone.
    with pytest.raises(DatabaseUnavailable):
        await WatchdogStore(leader, timeout_s=2).ping()
    await WatchdogStore(successor, timeout_s=2).ping()
    await close_quietly(successor)


async def test_an_unreachable_database_is_reported_not_raised() -> None:
    config = _config("postgresql://postgres@127.0.0.1:1/nowhere", "x", "a")
    contact = Contact(SystemClock())
    election = Election(config, contact)
    task = asyncio.create_task(election.acquire())
    await asyncio.sleep(0.5)
    assert not task.done()
    assert not contact.up and contact.seconds_since() >= 0.4
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

"""The watchdog watches every schedule, on a real PostgreSQL, through its real check.

Schedules, occurrences and completions are written with SQL, as the scheduler's
materialiser and workers would (the schedule API is not used). Time does not pass in
these tests: an occurrence is put before or past its deadline by its logical date
relative to the database's ``now()``, and "the deadline passes" is the occurrence row
moved back, so nothing depends on how fast the machine is.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, LiteralString

import psycopg
import pytest
from fixtures.rows import sql, tenant_row
from psycopg.rows import dict_row

from chronoshard.clock import SystemClock
from chronoshard.watchdog.canary import CanaryStats
from chronoshard.watchdog.checker import Checker, CheckStats
from chronoshard.watchdog.config import DatabaseConfig, WatchdogConfig
from chronoshard.watchdog.incidents import (
    Action,
    Event,
    Kind,
    Open,
    Resolve,
    schedule_dedup_key,
)
from chronoshard.watchdog.notifier import DeliveryStats, Notifier, RetryPolicy
from chronoshard.watchdog.sinks import Notice
from chronoshard.watchdog.store import SCHEDULE_STATUSES, WatchdogStore

EXPECTED_S = 60.0
TOLERANCE_S = 30.0
SLACK_S = EXPECTED_S + TOLERANCE_S


async def new_schedule(
    dsn: str,
    tenant_id: uuid.UUID,
    name: str,
    *,
    job_id: str | None = None,
    next_in_s: float | None = 3600.0,
    watch: bool = True,
    paused: bool = False,
) -> uuid.UUID:
    """A schedule as the API would create it; ``next_at`` is ``now() + next_in_s``
    (negative: in the past, nobody materialised it; None: the schedule ended)."""
    schedule_id = uuid.uuid4()
    await sql(
        dsn,
        "INSERT INTO schedules (id, tenant_id, name, shard, interval_s, timezone, anchor_at,"
        " task_template, catchup_policy, catchup_limit, misfire_grace_s, overlap_policy,"
        " job_id, watch, expected_duration_s, tolerance_s, severity, paused, cursor_at,"
        " next_at)"
        " VALUES (%(id)s, %(tenant)s, %(name)s, 0, 3600, 'UTC', now() - interval '1 day',"
        " '\\x'::bytea, 'SKIP', 1, 60, 'ALLOW', %(job)s, %(watch)s, %(expected)s,"
        " %(tolerance)s, 'error', %(paused)s, now() - interval '1 day',"
        " CASE WHEN %(next_in)s::float8 IS NULL THEN NULL"
        "      ELSE now() + make_interval(secs => %(next_in)s::float8) END)",
        {
            "id": schedule_id,
            "tenant": tenant_id,
            "name": name,
            "job": job_id or name,
            "watch": watch,
            "expected": EXPECTED_S,
            "tolerance": TOLERANCE_S,
            "paused": paused,
            "next_in": next_in_s,
        },
    )
    return schedule_id


async def occurrence(
    dsn: str,
    schedule_id: uuid.UUID,
    tenant_id: uuid.UUID,
    ago_s: float,
    *,
    with_task: bool = True,
) -> uuid.UUID | None:
    """An occurrence the materialiser decided, logical date ``now() - ago_s``; its task
    id (None: skipped by the overlap policy, no task)."""
    task_id = uuid.uuid4() if with_task else None
    await sql(
        dsn,
        "INSERT INTO schedule_occurrences (schedule_id, logical_date, tenant_id, origin,"
        " task_id, task_scheduled_at)"
        " VALUES (%(s)s, now() - make_interval(secs => %(ago)s), %(t)s, 'SCHEDULE', %(task)s,"
        " CASE WHEN %(task)s::uuid IS NULL THEN NULL"
        "      ELSE now() - make_interval(secs => %(ago)s) END)",
        {"s": schedule_id, "ago": ago_s, "t": tenant_id, "task": task_id},
    )
    return task_id


async def age_occurrences(dsn: str, schedule_id: uuid.UUID, seconds: float) -> None:
    """Time passes for the schedule's occurrences: every logical date moves back."""
    await sql(
        dsn,
        "UPDATE schedule_occurrences"
        " SET logical_date = logical_date - make_interval(secs => %s)"
        " WHERE schedule_id = %s",
        (seconds, schedule_id),
    )


async def complete(
    dsn: str,
    tenant_id: uuid.UUID,
    job_id: str,
    *,
    task_id: uuid.UUID | None = None,
    ago_s: float = 0.0,
) -> None:
    await sql(
        dsn,
        "INSERT INTO task_completions (job_id, task_id, tenant_id, completed_at)"
        " VALUES (%s, %s, %s, now() - make_interval(secs => %s))",
        (job_id, task_id or uuid.uuid4(), tenant_id, ago_s),
    )


@dataclass
class CapturingSink:
    name: str = "capture"
    pages: bool = True
    notices: list[Notice] = field(default_factory=list)

    async def send(self, notice: Notice) -> None:
        self.notices.append(notice)

    def events(self, dedup_key: str) -> list[Event]:
        return [n.event for n in self.notices if n.alert.dedup_key == dedup_key]


@dataclass
class Harness:
    dsn: str
    store: WatchdogStore
    checker: Checker
    notifier: Notifier
    sink: CapturingSink
    stats: CheckStats

    async def check(self) -> list[Action]:
        """One real check; its deliveries finished and recorded before it returns, so
        the next check sees what a later check interval would."""
        actions = await self.checker.check()
        await self.notifier.drain(10)
        assert not self.notifier.busy()
        return actions

    async def alert_rows(self, dedup_key: str) -> list[dict[str, Any]]:
        async with (
            await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn,
            conn.cursor(row_factory=dict_row) as cur,
        ):
            await cur.execute("SELECT * FROM alerts WHERE dedup_key = %s ORDER BY id", (dedup_key,))
            return await cur.fetchall()


@pytest.fixture
async def harness(fresh_db_dsn: str) -> AsyncIterator[Harness]:
    config = WatchdogConfig(
        node_id="wd-test",
        renotify_interval_s=0,
        check_batch_size=2,  # several batches even for a handful of schedules
        database=DatabaseConfig(dsn=fresh_db_dsn),
    )
    async with await psycopg.AsyncConnection.connect(fresh_db_dsn, autocommit=True) as conn:
        store = WatchdogStore(conn, timeout_s=10)
        sink = CapturingSink()
        notifier = Notifier([sink], RetryPolicy(max_attempts=1), DeliveryStats())
        stats = CheckStats()
        checker = Checker(
            config, store, notifier, SystemClock(), stats, CanaryStats(), lambda _: None
        )
        yield Harness(fresh_db_dsn, store, checker, notifier, sink, stats)
        await notifier.close()


def opened(actions: list[Action], kind: Kind = Kind.SCHEDULE_MISSED) -> list[str]:
    return [
        a.condition.dedup_key for a in actions if isinstance(a, Open) and a.condition.kind == kind
    ]


def resolved(actions: list[Action]) -> list[str]:
    return [a.alert.dedup_key for a in actions if isinstance(a, Resolve)]


async def test_an_occurrence_past_its_deadline_alerts_once_and_resolves_when_it_completes(
    harness: Harness,
) -> None:
    acme = await tenant_row(harness.dsn, "acme")
    sid = await new_schedule(harness.dsn, acme, "nightly-report")
    key = schedule_dedup_key(sid)
    # Its previous run completed on time; the current one is running, within its slack.
    earlier = await occurrence(harness.dsn, sid, acme, ago_s=SLACK_S + 3600)
    await complete(harness.dsn, acme, "nightly-report", task_id=earlier, ago_s=SLACK_S + 3590)
    task = await occurrence(harness.dsn, sid, acme, ago_s=SLACK_S - 30)

    assert opened(await harness.check()) == []
    assert harness.stats.schedules == 1 and harness.stats.missed_schedules == 0

    await age_occurrences(harness.dsn, sid, 60)  # its deadline passed 30 s ago
    assert opened(await harness.check()) == [key]
    assert harness.stats.missed_schedules == 1
    [row] = await harness.alert_rows(key)
    assert row["kind"] == "schedule_missed" and row["resolved_at"] is None
    assert row["tenant_id"] == acme and row["job_id"] == "nightly-report"
    assert row["severity"] == "error"
    details = row["details"]
    assert details["schedule_id"] == str(sid) and details["job_id"] == "nightly-report"
    assert details["task_id"] == str(task) and details["occurrence_created"] is True
    [(logical_date,)] = await sql(
        harness.dsn,
        "SELECT max(logical_date) FROM schedule_occurrences WHERE schedule_id = %s",
        (sid,),
    )
    deadline = logical_date + timedelta(seconds=SLACK_S)
    assert details["logical_date"] == logical_date.isoformat()
    assert details["deadline"] == deadline.isoformat()
    assert "'nightly-report'" in row["summary"] and "tenant acme" in row["summary"]
    assert logical_date.isoformat() in row["summary"] and deadline.isoformat() in row["summary"]
    assert harness.sink.events(key) == [Event.TRIGGER]

    # Later checks while it is still missing: nothing new, one alert on record.
    for _ in range(3):
        assert await harness.check() == []
    assert len(await harness.alert_rows(key)) == 1
    assert harness.sink.events(key) == [Event.TRIGGER]

    await complete(harness.dsn, acme, "nightly-report", task_id=task)
    assert resolved(await harness.check()) == [key]
    [row] = await harness.alert_rows(key)
    assert row["resolved_at"] is not None
    assert row["details"]["resolution"] == "an occurrence completed"
    assert harness.sink.events(key) == [Event.TRIGGER, Event.RESOLVE]
    assert await harness.check() == []
    assert harness.stats.missed_schedules == 0


async def test_a_later_run_of_the_job_satisfies_an_occurrence_but_earlier_or_foreign_do_not(
    harness: Harness,
) -> None:
    acme, other = await tenant_row(harness.dsn), await tenant_row(harness.dsn)
    sid = await new_schedule(harness.dsn, acme, "hourly", job_id="etl")
    key = schedule_dedup_key(sid)
    # Skipped by the overlap policy (no task of its own): the run before it must finish.
    await occurrence(harness.dsn, sid, acme, ago_s=SLACK_S + 10, with_task=False)
    await complete(harness.dsn, acme, "etl", ago_s=SLACK_S + 20)  # before its logical date
    await complete(harness.dsn, other, "etl")  # another tenant's job of the same name

    assert opened(await harness.check()) == [key]
    [row] = await harness.alert_rows(key)
    assert row["details"]["task_id"] is None
    assert "overlap policy skipped it" in row["summary"]

    await complete(harness.dsn, acme, "etl")  # the run it waited for, or a trigger, finished
    assert resolved(await harness.check()) == [key]


async def test_a_schedule_nobody_materialised_alerts(harness: Harness) -> None:
    acme = await tenant_row(harness.dsn, "acme")
    # Every scheduler node is dead: next_at is long past and no occurrence was created
    # for it; the occurrence before it ran fine, which must not hide the missed one.
    sid = await new_schedule(harness.dsn, acme, "compliance", next_in_s=-(SLACK_S + 5))
    done = await occurrence(harness.dsn, sid, acme, ago_s=SLACK_S + 3600)
    await complete(harness.dsn, acme, "compliance", task_id=done, ago_s=SLACK_S + 3500)
    # A schedule whose next_at passed recently is still within its slack.
    recent = await new_schedule(harness.dsn, acme, "recent", next_in_s=-(SLACK_S - 30))
    # An ended schedule (next_at NULL) with nothing past its deadline: nothing to watch.
    ended = await new_schedule(harness.dsn, acme, "ended", next_in_s=None)

    actions = await harness.check()

    assert opened(actions) == [schedule_dedup_key(sid)]
    [row] = await harness.alert_rows(schedule_dedup_key(sid))
    assert row["details"]["occurrence_created"] is False
    assert "no scheduler node created it" in row["summary"]
    [(next_at,)] = await sql(harness.dsn, "SELECT next_at FROM schedules WHERE id = %s", (sid,))
    assert row["details"]["logical_date"] == next_at.isoformat()
    assert await harness.alert_rows(schedule_dedup_key(recent)) == []
    assert await harness.alert_rows(schedule_dedup_key(ended)) == []
    assert harness.stats.schedules == 3

    # The scheduler comes back and runs a catch-up of the missed occurrence.
    await sql(
        harness.dsn,
        "UPDATE schedules SET next_at = now() + interval '1 hour' WHERE id = %s",
        (sid,),
    )
    await sql(
        harness.dsn,
        "INSERT INTO schedule_occurrences (schedule_id, logical_date, tenant_id, origin)"
        " VALUES (%s, %s, %s, 'CATCHUP')",
        (sid, next_at, acme),
    )
    assert await harness.check() == []  # still missed: the catch-up has not completed
    await complete(harness.dsn, acme, "compliance")
    assert resolved(await harness.check()) == [schedule_dedup_key(sid)]


async def test_paused_and_unwatched_schedules_are_not_alerted_on(harness: Harness) -> None:
    acme = await tenant_row(harness.dsn)
    paused = await new_schedule(harness.dsn, acme, "paused", paused=True, next_in_s=-1000)
    unwatched = await new_schedule(harness.dsn, acme, "unwatched", watch=False, next_in_s=-1000)
    for sid in (paused, unwatched):
        await occurrence(harness.dsn, sid, acme, ago_s=SLACK_S + 100)

    assert await harness.check() == []
    assert harness.stats.schedules == 0
    assert await harness.alert_rows(schedule_dedup_key(paused)) == []


async def test_pausing_unwatching_or_deleting_a_schedule_resolves_its_alert(
    harness: Harness,
) -> None:
    acme = await tenant_row(harness.dsn)
    ids = {}
    for name in ("to-pause", "to-unwatch", "to-delete", "still-missing"):
        ids[name] = await new_schedule(harness.dsn, acme, name)
        await occurrence(harness.dsn, ids[name], acme, ago_s=SLACK_S + 100)
    assert sorted(opened(await harness.check())) == sorted(
        schedule_dedup_key(s) for s in ids.values()
    )

    await sql(harness.dsn, "UPDATE schedules SET paused = true WHERE id = %s", (ids["to-pause"],))
    await sql(harness.dsn, "UPDATE schedules SET watch = false WHERE id = %s", (ids["to-unwatch"],))
    await sql(harness.dsn, "DELETE FROM schedules WHERE id = %s", (ids["to-delete"],))
    gone = [ids["to-pause"], ids["to-unwatch"], ids["to-delete"]]
    assert sorted(resolved(await harness.check())) == sorted(schedule_dedup_key(s) for s in gone)
    for sid in gone:
        [row] = await harness.alert_rows(schedule_dedup_key(sid))
        assert row["details"]["resolution"] == "the schedule was paused, unwatched or deleted"
        assert harness.sink.events(schedule_dedup_key(sid)) == [Event.TRIGGER, Event.RESOLVE]
    [row] = await harness.alert_rows(schedule_dedup_key(ids["still-missing"]))
    assert row["resolved_at"] is None
    assert await harness.check() == []


async def test_expectations_are_checked_as_before_beside_schedules(harness: Harness) -> None:
    acme = await tenant_row(harness.dsn)
    await sql(
        harness.dsn,
        "INSERT INTO expectations (tenant_id, job_id, interval_s, tolerance_s, created_at)"
        " VALUES (%s, 'legacy', 60, 0, now() - interval '1 hour')",
        (acme,),
    )
    sid = await new_schedule(harness.dsn, acme, "on-time")
    task = await occurrence(harness.dsn, sid, acme, ago_s=SLACK_S + 10)
    await complete(harness.dsn, acme, "on-time", task_id=task)

    actions = await harness.check()

    assert opened(actions, Kind.JOB_OVERDUE) == [f"chronoshard/job/{acme}/legacy"]
    assert opened(actions) == []
    assert harness.stats.expectations == 1 and harness.stats.overdue == 1
    assert harness.stats.schedules == 1 and harness.stats.missed_schedules == 0


async def test_schedule_statuses_page_through_every_watched_schedule(harness: Harness) -> None:
    acme = await tenant_row(harness.dsn)
    watched = {await new_schedule(harness.dsn, acme, f"s{i}") for i in range(5)}
    await new_schedule(harness.dsn, acme, "paused", paused=True)

    statuses = await harness.store.schedule_statuses(batch_size=2)

    assert [s.schedule.id for s in statuses] == sorted(watched)


async def test_each_schedule_costs_index_probes_not_scans(fresh_db_dsn: str) -> None:
    """2,000 schedules with 100 occurrences each and a ledger of 200,000 completions:
    the plan probes the occurrences' primary key and the ledger's indexes per schedule
    (the same plan holds at 10,000 schedules and 1M occurrences, docs/watchdog.md)."""
    acme = await tenant_row(fresh_db_dsn)
    await sql(
        fresh_db_dsn,
        "INSERT INTO schedules (id, tenant_id, name, shard, interval_s, timezone, anchor_at,"
        " task_template, catchup_policy, catchup_limit, misfire_grace_s, overlap_policy,"
        " job_id, expected_duration_s, tolerance_s, cursor_at, next_at)"
        " SELECT gen_random_uuid(), %s, 's' || i, 0, 60, 'UTC', now(), '\\x'::bytea, 'SKIP',"
        " 1, 60, 'ALLOW', 'job-' || i, 60, 30, now(), now() + interval '1 minute'"
        " FROM generate_series(1, 2000) AS i",
        (acme,),
    )
    await sql(
        fresh_db_dsn,
        "INSERT INTO schedule_occurrences (schedule_id, logical_date, tenant_id, origin,"
        " task_id, task_scheduled_at)"
        " SELECT s.id, now() - make_interval(mins => k), s.tenant_id, 'SCHEDULE',"
        " gen_random_uuid(), now() - make_interval(mins => k)"
        " FROM schedules s CROSS JOIN generate_series(1, 100) AS k",
    )
    await sql(
        fresh_db_dsn,
        "INSERT INTO task_completions (job_id, task_id, tenant_id, completed_at)"
        " SELECT s.job_id, o.task_id, o.tenant_id, o.logical_date + interval '10 seconds'"
        " FROM schedule_occurrences o JOIN schedules s ON s.id = o.schedule_id",
    )
    await sql(fresh_db_dsn, "ANALYZE schedules")
    await sql(fresh_db_dsn, "ANALYZE schedule_occurrences")
    await sql(fresh_db_dsn, "ANALYZE task_completions")

    explain: LiteralString = "EXPLAIN " + SCHEDULE_STATUSES
    params = {"after": uuid.UUID(int=0), "limit": 500}
    plan = "\n".join(r[0] for r in await sql(fresh_db_dsn, explain, params))

    assert "Index Scan Backward using schedule_occurrences_pkey" in plan, plan
    assert "task_completions_task_id_key" in plan, plan
    assert "task_completions_tenant_job_idx" in plan, plan
    assert "Seq Scan on schedule_occurrences" not in plan, plan
    assert "Seq Scan on task_completions" not in plan, plan

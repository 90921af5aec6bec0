"""The watchdog's SQL, issued on the leader's own database session.

Every statement the active replica makes runs on the connection that holds its leader
lock (see :mod:`.election`), never on a pool: if that session dies, the lock is gone and
so is every way this replica had to write, so a deposed leader cannot record or resolve
an alert after its successor took over. The statements are few and small (one per batch
of expectations per check interval), which one connection serves easily.

The queries read the scheduler's tables with plain SQL (``task_completions``,
``task_attempts``, ``tenants``, ``schedules``, ``schedule_occurrences``) and write the
watchdog's own (``alerts``, ``canary_executions``, and the ``expectations`` that come
from its config file). The newest completion of each expectation is one LATERAL probe
into the ``(tenant_id, job_id, completed_at DESC)`` index: no scan of the ledger, however
long it grows; a schedule's newest occurrence past its deadline is one backward probe of
the occurrences' primary key. Times come from the database's clock (``now()``), the
clock that stamped the completions.

Every call has a deadline; a lost connection or a missed deadline is
:class:`~.errors.DatabaseUnavailable`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from chronoshard.watchdog.config import ExpectationConfig
from chronoshard.watchdog.errors import DatabaseUnavailable
from chronoshard.watchdog.incidents import (
    AlertRecord,
    CanaryRun,
    CanaryStatus,
    Condition,
    Event,
    Expectation,
    Occurrence,
    Schedule,
    Severity,
)
from chronoshard.watchdog.sinks import json_ready

Connection = psycopg.AsyncConnection[Any]
_NIL_TENANT = uuid.UUID(int=0)

# --- the queries --------------------------------------------------------------------------------

JOB_STATUSES: LiteralString = """
SELECT now() AS db_now, e.tenant_id, t.name AS tenant_name, e.job_id, e.interval_s,
       e.tolerance_s, e.severity, e.description, e.created_at, last.completed_at
FROM expectations e
JOIN tenants t ON t.id = e.tenant_id
LEFT JOIN LATERAL (
    SELECT c.completed_at
    FROM task_completions c
    WHERE c.tenant_id = e.tenant_id AND c.job_id = e.job_id
    ORDER BY c.completed_at DESC
    LIMIT 1
) last ON true
WHERE e.enabled AND (e.tenant_id, e.job_id) > (%(after_tenant)s, %(after_job)s)
ORDER BY e.tenant_id, e.job_id
LIMIT %(limit)s
"""

# Every watched schedule with what decides whether it missed an occurrence, one query per
# batch and three index probes per schedule, however long the histories grow:
# - the newest created occurrence past its deadline: a backward probe of the
#   (schedule_id, logical_date) primary key of schedule_occurrences;
# - that occurrence's own completion (its task's, or its workflow run's): the unique
#   task_id index of the ledger;
# - the newest completion of the schedule's (tenant_id, job_id): the same probe as
#   JOB_STATUSES.
# next_at (the first occurrence not created) is a column of the row itself. The
# deadline test is here with now() as well as in incidents.due_occurrence, which gets
# db_now, the same instant: now() is fixed for the statement.
SCHEDULE_STATUSES: LiteralString = """
SELECT now() AS db_now, s.id, s.tenant_id, t.name AS tenant_name, s.name, s.job_id,
       s.expected_duration_s, s.tolerance_s, s.severity, s.next_at,
       occ.logical_date, occ.task_id, own.completed_at AS own_completed_at,
       last.completed_at AS last_completed_at
FROM schedules s
JOIN tenants t ON t.id = s.tenant_id
LEFT JOIN LATERAL (
    -- A workflow schedule's occurrence is its run: a run that succeeded is in the ledger
    -- under its own id.
    SELECT o.logical_date, COALESCE(o.task_id, o.workflow_id) AS task_id
    FROM schedule_occurrences o
    WHERE o.schedule_id = s.id
      AND o.logical_date
          <= now() - make_interval(secs => s.expected_duration_s + s.tolerance_s)
    ORDER BY o.logical_date DESC
    LIMIT 1
) occ ON true
LEFT JOIN LATERAL (
    SELECT c.completed_at
    FROM task_completions c
    WHERE c.task_id = occ.task_id
) own ON true
LEFT JOIN LATERAL (
    SELECT c.completed_at
    FROM task_completions c
    WHERE c.tenant_id = s.tenant_id AND c.job_id = s.job_id
    ORDER BY c.completed_at DESC
    LIMIT 1
) last ON true
WHERE s.watch AND NOT s.paused AND s.id > %(after)s
ORDER BY s.id
LIMIT %(limit)s
"""

_ALERT_COLUMNS: LiteralString = """id, kind, dedup_key, tenant_id, job_id, severity, summary,
    details, opened_at, resolved_at, last_notified_at, resolve_notified_at, notifications"""

# Open alerts of the given kinds, and resolved ones whose resolve is still owed (within a
# horizon: a resolve owed for days is not worth sending any more).
ALERTS_TO_PLAN: LiteralString = (
    "SELECT "
    + _ALERT_COLUMNS
    + """
FROM alerts
WHERE kind = ANY(%(kinds)s)
  AND (resolved_at IS NULL
       OR (resolve_notified_at IS NULL
           AND resolved_at > now() - make_interval(secs => %(horizon_s)s)))
"""
)

# At most one open alert per dedup key (the partial unique index): a concurrent or
# repeated open changes nothing and returns no row.
OPEN_ALERT: LiteralString = (
    """
INSERT INTO alerts (kind, dedup_key, tenant_id, job_id, severity, summary, details)
VALUES (%(kind)s, %(dedup_key)s, %(tenant_id)s, %(job_id)s, %(severity)s, %(summary)s,
        %(details)s)
ON CONFLICT (dedup_key) WHERE resolved_at IS NULL DO NOTHING
RETURNING """
    + _ALERT_COLUMNS
)

RESOLVE_ALERT: LiteralString = (
    """
UPDATE alerts
SET resolved_at = greatest(now(), opened_at),
    details = details || jsonb_build_object('resolution', %(resolution)s::text)
WHERE id = %(id)s AND resolved_at IS NULL
RETURNING """
    + _ALERT_COLUMNS
)

MARK_NOTIFIED: LiteralString = """
UPDATE alerts
SET last_notified_at = now(), notifications = notifications + 1
WHERE id = %(id)s AND resolved_at IS NULL
"""

MARK_RESOLVE_NOTIFIED: LiteralString = """
UPDATE alerts
SET resolve_notified_at = now(), notifications = notifications + 1
WHERE id = %(id)s AND resolved_at IS NOT NULL
"""

TENANTS_BY_NAME: LiteralString = "SELECT name, id FROM tenants WHERE name = ANY(%(names)s)"

# Config expectations keep their registration time; an unchanged one is not rewritten.
UPSERT_CONFIG_EXPECTATION: LiteralString = """
INSERT INTO expectations AS e
    (tenant_id, job_id, interval_s, tolerance_s, severity, enabled, description, source)
VALUES (%(tenant_id)s, %(job_id)s, %(interval_s)s, %(tolerance_s)s, %(severity)s,
        %(enabled)s, %(description)s, 'config')
ON CONFLICT (tenant_id, job_id) DO UPDATE
SET interval_s = EXCLUDED.interval_s,
    tolerance_s = EXCLUDED.tolerance_s,
    severity = EXCLUDED.severity,
    enabled = EXCLUDED.enabled,
    description = EXCLUDED.description,
    source = 'config',
    updated_at = now()
WHERE (e.interval_s, e.tolerance_s, e.severity, e.enabled, e.description, e.source)
      IS DISTINCT FROM (EXCLUDED.interval_s, EXCLUDED.tolerance_s, EXCLUDED.severity,
                        EXCLUDED.enabled, EXCLUDED.description, 'config')
"""

DELETE_STALE_CONFIG_EXPECTATIONS: LiteralString = """
DELETE FROM expectations
WHERE source = 'config'
  AND (tenant_id, job_id) NOT IN (
      SELECT * FROM unnest(%(tenant_ids)s::uuid[], %(job_ids)s::text[]))
RETURNING tenant_id, job_id
"""

INSERT_CANARY: LiteralString = """
INSERT INTO canary_executions (id, scheduled_time, status)
VALUES (%(id)s, now(), 'SUBMITTED')
RETURNING scheduled_time
"""

SET_CANARY_TASK: LiteralString = (
    "UPDATE canary_executions SET task_id = %(task_id)s WHERE id = %(id)s"
)

SET_CANARY_FAILED: LiteralString = """
UPDATE canary_executions SET status = 'FAILED', error = %(error)s
WHERE id = %(id)s AND completed_time IS NULL
"""

# Recent canaries with what the scheduler's tables know of them: the first dispatch (the
# intent write) and the completion (the ledger row of its task).
RECENT_CANARIES: LiteralString = """
SELECT now() AS db_now, ce.id, ce.task_id, ce.scheduled_time, ce.status,
       coalesce(ce.dispatched_time, dispatch.first_dispatch) AS dispatched_time,
       coalesce(ce.completed_time, done.completed_at) AS completed_time,
       ce.dispatched_time AS stored_dispatched, ce.completed_time AS stored_completed
FROM canary_executions ce
LEFT JOIN LATERAL (
    SELECT min(a.entered_at) AS first_dispatch
    FROM task_attempts a
    WHERE a.task_id = ce.task_id AND ce.dispatched_time IS NULL
) dispatch ON true
LEFT JOIN LATERAL (
    SELECT c.completed_at
    FROM task_completions c
    WHERE c.task_id = ce.task_id AND ce.completed_time IS NULL
) done ON true
WHERE ce.scheduled_time > now() - make_interval(secs => %(horizon_s)s)
ORDER BY ce.scheduled_time DESC
LIMIT %(limit)s
"""

UPDATE_CANARY: LiteralString = """
UPDATE canary_executions
SET status = %(status)s, dispatched_time = %(dispatched)s, completed_time = %(completed)s
WHERE id = %(id)s
"""


# --- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobStatus:
    expectation: Expectation
    last_completed_at: datetime | None


@dataclass(frozen=True)
class ScheduleStatus:
    """A watched schedule as one check read it, at ``checked_at`` (the database's now()
    of the statement that read it, which its deadline probe used)."""

    schedule: Schedule
    next_at: datetime | None
    # The newest created occurrence whose deadline had passed, with its own completion.
    occurrence: Occurrence | None
    last_completed_at: datetime | None
    checked_at: datetime


@dataclass(frozen=True)
class ConfigSync:
    written: int
    removed: int
    unknown_tenants: tuple[str, ...]


@dataclass(frozen=True)
class StoredCanary:
    """A canary as read: ``run`` with everything now known, and what its row says."""

    run: CanaryRun
    status: CanaryStatus
    stored_dispatched_at: datetime | None
    stored_completed_at: datetime | None


@dataclass(frozen=True)
class CanaryUpdate:
    id: uuid.UUID
    status: CanaryStatus
    dispatched_at: datetime | None
    completed_at: datetime | None


def alert_from_row(row: Mapping[str, Any]) -> AlertRecord:
    return AlertRecord(
        id=row["id"],
        kind=row["kind"],
        dedup_key=row["dedup_key"],
        severity=Severity(row["severity"]),
        summary=row["summary"],
        opened_at=row["opened_at"],
        tenant_id=row["tenant_id"],
        job_id=row["job_id"],
        details=row["details"] or {},
        resolved_at=row["resolved_at"],
        last_notified_at=row["last_notified_at"],
        resolve_notified_at=row["resolve_notified_at"],
        notifications=row["notifications"],
    )


class WatchdogStore:
    """The watchdog's statements on one session. ``on_contact`` is called after every
    statement that reached the database (it feeds the outage detector)."""

    def __init__(
        self,
        conn: Connection,
        *,
        timeout_s: float,
        on_contact: Callable[[], None] = lambda: None,
    ) -> None:
        self._conn = conn
        self._timeout_s = timeout_s
        self._on_contact = on_contact

    async def _rows(
        self, query: LiteralString, params: Mapping[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(query, params)
                    rows = await cur.fetchall() if cur.description else []
        except TimeoutError as exc:
            raise DatabaseUnavailable(f"no answer within {self._timeout_s:g} s") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise DatabaseUnavailable(str(exc) or type(exc).__name__) from exc
        self._on_contact()
        return rows

    async def _many(self, query: LiteralString, params: Sequence[Mapping[str, Any]]) -> None:
        if not params:
            return
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._conn.cursor() as cur:
                    await cur.executemany(query, params)
        except TimeoutError as exc:
            raise DatabaseUnavailable(f"no answer within {self._timeout_s:g} s") from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise DatabaseUnavailable(str(exc) or type(exc).__name__) from exc
        self._on_contact()

    async def ping(self) -> None:
        await self._rows("SELECT 1")

    # --- expectations --------------------------------------------------------------------------

    async def sync_config(self, expectations: Sequence[ExpectationConfig]) -> ConfigSync:
        """Make the ``source = 'config'`` expectations exactly the config file's.

        An expectation naming a tenant that does not exist is skipped and reported."""
        names = sorted({e.tenant for e in expectations})
        rows = await self._rows(TENANTS_BY_NAME, {"names": names}) if names else []
        tenant_ids = {r["name"]: r["id"] for r in rows}
        unknown = tuple(n for n in names if n not in tenant_ids)
        params = [
            {
                "tenant_id": tenant_ids[e.tenant],
                "job_id": e.job_id,
                "interval_s": e.interval_s,
                "tolerance_s": e.tolerance_s,
                "severity": e.severity,
                "enabled": e.enabled,
                "description": e.description,
            }
            for e in expectations
            if e.tenant in tenant_ids
        ]
        await self._many(UPSERT_CONFIG_EXPECTATION, params)
        removed = await self._rows(
            DELETE_STALE_CONFIG_EXPECTATIONS,
            {
                "tenant_ids": [p["tenant_id"] for p in params],
                "job_ids": [p["job_id"] for p in params],
            },
        )
        return ConfigSync(written=len(params), removed=len(removed), unknown_tenants=unknown)

    async def job_statuses(self, batch_size: int) -> tuple[datetime | None, list[JobStatus]]:
        """Every enabled expectation with its newest completion, one query per batch of
        ``batch_size``; and the database's time at the first batch (None if there are
        no expectations)."""
        statuses: list[JobStatus] = []
        db_now: datetime | None = None
        after: tuple[uuid.UUID, str] = (_NIL_TENANT, "")
        while True:
            rows = await self._rows(
                JOB_STATUSES,
                {"after_tenant": after[0], "after_job": after[1], "limit": batch_size},
            )
            for row in rows:
                if db_now is None:
                    db_now = row["db_now"]
                expectation = Expectation(
                    tenant_id=row["tenant_id"],
                    job_id=row["job_id"],
                    interval_s=row["interval_s"],
                    tolerance_s=row["tolerance_s"],
                    registered_at=row["created_at"],
                    severity=Severity(row["severity"]),
                    description=row["description"],
                    tenant_name=row["tenant_name"],
                )
                statuses.append(JobStatus(expectation, row["completed_at"]))
            if len(rows) < batch_size:
                return db_now, statuses
            after = (rows[-1]["tenant_id"], rows[-1]["job_id"])

    async def schedule_statuses(self, batch_size: int) -> list[ScheduleStatus]:
        """Every schedule with ``watch AND NOT paused``, its next_at, its newest created
        occurrence past the deadline and the completions that could satisfy it; one
        query per batch of ``batch_size``, paged by id."""
        statuses: list[ScheduleStatus] = []
        after = uuid.UUID(int=0)  # below every id
        while True:
            rows = await self._rows(SCHEDULE_STATUSES, {"after": after, "limit": batch_size})
            for row in rows:
                schedule = Schedule(
                    id=row["id"],
                    tenant_id=row["tenant_id"],
                    name=row["name"],
                    job_id=row["job_id"],
                    expected_duration_s=row["expected_duration_s"],
                    tolerance_s=row["tolerance_s"],
                    severity=Severity(row["severity"]),
                    tenant_name=row["tenant_name"],
                )
                occurrence = (
                    None
                    if row["logical_date"] is None
                    else Occurrence(
                        logical_date=row["logical_date"],
                        task_id=row["task_id"],
                        completed_at=row["own_completed_at"],
                    )
                )
                statuses.append(
                    ScheduleStatus(
                        schedule=schedule,
                        next_at=row["next_at"],
                        occurrence=occurrence,
                        last_completed_at=row["last_completed_at"],
                        checked_at=row["db_now"],
                    )
                )
            if len(rows) < batch_size:
                return statuses
            after = rows[-1]["id"]

    async def now(self) -> datetime:
        [row] = await self._rows("SELECT now() AS db_now")
        value: datetime = row["db_now"]
        return value

    # --- alerts --------------------------------------------------------------------------------

    async def alerts_to_plan(
        self, kinds: Sequence[str], resolve_horizon_s: float
    ) -> list[AlertRecord]:
        rows = await self._rows(
            ALERTS_TO_PLAN, {"kinds": list(kinds), "horizon_s": resolve_horizon_s}
        )
        return [alert_from_row(r) for r in rows]

    async def open_alert(self, condition: Condition) -> AlertRecord | None:
        """Record a new alert; None if one is already open for the key."""
        rows = await self._rows(
            OPEN_ALERT,
            {
                "kind": str(condition.kind),
                "dedup_key": condition.dedup_key,
                "tenant_id": condition.tenant_id,
                "job_id": condition.job_id,
                "severity": str(condition.severity),
                "summary": condition.summary,
                "details": Jsonb(json_ready(condition.details)),
            },
        )
        return alert_from_row(rows[0]) if rows else None

    async def resolve_alert(self, alert_id: int, resolution: str) -> AlertRecord | None:
        """Record the end of an open alert; None if it was already resolved."""
        rows = await self._rows(RESOLVE_ALERT, {"id": alert_id, "resolution": resolution})
        return alert_from_row(rows[0]) if rows else None

    async def mark_notified(self, alert_id: int, event: Event) -> None:
        query = MARK_RESOLVE_NOTIFIED if event is Event.RESOLVE else MARK_NOTIFIED
        await self._rows(query, {"id": alert_id})

    # --- canaries ------------------------------------------------------------------------------

    async def insert_canary(self, canary_id: uuid.UUID) -> datetime:
        """Record a canary about to be submitted; its scheduled time (database clock)."""
        [row] = await self._rows(INSERT_CANARY, {"id": canary_id})
        scheduled: datetime = row["scheduled_time"]
        return scheduled

    async def set_canary_task(self, canary_id: uuid.UUID, task_id: uuid.UUID) -> None:
        await self._rows(SET_CANARY_TASK, {"id": canary_id, "task_id": task_id})

    async def set_canary_failed(self, canary_id: uuid.UUID, error: str) -> None:
        await self._rows(SET_CANARY_FAILED, {"id": canary_id, "error": error[:1000]})

    async def recent_canaries(
        self, horizon_s: float, limit: int
    ) -> tuple[datetime | None, list[StoredCanary]]:
        rows = await self._rows(RECENT_CANARIES, {"horizon_s": horizon_s, "limit": limit})
        canaries = [
            StoredCanary(
                run=CanaryRun(
                    id=r["id"],
                    scheduled_at=r["scheduled_time"],
                    dispatched_at=r["dispatched_time"],
                    completed_at=r["completed_time"],
                    submit_failed=r["status"] == CanaryStatus.FAILED,
                ),
                status=CanaryStatus(r["status"]),
                stored_dispatched_at=r["stored_dispatched"],
                stored_completed_at=r["stored_completed"],
            )
            for r in rows
        ]
        db_now = rows[0]["db_now"] if rows else None
        return db_now, canaries

    async def update_canaries(self, updates: Sequence[CanaryUpdate]) -> None:
        await self._many(
            UPDATE_CANARY,
            [
                {
                    "id": u.id,
                    "status": str(u.status),
                    "dispatched": u.dispatched_at,
                    "completed": u.completed_at,
                }
                for u in updates
            ],
        )

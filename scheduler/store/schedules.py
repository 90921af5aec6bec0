"""The schedules table and its occurrences: :class:`ScheduleStore`.

Two owners use it. The ScheduleService (``api/schedules.py``) creates, reads and changes
schedules; a change that must take effect from the next occurrence (update, pause,
delete) withdraws, in the same transaction, the occurrences created ahead that have not
started. The materialiser (``cluster/materialiser.py``) takes the due schedules of the
shards it owns, under the shard fence, and writes each one's :class:`~.core.schedules.Step`:
its occurrences (keyed ``(schedule_id, logical_date)``: an existing one is left alone
and its task not inserted), their tasks through the submit path's one insert
statement (:meth:`.submits.SubmitStore.insert_in`), and the schedule's new instants, all
in one transaction. A pass whose commit outcome is lost is simply run again: the key
makes a second write of an occurrence a no-op, and the row lock orders the retry after
the lost transaction ended.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from chronoshard.scheduler.core.models import PreparedTask, Task, TaskRef
from chronoshard.scheduler.core.recurrence import Catchup
from chronoshard.scheduler.core.schedules import Origin, Overlap, Schedule, ScheduleSpec
from chronoshard.scheduler.core.states import TaskStatus
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection, Store
from chronoshard.scheduler.store.submits import SubmitStore

WITHDRAWN_REASON = "withdrawn: the schedule changed before this occurrence started"


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """One occurrence with its task as it is now (``task_id`` None: skipped)."""

    logical_date: datetime
    origin: Origin
    task_id: uuid.UUID | None
    status: TaskStatus | None
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class DueSchedule:
    schedule: Schedule
    previous_running: bool


@dataclass(frozen=True, slots=True)
class Written:
    """One schedule's step as the materialiser hands it to :meth:`ScheduleStore.advance`.

    ``occurrences`` pairs each decided occurrence with its task (None: skipped)."""

    schedule_id: uuid.UUID
    tenant_id: uuid.UUID
    occurrences: Sequence[tuple[datetime, Origin, PreparedTask | None]]
    cursor_at: datetime
    next_at: datetime | None
    materialise_at: datetime | None
    buffered_at: datetime | None


def schedule_from_row(row: Mapping[str, Any]) -> Schedule:
    spec = ScheduleSpec(
        name=row["name"],
        cron=row["cron"],
        interval_s=row["interval_s"],
        timezone=row["timezone"],
        start_at=row["start_at"],
        end_at=row["end_at"],
        template=bytes(row["task_template"]),
        catchup=Catchup(row["catchup_policy"]),
        catchup_limit=row["catchup_limit"],
        misfire_grace_s=row["misfire_grace_s"],
        overlap=Overlap(row["overlap_policy"]),
        job_id=row["job_id"],
        watch=row["watch"],
        expected_duration_s=row["expected_duration_s"],
        tolerance_s=row["tolerance_s"],
        severity=row["severity"],
    )
    last = (
        None
        if row["last_task_id"] is None
        else TaskRef(row["last_task_scheduled_at"], row["last_task_id"])
    )
    return Schedule(
        id=row["id"],
        tenant_id=row["tenant_id"],
        shard=row["shard"],
        spec=spec,
        anchor_at=row["anchor_at"],
        paused=row["paused"],
        cursor_at=row["cursor_at"],
        next_at=row["next_at"],
        materialise_at=row["materialise_at"],
        buffered_at=row["buffered_at"],
        last_task=last,
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _spec_params(spec: ScheduleSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "cron": spec.cron,
        "interval_s": spec.interval_s,
        "timezone": spec.timezone,
        "start_at": spec.start_at,
        "end_at": spec.end_at,
        "task_template": spec.template,
        "catchup_policy": str(spec.catchup),
        "catchup_limit": spec.catchup_limit,
        "misfire_grace_s": spec.misfire_grace_s,
        "overlap_policy": str(spec.overlap),
        "job_id": spec.job_id,
        "watch": spec.watch,
        "expected_duration_s": spec.expected_duration_s,
        "tolerance_s": spec.tolerance_s,
        "severity": spec.severity,
    }


def _key(name_or_id: str) -> dict[str, Any]:
    """Parameters matching a schedule by id (when the text is a UUID) or by name."""
    try:
        as_id: uuid.UUID | None = uuid.UUID(name_or_id)
    except ValueError:
        as_id = None
    return {"id": as_id, "name": name_or_id}


class ScheduleStore:
    """The statements of ``sql/schedules.sql`` over ``store``'s pool (module docstring)."""

    def __init__(self, store: Store, submits: SubmitStore) -> None:
        self._store = store
        self._submits = submits
        self._q = queries.load("schedules.sql")

    # --- the ScheduleService ----------------------------------------------------------

    async def insert(self, params: Mapping[str, Any], spec: ScheduleSpec) -> Schedule | None:
        """Insert a schedule; None when the tenant already has one of that name."""
        async with self._store.transaction() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["insert_schedule"], {**params, **_spec_params(spec)})
            row = await cur.fetchone()
        return None if row is None else schedule_from_row(row)

    async def get(self, tenant_id: uuid.UUID, name_or_id: str) -> Schedule | None:
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["get_schedule"], {"tenant_id": tenant_id, **_key(name_or_id)})
            row = await cur.fetchone()
        return None if row is None else schedule_from_row(row)

    async def page(self, tenant_id: uuid.UUID, after: str | None, limit: int) -> list[Schedule]:
        async with self._store.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["list_schedules"], {"tenant_id": tenant_id, "after": after, "limit": limit}
            )
            return [schedule_from_row(r) for r in await cur.fetchall()]

    async def runs(self, schedule_id: uuid.UUID, limit: int) -> list[ScheduleRun]:
        async with self._store.connection() as conn:
            cur = await conn.execute(self._q["runs"], {"schedule_id": schedule_id, "limit": limit})
            return [
                ScheduleRun(
                    logical_date=at,
                    origin=Origin(origin),
                    task_id=task_id,
                    status=None if status is None else TaskStatus(status),
                    finished_at=finished_at,
                )
                for at, origin, task_id, status, finished_at in await cur.fetchall()
            ]

    async def lock(
        self, conn: Connection, tenant_id: uuid.UUID, name_or_id: str
    ) -> Schedule | None:
        """The schedule, locked ``FOR UPDATE`` in ``conn``'s transaction (the materialiser
        then passes it by: SKIP LOCKED)."""
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(self._q["lock_schedule"], {"tenant_id": tenant_id, **_key(name_or_id)})
        row = await cur.fetchone()
        return None if row is None else schedule_from_row(row)

    async def withdraw_ahead(
        self, conn: Connection, schedule_id: uuid.UUID, after: datetime
    ) -> tuple[list[tuple[uuid.UUID, int]], datetime | None]:
        """Withdraw the occurrences after ``after`` that have not started; the tasks
        withdrawn ``(id, shard)`` and the newest occurrence left."""
        cur = await conn.execute(
            self._q["withdraw_ahead"],
            {"schedule_id": schedule_id, "after": after, "reason": WITHDRAWN_REASON},
        )
        withdrawn = [(task_id, shard) for task_id, shard in await cur.fetchall()]
        cur = await conn.execute(self._q["newest_occurrence"], {"schedule_id": schedule_id})
        row = await cur.fetchone()
        return withdrawn, None if row is None else row[0]

    async def update_spec(
        self,
        conn: Connection,
        schedule_id: uuid.UUID,
        spec: ScheduleSpec,
        params: Mapping[str, Any],
    ) -> Schedule | None:
        """Replace the spec; None when the new name is taken by another schedule."""
        cur = conn.cursor(row_factory=dict_row)
        try:
            async with conn.transaction():  # a savepoint: a taken name leaves the rest
                await cur.execute(
                    self._q["update_spec"], {"id": schedule_id, **params, **_spec_params(spec)}
                )
        except psycopg.errors.UniqueViolation:
            return None  # UNIQUE (tenant_id, name): another schedule has the new name
        row = await cur.fetchone()
        assert row is not None
        return schedule_from_row(row)

    async def set_paused(
        self, conn: Connection, schedule_id: uuid.UUID, params: Mapping[str, Any]
    ) -> Schedule:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(self._q["set_paused"], {"id": schedule_id, **params})
        row = await cur.fetchone()
        assert row is not None
        return schedule_from_row(row)

    async def delete(self, conn: Connection, schedule_id: uuid.UUID) -> None:
        await conn.execute(self._q["delete_schedule"], {"id": schedule_id})

    async def insert_runs(
        self,
        conn: Connection,
        tenant_id: uuid.UUID,
        schedule_id: uuid.UUID,
        runs: Sequence[tuple[datetime, Origin, PreparedTask]],
    ) -> list[Task]:
        """Occurrences created outside the materialiser (trigger, backfill): those whose
        logical date has no occurrence yet, with their tasks. The tasks inserted."""
        written = Written(schedule_id, tenant_id, runs, runs[0][0], None, None, None)
        return await self._write_occurrences(conn, [written])

    # --- the materialiser -------------------------------------------------------------

    async def due(
        self, conn: Connection, epochs: Mapping[int, int], now: datetime, limit: int
    ) -> tuple[list[DueSchedule], set[int]]:
        """In ``conn``'s transaction: the fence on ``epochs``' shards, then their
        schedules due for a look at ``now``, locked. Also the shards whose epoch is no
        longer ours (lost: nothing of theirs is read)."""
        owned = await self._store.owned_shards(conn, epochs)
        lost = set(epochs) - owned
        if not owned:
            return [], lost
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            self._q["due_schedules"], {"shards": sorted(owned), "now": now, "limit": limit}
        )
        due = [
            DueSchedule(schedule_from_row(row), bool(row["previous_running"]))
            for row in await cur.fetchall()
        ]
        return due, lost

    async def advance(self, conn: Connection, steps: Sequence[Written]) -> list[Task]:
        """Write the steps of the schedules :meth:`due` returned: occurrences, tasks, and
        each schedule's new instants. The tasks inserted."""
        tasks = await self._write_occurrences(conn, steps)
        # The newest task each schedule inserted: what the overlap policy asks about next.
        last: dict[uuid.UUID, TaskRef] = {}
        for task in tasks:
            assert task.schedule_id is not None
            previous = last.get(task.schedule_id)
            if previous is None or task.scheduled_at >= previous.scheduled_at:
                last[task.schedule_id] = task.ref
        await conn.execute(
            self._q["advance_schedules"],
            {
                "ids": [s.schedule_id for s in steps],
                "cursor_ats": [s.cursor_at for s in steps],
                "next_ats": [s.next_at for s in steps],
                "materialise_ats": [s.materialise_at for s in steps],
                "buffered_ats": [s.buffered_at for s in steps],
                "last_task_ids": [
                    last[s.schedule_id].id if s.schedule_id in last else None for s in steps
                ],
                "last_task_scheduled_ats": [
                    last[s.schedule_id].scheduled_at if s.schedule_id in last else None
                    for s in steps
                ],
            },
        )
        return tasks

    async def _write_occurrences(self, conn: Connection, steps: Sequence[Written]) -> list[Task]:
        rows = [
            (step.schedule_id, at, step.tenant_id, origin, prepared)
            for step in steps
            for at, origin, prepared in step.occurrences
        ]
        if not rows:
            return []
        cur = await conn.execute(
            self._q["insert_occurrences"],
            {
                "schedule_ids": [r[0] for r in rows],
                "logical_dates": [r[1] for r in rows],
                "tenant_ids": [r[2] for r in rows],
                "origins": [str(r[3]) for r in rows],
                "task_ids": [None if r[4] is None else r[4].new.id for r in rows],
                "task_scheduled_ats": [
                    None if r[4] is None else r[4].new.scheduled_at for r in rows
                ],
            },
        )
        inserted = {(sid, at) for sid, at in await cur.fetchall()}
        requests = [
            (tenant_id, prepared)
            for sid, at, tenant_id, _, prepared in rows
            if prepared is not None and (sid, at) in inserted
        ]
        if not requests:
            return []
        found = await self._submits.insert_in(conn, requests)
        return [found[p.new.id] for _, p in requests if p.new.id in found]

"""The schedules table and its occurrences: :class:`ScheduleStore`.

Two owners use it. The ScheduleService (``api/schedules.py``) creates, reads and changes
schedules, always as the caller's tenant (:meth:`Store.tenant_transaction`, opened here
or by the servicer for the methods that take a connection), so row-level security admits
that tenant's rows only; a change that must take effect from the next occurrence
(update, pause, delete) withdraws, in the same transaction, the occurrences created
ahead that have not started. The materialiser (``cluster/materialiser.py``) takes the
due schedules of the shards it owns, whatever their tenants, as the node's role, under
the shard fence, and writes each one's :class:`~.core.schedules.Step`: its occurrences
(keyed ``(schedule_id, logical_date)``: an existing one is left alone and its task not
inserted), their tasks through the submit path's one insert statement
(:meth:`.submits.SubmitStore.insert_in`), and the schedule's new instants, all in one
transaction. A pass whose commit outcome is lost is simply run again: the key
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
from chronoshard.scheduler.core.workflows import RunState
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection, Store
from chronoshard.scheduler.store.submits import SubmitStore
from chronoshard.scheduler.store.workflow_progress import finish_runs
from chronoshard.scheduler.store.workflows import NewRun, WorkflowStore

WITHDRAWN_REASON = "withdrawn: the schedule changed before this occurrence started"


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """One occurrence with its task as it is now (``task_id`` None: skipped)."""

    logical_date: datetime
    origin: Origin
    task_id: uuid.UUID | None
    status: TaskStatus | None
    finished_at: datetime | None
    workflow_id: uuid.UUID | None = None
    """The run a workflow schedule's occurrence created (``status`` then reads the run's
    state as a task's: :data:`RUN_AS_TASK_STATUS`)."""


RUN_AS_TASK_STATUS = {
    RunState.RUNNING: TaskStatus.RUNNING,
    RunState.SUCCEEDED: TaskStatus.COMPLETED,
    RunState.FAILED: TaskStatus.DEAD_LETTER,
    RunState.CANCELLED: TaskStatus.CANCELLED,
}


@dataclass(frozen=True, slots=True)
class DueSchedule:
    schedule: Schedule
    previous_running: bool


@dataclass(frozen=True, slots=True)
class Written:
    """One schedule's step as the materialiser hands it to :meth:`ScheduleStore.advance`.

    ``occurrences`` pairs each decided occurrence with its task or workflow run (None:
    skipped)."""

    schedule_id: uuid.UUID
    tenant_id: uuid.UUID
    occurrences: Sequence[tuple[datetime, Origin, PreparedTask | NewRun | None]]
    cursor_at: datetime
    next_at: datetime | None
    materialise_at: datetime | None
    buffered_at: datetime | None


@dataclass
class _Created:
    """What a write of occurrences made."""

    tasks: list[Task]
    """The occurrences' own tasks (task schedules)."""
    due: list[Task]
    """What the router must hear of: those tasks, and the runs' tasks without parents."""
    runs: dict[tuple[uuid.UUID, datetime], uuid.UUID]
    """The runs created, by (schedule, logical date)."""

    def last_runs(self) -> dict[uuid.UUID, uuid.UUID]:
        """Each schedule's newest run: what its overlap policy asks about next."""
        newest: dict[uuid.UUID, tuple[datetime, uuid.UUID]] = {}
        for (schedule_id, at), run_id in self.runs.items():
            if schedule_id not in newest or at >= newest[schedule_id][0]:
                newest[schedule_id] = (at, run_id)
        return {schedule_id: run_id for schedule_id, (_, run_id) in newest.items()}

    def schedule_runs(self, origin: Origin) -> list[ScheduleRun]:
        """The occurrences created, as runs of ``origin``, oldest first."""
        made = [
            ScheduleRun(t.logical_date, origin, t.id, t.status, None)
            for t in self.tasks
            if t.logical_date is not None
        ]
        made += [
            ScheduleRun(at, origin, None, TaskStatus.RUNNING, None, workflow_id=run_id)
            for (_, at), run_id in self.runs.items()
        ]
        return sorted(made, key=lambda r: r.logical_date)


def schedule_from_row(row: Mapping[str, Any]) -> Schedule:
    spec = ScheduleSpec(
        name=row["name"],
        cron=row["cron"],
        interval_s=row["interval_s"],
        timezone=row["timezone"],
        start_at=row["start_at"],
        end_at=row["end_at"],
        template=bytes(
            row["task_template"] if row["workflow_template"] is None else row["workflow_template"]
        ),
        creates_workflow=row["workflow_template"] is not None,
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
        "task_template": None if spec.creates_workflow else spec.template,
        "workflow_template": spec.template if spec.creates_workflow else None,
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
        self._workflows = WorkflowStore(store, submits)
        self._q = queries.load("schedules.sql")

    # --- the ScheduleService ----------------------------------------------------------

    async def insert(self, params: Mapping[str, Any], spec: ScheduleSpec) -> Schedule | None:
        """Insert a schedule; None when the tenant already has one of that name."""
        async with self._store.tenant_transaction(params["tenant_id"]) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["insert_schedule"], {**params, **_spec_params(spec)})
            row = await cur.fetchone()
        return None if row is None else schedule_from_row(row)

    async def get(self, tenant_id: uuid.UUID, name_or_id: str) -> Schedule | None:
        async with self._store.tenant_transaction(tenant_id) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["get_schedule"], {"tenant_id": tenant_id, **_key(name_or_id)})
            row = await cur.fetchone()
        return None if row is None else schedule_from_row(row)

    async def page(self, tenant_id: uuid.UUID, after: str | None, limit: int) -> list[Schedule]:
        async with self._store.tenant_transaction(tenant_id) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["list_schedules"], {"tenant_id": tenant_id, "after": after, "limit": limit}
            )
            return [schedule_from_row(r) for r in await cur.fetchall()]

    async def runs(
        self, tenant_id: uuid.UUID, schedule_id: uuid.UUID, limit: int
    ) -> list[ScheduleRun]:
        """The schedule's newest ``limit`` occurrences, read as ``tenant_id``."""
        async with self._store.tenant_transaction(tenant_id) as conn:
            cur = await conn.execute(self._q["runs"], {"schedule_id": schedule_id, "limit": limit})
            return [
                ScheduleRun(
                    logical_date=at,
                    origin=Origin(origin),
                    task_id=task_id,
                    status=(
                        RUN_AS_TASK_STATUS[RunState(run_state)]
                        if run_state is not None
                        else None
                        if status is None
                        else TaskStatus(status)
                    ),
                    finished_at=finished_at if workflow_id is None else run_finished_at,
                    workflow_id=workflow_id,
                )
                for (
                    at,
                    origin,
                    task_id,
                    status,
                    finished_at,
                    workflow_id,
                    run_state,
                    run_finished_at,
                ) in await cur.fetchall()
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
        rows = await cur.fetchall()
        withdrawn = [(task_id, shard) for task_id, shard, _ in rows]
        # A withdrawn workflow occurrence's run has no task left: it ends CANCELLED.
        await finish_runs(conn, sorted({run for _, _, run in rows if run is not None}))
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
        runs: Sequence[tuple[datetime, Origin, PreparedTask | NewRun]],
    ) -> tuple[list[ScheduleRun], list[Task]]:
        """Occurrences created outside the materialiser (trigger, backfill): those whose
        logical date has no occurrence yet, with their tasks or runs. The runs created
        (oldest first) and the tasks the router must hear of."""
        written = Written(schedule_id, tenant_id, runs, runs[0][0], None, None, None)
        created = await self._write_occurrences(conn, [written])
        return created.schedule_runs(runs[0][1]), created.due

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
        """Write the steps of the schedules :meth:`due` returned: occurrences, tasks (and
        runs), and each schedule's new instants. The tasks that are due (a run's: those
        without parents)."""
        written = await self._write_occurrences(conn, steps)
        last_runs = written.last_runs()
        # The newest task or run each schedule made: what the overlap policy asks about.
        last: dict[uuid.UUID, TaskRef] = {}
        for task in written.tasks:
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
                "last_workflow_ids": [last_runs.get(s.schedule_id) for s in steps],
            },
        )
        return written.due

    async def _write_occurrences(self, conn: Connection, steps: Sequence[Written]) -> _Created:
        rows = [
            (step.schedule_id, at, step.tenant_id, origin, made)
            for step in steps
            for at, origin, made in step.occurrences
        ]
        created = _Created([], [], {})
        if not rows:
            return created
        own_tasks = [made if isinstance(made, PreparedTask) else None for *_, made in rows]
        cur = await conn.execute(
            self._q["insert_occurrences"],
            {
                "schedule_ids": [r[0] for r in rows],
                "logical_dates": [r[1] for r in rows],
                "tenant_ids": [r[2] for r in rows],
                "origins": [str(r[3]) for r in rows],
                "task_ids": [None if t is None else t.new.id for t in own_tasks],
                "task_scheduled_ats": [
                    None if t is None else t.new.scheduled_at for t in own_tasks
                ],
                "workflow_ids": [r[4].id if isinstance(r[4], NewRun) else None for r in rows],
            },
        )
        inserted = {(sid, at) for sid, at in await cur.fetchall()}
        mine = [r for r in rows if r[4] is not None and (r[0], r[1]) in inserted]
        requests = [
            (tenant_id, made) for _, _, tenant_id, _, made in mine if isinstance(made, PreparedTask)
        ]
        if requests:
            found = await self._submits.insert_in(conn, requests)
            created.tasks.extend(found[p.new.id] for _, p in requests if p.new.id in found)
            created.due.extend(created.tasks)
        for schedule_id, at, _, _, made in mine:
            if isinstance(made, NewRun):
                run = await self._workflows.create_in(conn, made)
                assert run is not None, "an occurrence's run has no idempotency key"
                created.due.extend(t for t in run[1].values() if t.unresolved_dependencies == 0)
                created.runs[(schedule_id, at)] = made.id
        return created

"""Workflow runs for the WorkflowService (docs/architecture.md#d9): create one in one
transaction, read it, list, cancel and retry. What a terminal write of one of its tasks
does to the run is :mod:`.workflow_progress`, which cancel uses like every other
terminal write. The rules are :mod:`chronoshard.scheduler.core.workflows`.

Every transaction :class:`WorkflowStore` opens runs as the run's tenant
(:meth:`Store.tenant_transaction`), so row-level security admits that tenant's rows only;
:meth:`WorkflowStore.create_in` writes in its caller's transaction, as whoever that is (a
schedule's trigger: the tenant; the materialiser: the node).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from chronoshard.scheduler.core.models import PreparedTask, Task
from chronoshard.scheduler.core.states import TaskStatus
from chronoshard.scheduler.core.workflows import RunState, TriggerRule, plan_retry
from chronoshard.scheduler.errors import CompareAndSetLost
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection, Store, task_from_row
from chronoshard.scheduler.store.submits import SubmitStore
from chronoshard.scheduler.store.tasks import cancel_params
from chronoshard.scheduler.store.workflow_progress import (
    DueTask,
    due_rows,
    finished_rows,
    graph,
    settle,
)

CANCELLED_REASON = "workflow cancelled"


# ---- values --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """A ``workflow_runs`` row."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    state: RunState
    scheduled_at: datetime
    created_at: datetime
    finished_at: datetime | None
    task_count: int
    edge_count: int
    idempotency_key: str | None
    request_fingerprint: str | None
    job_id: str | None = None
    schedule_id: uuid.UUID | None = None
    logical_date: datetime | None = None


def run_from_row(row: Mapping[str, Any]) -> WorkflowRun:
    return WorkflowRun(
        id=row["id"],
        tenant_id=row["tenant_id"],
        name=row["name"],
        state=RunState(row["state"]),
        scheduled_at=row["scheduled_at"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        task_count=row["task_count"],
        edge_count=row["edge_count"],
        idempotency_key=row["idempotency_key"],
        request_fingerprint=row["request_fingerprint"],
        job_id=row["job_id"],
        schedule_id=row["schedule_id"],
        logical_date=row["logical_date"],
    )


@dataclass(frozen=True, slots=True)
class RunTask:
    """A task of a run as GetWorkflow shows it."""

    ref: str
    task: Task
    trigger_rule: TriggerRule
    upstream_cause: str | None
    """The ref of the failed task an UPSTREAM_FAILED task descends from."""


@dataclass(frozen=True, slots=True)
class NewRun:
    """A validated create, ready to write: the tasks in the DAG's order (parents first),
    each with its ref and rule; the edges as task ids."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    scheduled_at: datetime
    tasks: Sequence[tuple[str, TriggerRule, PreparedTask]]
    edges: Sequence[tuple[uuid.UUID, uuid.UUID]]
    idempotency_key: str | None
    fingerprint: str | None
    submitted_by: str | None = None
    job_id: str | None = None
    """The watchdog's job a success of the run completes."""
    schedule_id: uuid.UUID | None = None
    logical_date: datetime | None = None
    """The schedule occurrence that creates the run, if one does."""


@dataclass(frozen=True, slots=True)
class Cancelled:
    run: WorkflowRun
    cancelled: list[Task]
    """Tasks that became CANCELLED at once."""
    stopping: list[Task]
    """Running tasks whose cancel was requested (their workers are told)."""
    due: list[DueTask]


@dataclass(frozen=True, slots=True)
class Reopened:
    run: WorkflowRun
    reopened: int
    due: list[DueTask]


# ---- the WorkflowService's reads and writes ----------------------------------------------


class WorkflowStore:
    """Create, read, list, cancel and retry runs, one tenant at a time."""

    def __init__(self, store: Store, submits: SubmitStore) -> None:
        self._store = store
        self._submits = submits
        self._q = queries.load("workflows.sql")
        self._tasks_q = queries.load("tasks.sql")

    async def create(self, new: NewRun) -> tuple[WorkflowRun, bool]:
        """Write the run, its tasks, their refs and its edges in one transaction. With an
        idempotency key already used, the original run and False (the caller compares
        fingerprints); else the new run and True."""
        async with self._store.tenant_transaction(new.tenant_id) as conn:
            created = await self.create_in(conn, new)
            if created is not None:
                return created[0], True
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["run_by_key"],
                {"tenant_id": new.tenant_id, "idempotency_key": new.idempotency_key},
            )
            original = await cur.fetchone()
            assert original is not None, "the conflicting run committed before ours"
            return run_from_row(original), False

    async def create_in(
        self, conn: Connection, new: NewRun
    ) -> tuple[WorkflowRun, dict[uuid.UUID, Task]] | None:
        """Write ``new`` in the caller's transaction (a schedule's occurrence creates its
        run with its occurrence row): the run and its tasks by id; None when its
        idempotency key is taken (nothing written)."""
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            self._q["insert_run"],
            {
                "id": new.id,
                "tenant_id": new.tenant_id,
                "name": new.name,
                "scheduled_at": new.scheduled_at,
                "task_count": len(new.tasks),
                "edge_count": len(new.edges),
                "idempotency_key": new.idempotency_key,
                "fingerprint": new.fingerprint,
                "submitted_by": new.submitted_by,
                "job_id": new.job_id,
                "schedule_id": new.schedule_id,
                "logical_date": new.logical_date,
            },
        )
        row = await cur.fetchone()
        if row is None:
            return None
        tasks = await self._submits.insert_in(conn, [(new.tenant_id, p) for _, _, p in new.tasks])
        await conn.execute(
            self._q["insert_workflow_tasks"],
            {
                "workflow_id": new.id,
                "task_ids": [p.new.id for _, _, p in new.tasks],
                "refs": [ref for ref, _, _ in new.tasks],
                "trigger_rules": [str(rule) for _, rule, _ in new.tasks],
                "positions": list(range(len(new.tasks))),
            },
        )
        if new.edges:
            await conn.execute(
                self._q["insert_edges"],
                {
                    "workflow_id": new.id,
                    "scheduled_at": new.scheduled_at,
                    "parents": [parent for parent, _ in new.edges],
                    "children": [child for _, child in new.edges],
                },
            )
        return run_from_row(row), tasks

    async def get(self, tenant_id: uuid.UUID, run_id: uuid.UUID) -> WorkflowRun | None:
        async with self._store.tenant_transaction(tenant_id) as conn:
            return await self._run(conn, tenant_id, run_id)

    async def _run(
        self, conn: Connection, tenant_id: uuid.UUID, run_id: uuid.UUID
    ) -> WorkflowRun | None:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(self._q["get_run"], {"tenant_id": tenant_id, "id": run_id})
        row = await cur.fetchone()
        return None if row is None else run_from_row(row)

    async def tasks_and_edges(
        self, run: WorkflowRun
    ) -> tuple[list[RunTask], list[tuple[str, str]]]:
        """Every task of ``run`` (parents first) and its edges by ref, read together."""
        params = {"workflow_id": run.id, "scheduled_at": run.scheduled_at}
        async with self._store.tenant_transaction(run.tenant_id) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["run_tasks"], params)
            tasks = [
                RunTask(
                    ref=row["workflow_ref"],
                    task=task_from_row(row),
                    trigger_rule=TriggerRule(row["trigger_rule"]),
                    upstream_cause=row["upstream_cause_ref"],
                )
                for row in await cur.fetchall()
            ]
            edges = await conn.execute(self._q["run_edges"], params)
            return tasks, [(parent, child) for parent, child in await edges.fetchall()]

    async def page(
        self,
        tenant_id: uuid.UUID,
        state: RunState | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
    ) -> list[WorkflowRun]:
        async with self._store.tenant_transaction(tenant_id) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                self._q["list_runs"],
                {
                    "tenant_id": tenant_id,
                    "state": None if state is None else str(state),
                    "after_created_at": None if after is None else after[0],
                    "after_id": None if after is None else after[1],
                    "limit": limit,
                },
            )
            return [run_from_row(row) for row in await cur.fetchall()]

    async def cancel(self, run: WorkflowRun, reason: str) -> Cancelled:
        """Cancel every task of ``run`` not terminal yet, in one statement (the waiting ones
        read CANCELLED, never UPSTREAM_FAILED), then settle what became terminal."""
        async with self._store.tenant_transaction(run.tenant_id) as conn:
            cur = await conn.execute(
                self._q["open_task_ids"], {"workflow_id": run.id, "scheduled_at": run.scheduled_at}
            )
            ids = [row[0] for row in await cur.fetchall()]
            moved: list[Task] = []
            due: list[DueTask] = []
            if ids:
                rows_cur = conn.cursor(row_factory=dict_row)
                await rows_cur.execute(
                    self._tasks_q["cancel_task"],
                    cancel_params(run.tenant_id, run.scheduled_at, ids, reason),
                )
                rows = await rows_cur.fetchall()
                moved = [task_from_row(row) for row in rows]
                due = await settle(conn, finished_rows(rows))
            after = await self._run(conn, run.tenant_id, run.id)
            assert after is not None
        return Cancelled(
            run=after,
            cancelled=[t for t in moved if t.status is TaskStatus.CANCELLED],
            stopping=[t for t in moved if t.status is not TaskStatus.CANCELLED],
            due=due,
        )

    async def retry(self, run: WorkflowRun) -> Reopened:
        """Reopen the tasks of finished ``run`` that did not complete (``plan_retry``),
        compared against the statuses the plan read; the run is RUNNING again.

        Raises:
            CompareAndSetLost: a task or the run moved on meanwhile (a concurrent retry
                or cancel); nothing was written.
        """
        async with self._store.tenant_transaction(run.tenant_id) as conn:
            dag, statuses = await graph(conn, run.id, run.scheduled_at)
            plan = plan_retry(dag, statuses)
            if not plan.reopened:
                return Reopened(run, 0, [])
            cur = await conn.execute(
                self._q["reopen_tasks"],
                {
                    "scheduled_at": run.scheduled_at,
                    "ids": list(plan.reopened),
                    "statuses": [str(statuses[task]) for task in plan.reopened],
                    "unresolved": list(plan.reopened.values()),
                },
            )
            rows = await cur.fetchall()
            if len(rows) != len(plan.reopened):
                raise CompareAndSetLost(f"workflow {run.id} changed while being retried")
            states_cur = conn.cursor(row_factory=dict_row)
            await states_cur.execute(
                self._q["set_run_states"],
                {"ids": [run.id], "states": [str(RunState.RUNNING)], "expected": [str(run.state)]},
            )
            after = await states_cur.fetchone()
            if after is None:
                raise CompareAndSetLost(f"workflow {run.id} changed while being retried")
            return Reopened(run_from_row(after), len(rows), due_rows(rows))

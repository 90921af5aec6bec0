"""The TaskService's reads and writes beyond submit: list, cancel, operator retry and
resolution.

A small class over the :class:`~.database.Store`'s pool, with its statements in
``sql/tasks.sql``. Every query names the caller's tenant, so another tenant's task is
simply not found (never an existence oracle, docs/architecture.md#d11), and runs in a
transaction as that tenant (:meth:`Store.tenant_transaction`), so row-level security
would refuse another tenant's row even to a statement that forgot its predicate. Every
write names its row by ``(scheduled_at, id)`` (read first by id: ``scheduled_at`` never
changes) and the states it may start from, taken from the state machine
(``states.sources``). A row that moved on between the read and the write therefore
changes nothing, and the caller gets :class:`~.errors.CompareAndSetLost` (``ABORTED``):
sending the request again sees the new state and gets a definite answer.

Cancel follows docs/architecture.md#d4 as ``states`` reads it: from SCHEDULED, PRELOADED, DISPATCHED
and RETRYING the task becomes CANCELLED at once (a live attempt row with it); a RUNNING
handler cannot be stopped from outside, so its cancel is only *requested*
(``cancel_requested_at``, ``cancel_reason``) and the row stays RUNNING until the worker
acknowledges. Both cases are one statement, chosen by the row's state at write time.

Resolution (``ResolveTask``) is for an OUTCOME_UNKNOWN task only, the held state of a
non-idempotent attempt whose lease ran out unsettled: RETRY sends it back to SCHEDULED
(its next dispatch gets a new token, so the old attempt's late writes are fenced),
MARK_FAILED dead-letters it; the attempt keeps its OUTCOME_UNKNOWN state and records
the resolution. A repeated request (the answer to the first was lost) finds the task
moved on with its last resolved attempt resolved the same way, and answers with the task
as it is.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from chronoshard.scheduler.core import states
from chronoshard.scheduler.core.listing import PageCursor, TaskFilter
from chronoshard.scheduler.core.models import Task
from chronoshard.scheduler.core.states import Resolution, TaskEvent, TaskStatus
from chronoshard.scheduler.errors import (
    CompareAndSetLost,
    NothingToResolve,
    PartOfWorkflow,
    TaskAlreadyFinished,
    TaskNotFound,
)
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Store, task_from_row
from chronoshard.scheduler.store.workflow_progress import DueTask, finished_rows, settle

COOPERATIVE_CANCEL: frozenset[TaskStatus] = frozenset({TaskStatus.RUNNING})
"""States whose cancel must be acknowledged by the worker running the handler."""
IMMEDIATE_CANCEL: frozenset[TaskStatus] = states.sources(TaskEvent.CANCEL) - COOPERATIVE_CANCEL


def cancel_params(
    tenant_id: uuid.UUID, scheduled_at: datetime, ids: Sequence[uuid.UUID], reason: str
) -> dict[str, Any]:
    """The ``cancel_task`` statement's parameters: tasks ``ids``, all at ``scheduled_at``."""
    return {
        "tenant_id": tenant_id,
        "scheduled_at": scheduled_at,
        "ids": list(ids),
        "sources": sorted(str(s) for s in states.sources(TaskEvent.CANCEL)),
        "immediate": sorted(str(s) for s in IMMEDIATE_CANCEL),
        "reason": reason,
    }


@dataclass(frozen=True, slots=True)
class CancelResult:
    task: Task
    changed: bool
    """False when the task was already CANCELLED and nothing was written."""
    due: list[DueTask] = field(default_factory=list)
    """Workflow tasks its cancel made due (``all_done`` children)."""


class TaskQueries:
    """List, cancel and retry, for one tenant at a time."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._q = queries.load("tasks.sql")

    async def list_tasks(
        self,
        tenant_id: uuid.UUID,
        flt: TaskFilter,
        *,
        after: PageCursor | None,
        limit: int,
        include_payloads: bool,
    ) -> list[Task]:
        """Up to ``limit`` of the tenant's tasks matching ``flt``, ordered by
        ``(scheduled_at, id)``, strictly after ``after``. Without ``include_payloads``
        the payload is ``{}`` and result and checkpoint are None (not even read)."""
        params: dict[str, Any] = {
            "tenant_id": tenant_id,
            "after_at": None if after is None else after.scheduled_at,
            "after_id": None if after is None else after.id,
            "statuses": [str(s) for s in flt.statuses],
            "type": flt.type,
            "queue": flt.queue,
            "job_id": flt.job_id,
            "scheduled_from": flt.scheduled_from,
            "scheduled_before": flt.scheduled_before,
            "due_from": flt.due_from,
            "due_before": flt.due_before,
            "include_payloads": include_payloads,
            "limit": limit,
        }
        async with self._store.tenant_transaction(tenant_id) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q["list_tasks"], params)
            return [task_from_row(row) for row in await cur.fetchall()]

    async def cancel_task(
        self, tenant_id: uuid.UUID, task_id: uuid.UUID, reason: str
    ) -> CancelResult:
        """Cancel the task now, or request its cancel if it is RUNNING.

        Raises:
            TaskNotFound: no such task in this tenant.
            TaskAlreadyFinished: it is COMPLETED, DEAD_LETTER or UPSTREAM_FAILED.
            CompareAndSetLost: it reached a terminal state between read and write.
        """
        task = await self._get(tenant_id, task_id)
        if task.status is TaskStatus.CANCELLED:
            return CancelResult(task, changed=False)
        if task.status in states.TERMINAL:
            raise TaskAlreadyFinished(task_id, str(task.status))
        params = cancel_params(tenant_id, task.scheduled_at, [task.id], reason)
        moved, due = await self._write_one("cancel_task", params)
        if moved is None:
            raise CompareAndSetLost(f"task {task_id} changed state while being cancelled")
        return CancelResult(moved, changed=True, due=due)

    async def retry_task(self, tenant_id: uuid.UUID, task_id: uuid.UUID, due_at: datetime) -> Task:
        """Send a DEAD_LETTER task back to SCHEDULED, due at ``due_at``, with its retry
        budget reset; attempt numbers and the fencing token continue. An OUTCOME_UNKNOWN
        task is resolved RETRY instead (the resolution is recorded on its attempt).

        Raises:
            TaskNotFound: no such task in this tenant.
            InvalidTransition: it is neither DEAD_LETTER nor OUTCOME_UNKNOWN.
            CompareAndSetLost: it left DEAD_LETTER between read and write.
        """
        task = await self._get(tenant_id, task_id)
        if task.status is TaskStatus.OUTCOME_UNKNOWN:
            reason = "retried by an operator (RetryTask)"
            resolved, _, _ = await self.resolve_task(
                tenant_id, task_id, Resolution.RETRY, reason, due_at
            )
            return resolved
        states.transition(task.status, TaskEvent.OPERATOR_RETRY)
        if task.workflow_id is not None:
            raise PartOfWorkflow(task.id, task.workflow_id)
        params = {
            "tenant_id": tenant_id,
            "scheduled_at": task.scheduled_at,
            "id": task.id,
            "sources": sorted(str(s) for s in states.sources(TaskEvent.OPERATOR_RETRY)),
            "due_at": due_at,
        }
        moved, _ = await self._write_one("retry_task", params)
        if moved is None:
            raise CompareAndSetLost(f"task {task_id} changed state while being retried")
        return moved

    async def resolve_task(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        resolution: Resolution,
        reason: str,
        due_at: datetime,
    ) -> tuple[Task, bool, list[DueTask]]:
        """Resolve an OUTCOME_UNKNOWN task; the task after it, whether this call wrote
        (False: a repeat of a resolution already applied, nothing written), and the
        workflow tasks a MARK_FAILED made due (``all_done`` children).

        Raises:
            TaskNotFound: no such task in this tenant.
            NothingToResolve: it is not OUTCOME_UNKNOWN, and not a repeat.
            CompareAndSetLost: it left OUTCOME_UNKNOWN between read and write (its
                worker's late settlement landed).
        """
        task = await self._get(tenant_id, task_id)
        if task.status is not TaskStatus.OUTCOME_UNKNOWN:
            _, attempts = await self._store.get_task_attempts(tenant_id, task.id)
            resolved = [a for a in attempts if a.resolution is not None]
            if resolved and resolved[-1].resolution is resolution:
                return task, False, []
            raise NothingToResolve(task_id, str(task.status))
        target = states.transition(task.status, resolution.event)
        note = (
            f"resolved by an operator: run again ({reason})"
            if resolution is Resolution.RETRY
            else f"marked failed by an operator: {reason}"
        )
        params = {
            "tenant_id": tenant_id,
            "scheduled_at": task.scheduled_at,
            "id": task.id,
            "target": str(target),
            "due_at": due_at,
            "resolution": str(resolution),
            "note": note,
        }
        moved, due = await self._write_one("resolve_task", params)
        if moved is None:
            raise CompareAndSetLost(f"task {task_id} changed state while being resolved")
        return moved, True, due

    async def _get(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> Task:
        task = await self._store.get_task(tenant_id, task_id)
        if task is None:
            raise TaskNotFound(task_id)
        return task

    async def _write_one(
        self, name: str, params: dict[str, Any]
    ) -> tuple[Task | None, list[DueTask]]:
        """The one row ``name`` moved, and what it made due: a workflow task it made
        terminal settles its run in the same transaction (:mod:`.workflow_progress`), as
        ``params``' tenant."""
        async with self._store.tenant_transaction(params["tenant_id"]) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(self._q[name], params)
            row = await cur.fetchone()
            if row is None:
                return None, []
            due = await settle(conn, finished_rows([row]))
        return task_from_row(row), due

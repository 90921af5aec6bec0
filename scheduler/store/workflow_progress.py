"""What a write that makes workflow tasks terminal does to their run, in its own
transaction (docs/architecture.md#d9), and what a dispatch of a workflow task reads of
its parents. The rules are :mod:`chronoshard.scheduler.core.workflows` (pure); these are
the statements of ``sql/workflows.sql`` that apply them.

Whatever makes a workflow task terminal (a completion, a failure out of retries, a
cancel, the reconciler's cancel, an operator's MARK_FAILED) calls :func:`settle` with
the rows it moved, *inside its transaction*, so the task's outcome and what it does to
its run commit together or not at all:

1. a DEAD_LETTER or CANCELLED task fails its waiting ``all_success`` descendants
   (UPSTREAM_FAILED, the failed task as their cause), read off the run's graph;
2. each child still waiting loses one per edge from the tasks made terminal here
   (``release_children``); a child at 0 is due now and comes back, so the caller can
   signal its shard's owner (routing) instead of leaving it to the next preload pass;
3. the run's row is locked and, if no task of it is left that is not terminal, set to
   its final state (:func:`~.core.workflows.run_state`). Concurrent settlements of one
   run queue on that lock, so the last one sees the others' writes; the reconciler's
   run repair is the net for anything lost in between.

A crash after the commit loses nothing: a released child is a SCHEDULED row at 0, due
in the past, which the preloader's pass finds like any due task. A write of plain tasks
never gets here (their ``workflow_id`` is NULL): the hot path pays a column or two in
RETURNING.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from chronoshard.scheduler.core import states
from chronoshard.scheduler.core.states import TaskStatus
from chronoshard.scheduler.core.workflows import (
    CAUSES,
    Dag,
    Parent,
    Place,
    RunState,
    TriggerRule,
    run_state,
    upstream_failures,
)
from chronoshard.scheduler.store import queries
from chronoshard.scheduler.store.database import Connection


@dataclass(frozen=True, slots=True)
class Finished:
    """A workflow task a transaction has just made terminal."""

    task_id: uuid.UUID
    workflow_id: uuid.UUID
    scheduled_at: datetime
    """The task's, which is its run's (every task of a run is scheduled at one instant)."""
    status: TaskStatus


def finished_rows(rows: Iterable[Mapping[str, Any]]) -> list[Finished]:
    """The workflow tasks among ``rows`` (RETURNING ``id, workflow_id, scheduled_at,
    status``) that are terminal now."""
    return [
        Finished(row["id"], row["workflow_id"], row["scheduled_at"], status)
        for row in rows
        if row["workflow_id"] is not None
        and (status := TaskStatus(row["status"])) in states.TERMINAL
    ]


@dataclass(frozen=True, slots=True)
class DueTask:
    """A task that became due now (a released child, a reopened task): what routing
    needs to tell its shard's owner (``cluster.routing.ChangedTask``)."""

    id: uuid.UUID
    shard: int
    due_at: datetime


def due_rows(rows: Iterable[Sequence[Any]]) -> list[DueTask]:
    """Rows ``(id, shard, due_at, unresolved_dependencies)``: those at 0 are due now."""
    return [DueTask(task_id, shard, due_at) for task_id, shard, due_at, left in rows if left == 0]


def _q() -> Mapping[str, str]:
    return queries.load("workflows.sql")


async def settle(conn: Connection, finished: Sequence[Finished]) -> list[DueTask]:
    """Fail, release and finish what ``finished`` decides (module docstring); the tasks
    now due."""
    if not finished:
        return []
    by_run: dict[uuid.UUID, list[Finished]] = defaultdict(list)
    for item in finished:
        by_run[item.workflow_id].append(item)
    parents = [item.task_id for item in finished]
    for run_id, items in by_run.items():
        failed = [item for item in items if item.status in CAUSES]
        if failed:
            parents.extend(await _fail_upstream(conn, run_id, failed))
    cur = await conn.execute(_q()["release_children"], {"parents": parents})
    due = due_rows(await cur.fetchall())
    await finish_runs(conn, sorted(by_run))
    return due


async def _fail_upstream(
    conn: Connection, run_id: uuid.UUID, failed: Sequence[Finished]
) -> list[uuid.UUID]:
    """Fail the waiting ``all_success`` descendants of ``failed``; the ids written (only
    those: a descendant another failure wrote first had its children released by that
    transaction)."""
    scheduled_at = failed[0].scheduled_at
    dag, statuses = await graph(conn, run_id, scheduled_at)
    doomed = upstream_failures(dag, [item.task_id for item in failed], statuses)
    if not doomed:
        return []
    failures = {item.task_id: item.status for item in failed}
    cur = await conn.execute(
        _q()["fail_upstream"],
        {
            "scheduled_at": scheduled_at,
            "ids": list(doomed),
            "causes": list(doomed.values()),
            "errors": [
                f"upstream task {cause} ended {failures[cause]}" for cause in doomed.values()
            ],
        },
    )
    return [row[0] for row in await cur.fetchall()]


async def graph(
    conn: Connection, run_id: uuid.UUID, scheduled_at: datetime
) -> tuple[Dag[uuid.UUID], dict[uuid.UUID, TaskStatus]]:
    """The run's DAG by task id and each task's status, as this transaction reads them."""
    params = {"workflow_id": run_id, "scheduled_at": scheduled_at}
    cur = await conn.execute(_q()["graph_tasks"], params)
    rules: dict[uuid.UUID, TriggerRule] = {}
    statuses: dict[uuid.UUID, TaskStatus] = {}
    for task_id, rule, status in await cur.fetchall():
        rules[task_id] = TriggerRule(rule)
        statuses[task_id] = TaskStatus(status)
    cur = await conn.execute(_q()["graph_edges"], {"workflow_id": run_id})
    return Dag.of(rules, await cur.fetchall()), statuses


async def finish_runs(conn: Connection, run_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Set each of ``run_ids`` that has no task left that is not terminal to its final
    state, under the run's row lock (module docstring, step 3); the runs set. The one way
    a run finishes: after a terminal write here, and in the reconciler's repair of a run
    such a write left RUNNING (a succeeded run's job completion is written with it)."""
    cur = await conn.execute(_q()["lock_runs"], {"ids": list(run_ids)})
    locked = [row[0] for row in await cur.fetchall()]
    if not locked:
        return []
    cur = await conn.execute(_q()["finished_runs"], {"ids": locked})
    done = [
        (run_id, run_state([TaskStatus(s) for s in found]))
        for run_id, found in await cur.fetchall()
    ]
    if not done:
        return []
    cur = await conn.execute(
        _q()["set_run_states"],
        {
            "ids": [run_id for run_id, _ in done],
            "states": [str(state) for _, state in done],
            "expected": [str(RunState.RUNNING)] * len(done),
        },
    )
    return [row[0] for row in await cur.fetchall()]


async def places(conn: Connection, task_ids: Sequence[uuid.UUID]) -> PendingPlaces:
    """Where each of ``task_ids`` (tasks being dispatched) stands in its run, if it is a
    workflow task: its ref and its parents' outcomes, in the run's order. Queued (in a
    pipelined transaction) until :meth:`PendingPlaces.read`; a task of no workflow has
    no place (and costs one probe of ``workflow_tasks``' key)."""
    return PendingPlaces(await conn.execute(_q()["places"], {"ids": list(task_ids)}))


class PendingPlaces:
    """The places asked for by :func:`places`, read by :meth:`read`."""

    def __init__(self, cursor: psycopg.AsyncCursor[Any]) -> None:
        self._cursor = cursor

    async def read(self) -> dict[uuid.UUID, Place]:
        refs: dict[uuid.UUID, str] = {}
        parents: dict[uuid.UUID, list[Parent]] = defaultdict(list)
        for task_id, ref, parent_id, parent_ref, status, result in await self._cursor.fetchall():
            refs[task_id] = ref
            if parent_id is not None:
                parents[task_id].append(Parent(parent_id, parent_ref, TaskStatus(status), result))
        return {task_id: Place(ref, tuple(parents[task_id])) for task_id, ref in refs.items()}

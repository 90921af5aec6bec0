"""The heartbeat statement against a real PostgreSQL: one statement extends a whole batch
of leases, stores checkpoints only under the current token, and answers only the
exceptions (leases not extended, cancels requested)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fixtures.stores import EPOCH, SHARD, insert_tasks, new_task, new_tenant

from chronoshard.scheduler.core.models import Task
from chronoshard.scheduler.core.runs import Beat, Intent, Settle
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.runs import RunStore

LEASE_S = 60.0

# Heartbeats and settlements are fenced on the shard's epoch.
pytestmark = pytest.mark.store(own_database=True, owns_shard=True)


async def _running(store: Store, runs: RunStore, n: int) -> list[Task]:
    """``n`` tasks dispatched (token 1) and acknowledged."""
    tenant = await new_tenant(store, max_concurrent_workers=100)
    now = datetime.now(UTC)
    news = [
        new_task(scheduled_at=now - timedelta(milliseconds=i), due_at=now, payload={})
        for i in range(n)
    ]
    await insert_tasks(store, tenant.id, news)
    timers, _ = await runs.load_due({SHARD: EPOCH}, now + timedelta(seconds=60), 1000)
    result = await runs.write_intents({SHARD: EPOCH}, [Intent(t, "w") for t in timers], 5.0)
    tasks = result.dispatched
    assert len(tasks) == n
    await runs.ack([Settle(t.ref, t.fencing_token) for t in tasks])
    return tasks


async def _rows(store: Store, tasks: list[Task]) -> dict[uuid.UUID, dict[str, Any]]:
    async with store.connection() as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute(
            "SELECT id, lease_expires_at, checkpoint, now() AS now FROM tasks WHERE id = ANY(%s)",
            ([t.id for t in tasks],),
        )
        return {row["id"]: row for row in await cur.fetchall()}


async def test_a_batch_extends_every_current_lease_and_refuses_stale_tokens(
    store: Store, runs: RunStore
) -> None:
    tasks = await _running(store, runs, 50)
    current, stale = tasks[:40], tasks[40:]
    beats = [Beat(t.ref, t.fencing_token, None) for t in current]
    beats += [Beat(t.ref, t.fencing_token + 1, b'{"zombie": 1}') for t in stale]
    update = await runs.extend_leases(beats, LEASE_S)
    assert update.extended == {t.id for t in current}
    assert update.cancel_requested == {}
    rows = await _rows(store, tasks)
    for task in current:
        left_s = (rows[task.id]["lease_expires_at"] - rows[task.id]["now"]).total_seconds()
        assert LEASE_S - 5 < left_s <= LEASE_S
    for task in stale:
        # The 5 s lease of the intent, untouched, and no checkpoint from the stale beat.
        left_s = (rows[task.id]["lease_expires_at"] - rows[task.id]["now"]).total_seconds()
        assert left_s <= 5.0
        assert rows[task.id]["checkpoint"] is None


async def test_checkpoints_are_stored_under_the_current_token_only(
    store: Store, runs: RunStore
) -> None:
    [task] = await _running(store, runs, 1)
    await runs.extend_leases([Beat(task.ref, task.fencing_token, b'{"next": 3}')], LEASE_S)
    # A beat without a checkpoint keeps the stored one; a stale one cannot replace it.
    await runs.extend_leases([Beat(task.ref, task.fencing_token, None)], LEASE_S)
    await runs.extend_leases([Beat(task.ref, task.fencing_token + 1, b'{"next": 0}')], LEASE_S)
    rows = await _rows(store, [task])
    assert bytes(rows[task.id]["checkpoint"]) == b'{"next": 3}'


async def test_a_requested_cancel_comes_back_with_its_reason(store: Store, runs: RunStore) -> None:
    tasks = await _running(store, runs, 3)
    async with store.connection() as conn:
        await conn.execute(
            "UPDATE tasks SET cancel_requested_at = now(), cancel_reason = 'operator says'"
            " WHERE id = %s",
            (tasks[1].id,),
        )
    update = await runs.extend_leases([Beat(t.ref, t.fencing_token, None) for t in tasks], 30)
    # The lease is still extended: the worker is asked to stop, not cut off.
    assert update.extended == {t.id for t in tasks}
    assert update.cancel_requested == {tasks[1].id: "operator says"}


async def test_a_zombie_and_the_current_attempt_in_one_batch_are_told_apart(
    store: Store, runs: RunStore
) -> None:
    [task] = await _running(store, runs, 1)
    other = await _running(store, runs, 1)
    beats = [
        Beat(task.ref, task.fencing_token - 1, None),  # an older attempt of the same task
        Beat(task.ref, task.fencing_token, None),
        Beat(other[0].ref, other[0].fencing_token + 5, None),
    ]
    update = await runs.extend_leases(beats, LEASE_S)
    assert update.extended == {task.id}
    assert update.cancel_requested == {}

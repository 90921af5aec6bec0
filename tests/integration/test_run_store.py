"""Run-state statements against a real PostgreSQL: preload, intent, and every worker
report, with their fencing (epochs for shard writes, tokens for settlements)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fixtures.stores import EPOCH, SHARD, submit

from chronoshard.scheduler.core.models import TaskRef, Tenant
from chronoshard.scheduler.core.retry import FailureReport
from chronoshard.scheduler.core.runs import (
    Beat,
    Completion,
    Failure,
    Intent,
    Release,
    Settle,
    SettleOutcome,
    TimerTask,
)
from chronoshard.scheduler.core.states import AttemptState, TaskStatus
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.runs import RunStore

ERROR = FailureReport(retryable=True, timed_out=False, cancelled=False)

# Intents, settlements and the warm read are fenced on the shard's epoch, and tests here
# move the shard to another node's epoch.
pytestmark = pytest.mark.store(own_database=True, owns_shard=True)


async def _dispatch(runs: RunStore, worker: str = "w1") -> list[Any]:
    horizon = datetime.now(UTC) + timedelta(seconds=60)
    timers, lost = await runs.load_due({SHARD: EPOCH}, horizon, 100)
    assert not lost
    result = await runs.write_intents(
        {SHARD: EPOCH}, [Intent(t, worker) for t in timers], lease_s=30
    )
    return result.dispatched


async def _row(store: Store, task_id: uuid.UUID) -> dict[str, Any]:
    async with store.connection() as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute("SELECT * FROM tasks WHERE id = %s", (task_id,))
        row = await cur.fetchone()
    assert row is not None
    return row


async def test_preload_moves_only_due_rows_of_owned_shards(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    due = await submit(store, tenant, due_in_s=1)
    later = await submit(store, tenant, due_in_s=3600)
    horizon = datetime.now(UTC) + timedelta(seconds=60)
    timers, lost = await runs.load_due({SHARD: EPOCH}, horizon, 100)
    assert [t.id for t in timers] == [due.id]
    assert (await _row(store, later.id))["status"] == "SCHEDULED"
    # A stale epoch preloads nothing and reports the shard lost.
    await submit(store, tenant, due_in_s=2)
    timers, lost = await runs.load_due({SHARD: EPOCH - 1}, horizon, 100)
    assert timers == [] and lost == {SHARD}
    # Reloading after a restart finds what is PRELOADED.
    reloaded = await runs.load_preloaded({SHARD: EPOCH})
    assert {t.id for t in reloaded} == {due.id}


async def test_intent_bumps_token_and_attempt_and_records_the_attempt(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant)
    [task] = await _dispatch(runs)
    assert task.id == new.id
    assert task.status is TaskStatus.DISPATCHED
    assert (task.fencing_token, task.attempt, task.worker_id) == (1, 1, "w1")
    assert task.lease_expires_at is not None
    [attempt] = await store.get_attempts(new.id)
    assert (attempt.attempt, attempt.fencing_token, attempt.state) == (
        1,
        1,
        AttemptState.DISPATCHED,
    )


async def test_intent_under_a_lost_epoch_writes_nothing(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant)
    horizon = datetime.now(UTC) + timedelta(seconds=60)
    timers, _ = await runs.load_due({SHARD: EPOCH}, horizon, 100)
    # Another node takes the shard over.
    assert await store.claim_shard_epoch(SHARD, EPOCH + 1, "node-b")
    result = await runs.write_intents({SHARD: EPOCH}, [Intent(t, "w1") for t in timers], 30)
    assert result.dispatched == [] and result.lost_shards == {SHARD}
    row = await _row(store, new.id)
    assert (row["status"], row["fencing_token"]) == ("PRELOADED", 0)


async def test_ack_heartbeat_complete_and_the_ledger(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant, job_id="nightly-report")
    [task] = await _dispatch(runs)
    assert await runs.ack([Settle(task.ref, 1)]) == {new.id: SettleOutcome.OK}
    # A repeated ack is answered OK; an ack with another token is stale.
    assert await runs.ack([Settle(task.ref, 1)]) == {new.id: SettleOutcome.OK}
    assert await runs.ack([Settle(task.ref, 2)]) == {new.id: SettleOutcome.STALE_FENCING_TOKEN}
    update = await runs.extend_leases([Beat(task.ref, 1, b'{"row": 7}')], lease_s=60)
    assert update.extended == {new.id}
    stale = await runs.extend_leases([Beat(task.ref, 9, None)], lease_s=60)
    assert stale.extended == frozenset()
    row = await _row(store, new.id)
    assert row["status"] == "RUNNING" and bytes(row["checkpoint"]) == b'{"row": 7}'
    outcome = (await runs.complete([Completion(task.ref, 1, '{"sent": true}')])).outcomes
    assert outcome == {new.id: SettleOutcome.OK}
    row = await _row(store, new.id)
    assert row["status"] == "COMPLETED" and row["result_payload"] == {"sent": True}
    # Completion is idempotent for the winning token, refused for any other.
    assert (await runs.complete([Completion(task.ref, 1, None)])).outcomes == {
        new.id: SettleOutcome.OK
    }
    assert (await runs.complete([Completion(task.ref, 0, None)])).outcomes == {
        new.id: SettleOutcome.STALE_FENCING_TOKEN
    }
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT job_id, count(*) FROM task_completions WHERE task_id = %s GROUP BY job_id",
            (new.id,),
        )
        assert await cur.fetchall() == [("nightly-report", 1)]
    [attempt] = await store.get_attempts(new.id)
    assert attempt.state is AttemptState.SUCCEEDED and attempt.finished_at is not None


async def test_a_stale_completion_changes_nothing(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant)
    [first] = await _dispatch(runs, "zombie")
    # The first attempt is given back and dispatched again: token 2 owns the task now.
    outcomes, ready = await runs.release(
        [Release(first.ref, 1, None, AttemptState.ABANDONED, "lease expired")]
    )
    assert outcomes == {new.id: SettleOutcome.OK} and [t.id for t in ready] == [new.id]
    result = await runs.write_intents({SHARD: EPOCH}, [Intent(ready[0], "w2")], 30)
    [second] = result.dispatched
    assert second.fencing_token == 2
    before = await _row(store, new.id)
    assert (await runs.complete([Completion(first.ref, 1, '{"zombie": 1}')])).outcomes == {
        new.id: SettleOutcome.STALE_FENCING_TOKEN
    }
    assert await _row(store, new.id) == before


async def test_failures_retry_with_backoff_then_dead_letter(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant, max_retries=1, backoff_initial_s=0.01, backoff_max_s=0.02)
    [task] = await _dispatch(runs)
    result = await runs.fail([Failure(task.ref, 1, "boom", ERROR)], datetime.now(UTC))
    assert result.outcomes == {new.id: SettleOutcome.OK}
    assert [shard for shard, _ in result.due] == [SHARD]
    row = await _row(store, new.id)
    assert (row["status"], row["retry_count"], row["last_error"]) == ("RETRYING", 1, "boom")
    assert row["scheduled_at"] == new.scheduled_at and row["due_at"] > new.due_at
    [task] = await _dispatch(runs)
    assert task.attempt == 2 and task.fencing_token == 2
    result = await runs.fail([Failure(task.ref, 2, "boom again", ERROR)], datetime.now(UTC))
    assert result.due == []
    row = await _row(store, new.id)
    assert row["status"] == "DEAD_LETTER" and row["finished_at"] is not None
    states = [a.state for a in await store.get_attempts(new.id)]
    assert states == [AttemptState.FAILED, AttemptState.FAILED]
    # A repeat of the same failure report is OK; an old token's is stale.
    again = await runs.fail([Failure(task.ref, 2, "boom again", ERROR)], datetime.now(UTC))
    assert again.outcomes == {new.id: SettleOutcome.OK}


async def test_release_keeps_the_retry_budget_and_stores_the_checkpoint(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    new = await submit(store, tenant)
    [task] = await _dispatch(runs)
    await runs.ack([Settle(task.ref, 1)])
    outcomes, ready = await runs.release(
        [Release(task.ref, 1, b'{"offset": 500}', AttemptState.RELEASED, "draining")]
    )
    assert outcomes == {new.id: SettleOutcome.OK}
    assert isinstance(ready[0], TimerTask) and ready[0].id == new.id
    row = await _row(store, new.id)
    assert row["status"] == "PRELOADED" and row["retry_count"] == 0
    assert bytes(row["checkpoint"]) == b'{"offset": 500}'
    [redispatched] = (
        await runs.write_intents({SHARD: EPOCH}, [Intent(ready[0], "w2")], 30)
    ).dispatched
    assert bytes(redispatched.checkpoint or b"") == b'{"offset": 500}'
    states = [a.state for a in await store.get_attempts(new.id)]
    assert states == [AttemptState.RELEASED, AttemptState.DISPATCHED]


async def test_unknown_task_is_not_found(runs: RunStore) -> None:
    ghost = Settle(TaskRef(datetime.now(UTC), uuid.uuid4()), 1)
    assert await runs.ack([ghost]) == {ghost.ref.id: SettleOutcome.TASK_NOT_FOUND}


async def test_a_warm_handoff_reads_without_writing_and_no_task_is_dispatched_twice(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    """The incoming owner reads the shard's near rows while the old owner still owns it
    and dispatches; after the claim its intents skip whatever the old owner took."""
    soon = [await submit(store, tenant, due_in_s=1 + i) for i in range(5)]
    far = await submit(store, tenant, due_in_s=3600)
    minute = datetime.now(UTC) + timedelta(minutes=1)
    preloaded, _ = await runs.load_due({SHARD: EPOCH}, minute, 100)
    late_submit = await submit(store, tenant, due_in_s=2.5)  # not preloaded yet
    horizon = datetime.now(UTC) + timedelta(seconds=10)

    staged: list[TimerTask] = []
    after = None
    while True:
        page = await runs.read_warm(SHARD, horizon, after, limit=2)
        staged += page
        if len(page) < 2:
            break
        after = (page[-1].due_at, page[-1].id)
    assert [t.id for t in staged] == [
        t.id for t in sorted([*soon, late_submit], key=lambda t: (t.due_at, t.id))
    ]
    assert far.id not in {t.id for t in staged}
    assert (await _row(store, late_submit.id))["status"] == "SCHEDULED"  # read, not moved
    assert {(await _row(store, t.id))["status"] for t in soon} == {"PRELOADED"}

    # The old owner dispatches two more before it lets go; then the new owner claims.
    by_id = {t.id: t for t in preloaded}
    old = await runs.write_intents(
        {SHARD: EPOCH}, [Intent(by_id[soon[0].id], "w1"), Intent(by_id[soon[1].id], "w1")], 30
    )
    assert len(old.dispatched) == 2
    assert await store.claim_shard_epoch(SHARD, EPOCH + 1, "node-b")
    too_late = await runs.write_intents({SHARD: EPOCH}, [Intent(by_id[soon[2].id], "w1")], 30)
    assert too_late.dispatched == [] and too_late.lost_shards == {SHARD}

    new = await runs.write_intents({SHARD: EPOCH + 1}, [Intent(t, "w2") for t in staged], 30)
    assert sorted(t.id for t in new.dispatched) == sorted(t.id for t in soon[2:])
    assert {t.fencing_token for t in new.dispatched} == {1}
    async with store.connection() as conn:
        cur = await conn.execute(
            "SELECT task_id, epoch FROM task_attempts WHERE task_id = ANY(%s)",
            ([t.id for t in soon],),
        )
        epochs = dict(await cur.fetchall())
    assert epochs == {
        **{t.id: EPOCH for t in soon[:2]},
        **{t.id: EPOCH + 1 for t in soon[2:]},
    }


async def test_a_claimed_shard_reloads_nearest_first_in_chunks_and_unloads_the_rest(
    store: Store, runs: RunStore, tenant: Tenant
) -> None:
    tasks = [await submit(store, tenant, due_in_s=50 - i) for i in range(5)]
    await runs.load_due({SHARD: EPOCH}, datetime.now(UTC) + timedelta(minutes=1), 100)
    order = [t.id for t in sorted(tasks, key=lambda t: (t.due_at, t.id))]
    first = await runs.load_preloaded({SHARD: EPOCH}, limit=2)
    assert [t.id for t in first] == order[:2]
    cursor = (first[-1].due_at, first[-1].id)
    second = await runs.load_preloaded({SHARD: EPOCH}, after=cursor, limit=2)
    assert [t.id for t in second] == order[2:4]
    # Past the memory cap: what was not loaded goes back to SCHEDULED, nothing else.
    assert await runs.unload_preloaded({SHARD: EPOCH}, after=cursor) == 3
    statuses = [(await _row(store, i))["status"] for i in order]
    assert statuses == ["PRELOADED", "PRELOADED", "SCHEDULED", "SCHEDULED", "SCHEDULED"]
    assert await runs.load_preloaded({SHARD: EPOCH + 1}) == []  # not our epoch

"""The store against a real PostgreSQL: submit (atomicity, idempotency under
concurrency), reads, and the shard epoch fence."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from fixtures.stores import insert_tasks, new_tenant, prepared_task
from fixtures.waiting import eventually

from chronoshard.scheduler.core import states
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import (
    NewTask,
    PreparedTask,
    Priority,
    SubmitResult,
    Task,
    Tenant,
)
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.core.states import AttemptState, TaskEvent, TaskStatus
from chronoshard.scheduler.errors import (
    CommitOutcomeUnknown,
    IdempotencyConflict,
    InvalidArgument,
    StoreUnavailable,
    TenantNotFound,
)
from chronoshard.scheduler.store.database import Store, _has_input
from chronoshard.scheduler.store.runs import RunStore
from chronoshard.scheduler.store.submits import SubmitStore

SHARDS = 64
NOW = datetime.now(UTC).replace(microsecond=123456)


# Its own builder, not fixtures.stores.new_task: the assertions here compare a task's
# every field against one fixed instant (NOW), on shards spread as submits spread them.
def make_task(**overrides: Any) -> NewTask:
    task_id = new_task_id()
    fields: dict[str, Any] = {
        "id": task_id,
        "type": "send_report",
        "scheduled_at": NOW,
        "due_at": NOW,
        "shard": shard_of(task_id, SHARDS),
        "payload": {"to": "ops@example.com", "n": 3},
        "jitter_mode": JitterMode.NONE,
    }
    fields.update(overrides)
    return NewTask(**fields)


async def _counts(dsn: str, tenant_id: uuid.UUID) -> tuple[int, int]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM tasks WHERE tenant_id = %(t)s),"
            " (SELECT count(*) FROM idempotency_keys WHERE tenant_id = %(t)s)",
            {"t": tenant_id},
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# --- submit and read --------------------------------------------------------------------


async def test_insert_then_get_returns_the_row_as_submitted(store: Store, tenant: Tenant) -> None:
    first = make_task(
        priority=Priority.CRITICAL,
        queue="reports.eu",
        max_retries=5,
        timeout_s=30.0,
        idempotent=True,
        job_id="nightly-report",
        trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        due_at=NOW + timedelta(seconds=17),
    )
    second = make_task(scheduled_at=NOW + timedelta(days=3), payload={})

    results = await insert_tasks(store, tenant.id, [first, second])

    assert [r.created for r in results] == [True, True]
    assert [r.task.id for r in results] == [first.id, second.id]
    got = await store.get_task(tenant.id, first.id)
    assert got == results[0].task
    assert got is not None
    assert got.tenant_id == tenant.id
    assert got.status is TaskStatus.SCHEDULED
    assert (got.scheduled_at, got.due_at) == (first.scheduled_at, first.due_at)
    assert got.payload == first.payload
    assert got.priority is Priority.CRITICAL
    assert (got.queue, got.max_retries, got.timeout_s) == ("reports.eu", 5, 30.0)
    assert (got.idempotent, got.job_id, got.trace_context) == (
        True,
        "nightly-report",
        first.trace_context,
    )
    assert (got.attempt, got.fencing_token, got.retry_count) == (0, 0, 0)
    assert got.scheduled_at.utcoffset() == timedelta(0)
    assert await store.get_task(tenant.id, second.id) == results[1].task


async def test_another_tenants_task_is_not_found(store: Store, tenant: Tenant) -> None:
    other = await new_tenant(store)
    task = make_task()
    await insert_tasks(store, tenant.id, [task])

    assert await store.get_task(other.id, task.id) is None
    assert await store.get_task(tenant.id, new_task_id()) is None


async def test_get_attempts_in_order(store: Store, tenant: Tenant, db_dsn: str) -> None:
    task = make_task()
    await insert_tasks(store, tenant.id, [task])
    assert await store.get_attempts(task.id) == []
    async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
        for attempt, state in ((2, "RUNNING"), (1, "ABANDONED")):
            await conn.execute(
                "INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token,"
                " state, worker_id) VALUES (%s, %s, %s, %s, %s, 'w1')",
                (task.id, attempt, task.scheduled_at, attempt, state),
            )

    attempts = await store.get_attempts(task.id)

    assert [(a.attempt, a.state) for a in attempts] == [
        (1, AttemptState.ABANDONED),
        (2, AttemptState.RUNNING),
    ]


# --- refused batches: typed error, nothing written -------------------------------------
# (A field's validity is the wire's alone: tests/unit/test_task_requests.py and the API's
# tests/integration/test_api.py. The store refuses only what needs the database.)


async def test_unknown_tenant_raises_and_writes_nothing(store: Store, db_dsn: str) -> None:
    ghost = uuid.uuid4()
    with pytest.raises(TenantNotFound):
        await insert_tasks(store, ghost, [make_task(idempotency_key="k"), make_task()])
    assert await _counts(db_dsn, ghost) == (0, 0)


async def test_duplicate_ids_in_one_batch_are_refused(store: Store, tenant: Tenant) -> None:
    task = make_task()
    with pytest.raises(InvalidArgument) as caught:
        await insert_tasks(store, tenant.id, [task, task])
    assert caught.value.field == "id"


async def _streamed(
    store: Store, tenant_id: uuid.UUID, chunks: list[list[NewTask]], *, then: Exception | None
) -> list[SubmitResult]:
    """``chunks`` through :meth:`SubmitStore.insert_streamed`; ``then`` is raised by the
    chunks' producer after the last one was handed over (as a submit rate refused after
    validation would be)."""

    async def produce() -> AsyncIterator[list[PreparedTask]]:
        for chunk in chunks:
            yield [prepared_task(t) for t in chunk]
        if then is not None:
            raise then

    return await SubmitStore(store).insert_streamed(tenant_id, produce())


async def test_a_streamed_batch_refused_after_its_chunks_were_sent_writes_nothing(
    store: Store, tenant: Tenant, db_dsn: str
) -> None:
    chunks = [[make_task(), make_task()], [make_task()]]
    refusal = InvalidArgument("tasks[3].type", "is required")
    with pytest.raises(InvalidArgument) as caught:
        await _streamed(store, tenant.id, chunks, then=refusal)
    assert caught.value is refusal
    assert await _counts(db_dsn, tenant.id) == (0, 0)

    results = await _streamed(store, tenant.id, chunks, then=None)
    assert [r.task.id for r in results] == [t.id for chunk in chunks for t in chunk]
    assert await _counts(db_dsn, tenant.id) == (3, 0)


@pytest.mark.parametrize("fault", ["repeated id", "key", "unknown tenant"])
async def test_a_streamed_batch_refuses_what_it_cannot_write_and_writes_nothing(
    store: Store, tenant: Tenant, db_dsn: str, fault: str
) -> None:
    first = make_task()
    tenant_id = uuid.uuid4() if fault == "unknown tenant" else tenant.id
    last = {
        "repeated id": first,
        "key": make_task(idempotency_key="k"),
        "unknown tenant": make_task(),
    }[fault]
    expected = TenantNotFound if fault == "unknown tenant" else InvalidArgument
    with pytest.raises(expected):
        await _streamed(store, tenant_id, [[first, make_task()], [last]], then=None)
    assert await _counts(db_dsn, tenant_id) == (0, 0)


async def test_conflict_on_the_last_item_rolls_back_the_whole_batch(
    store: Store, tenant: Tenant, db_dsn: str
) -> None:
    original = make_task(idempotency_key="report-42")
    await insert_tasks(store, tenant.id, [original])
    before = await _counts(db_dsn, tenant.id)
    batch = [
        make_task(idempotency_key="fresh-1"),
        make_task(),
        make_task(idempotency_key="report-42", payload={"different": True}),
    ]

    with pytest.raises(IdempotencyConflict):
        await insert_tasks(store, tenant.id, batch)

    assert await _counts(db_dsn, tenant.id) == before
    assert await store.get_task(tenant.id, batch[0].id) is None


# --- idempotency ------------------------------------------------------------------------


async def test_repeat_with_the_same_request_returns_the_original(
    store: Store, tenant: Tenant, db_dsn: str
) -> None:
    original = make_task(idempotency_key="nightly:2026-01-01")
    [first] = await insert_tasks(store, tenant.id, [original])
    # The server gives a repeat a new id, hence a new shard: still the same request.
    repeat = make_task(idempotency_key="nightly:2026-01-01")
    assert repeat.id != original.id

    [again] = await insert_tasks(store, tenant.id, [repeat])

    assert first.created and not again.created
    assert again.task == first.task
    assert await store.get_task(tenant.id, repeat.id) is None
    assert await _counts(db_dsn, tenant.id) == (1, 1)


async def test_repeat_inside_one_batch_returns_the_first(store: Store, tenant: Tenant) -> None:
    a = make_task(idempotency_key="dup")
    b = make_task(idempotency_key="dup")
    other = make_task(idempotency_key="other")

    results = await insert_tasks(store, tenant.id, [a, other, b])

    assert [r.created for r in results] == [True, True, False]
    assert results[2].task.id == a.id


async def test_same_key_for_a_different_request_names_the_original(
    store: Store, tenant: Tenant
) -> None:
    original = make_task(idempotency_key="k1")
    await insert_tasks(store, tenant.id, [original])

    with pytest.raises(IdempotencyConflict) as caught:
        await insert_tasks(
            store,
            tenant.id,
            [make_task(idempotency_key="k1", scheduled_at=NOW + timedelta(hours=1))],
        )

    assert caught.value.original_task_id == original.id
    assert caught.value.key == "k1"


async def test_keys_are_per_tenant(store: Store, tenant: Tenant) -> None:
    other = await new_tenant(store)
    mine = await insert_tasks(store, tenant.id, [make_task(idempotency_key="shared")])
    theirs = await insert_tasks(store, other.id, [make_task(idempotency_key="shared")])
    assert mine[0].created and theirs[0].created
    assert mine[0].task.id != theirs[0].task.id


async def test_concurrent_double_submit_creates_exactly_one_task(
    db_dsn: str, tenant: Tenant
) -> None:
    async with (
        await Store.open(db_dsn, 1, 2) as left,
        await Store.open(db_dsn, 1, 2) as right,
    ):
        for round_ in range(8):
            key = f"race-{round_}"
            a, b = make_task(idempotency_key=key), make_task(idempotency_key=key)

            ra, rb = await asyncio.gather(
                insert_tasks(left, tenant.id, [a]), insert_tasks(right, tenant.id, [b])
            )

            assert sorted([ra[0].created, rb[0].created]) == [False, True]
            assert ra[0].task.id == rb[0].task.id
            assert ra[0].task.id in (a.id, b.id)
            async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM tasks WHERE tenant_id = %s AND idempotency_key = %s",
                    (tenant.id, key),
                )
                assert await cur.fetchone() == (1,)


async def test_concurrent_conflicting_submits_one_wins_one_is_refused(
    db_dsn: str, tenant: Tenant
) -> None:
    async with (
        await Store.open(db_dsn, 1, 2) as left,
        await Store.open(db_dsn, 1, 2) as right,
    ):
        for round_ in range(4):
            key = f"conflict-{round_}"
            a = make_task(idempotency_key=key, payload={"side": "a"})
            b = make_task(idempotency_key=key, payload={"side": "b"})

            outcomes = await asyncio.gather(
                insert_tasks(left, tenant.id, [a]),
                insert_tasks(right, tenant.id, [b]),
                return_exceptions=True,
            )

            won = [o for o in outcomes if isinstance(o, list)]
            lost = [o for o in outcomes if isinstance(o, IdempotencyConflict)]
            assert len(won) == 1 and len(lost) == 1, outcomes
            assert lost[0].original_task_id == won[0][0].task.id


# --- shards: epochs, preload, status moves -----------------------------------------------


async def _shard_row(dsn: str, shard: int) -> tuple[int, str] | None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT epoch, node_id FROM shard_owners WHERE shard = %s", (shard,)
        )
        row = await cur.fetchone()
    return None if row is None else (int(row[0]), str(row[1]))


async def test_claim_shard_epoch_only_moves_forward(store: Store, db_dsn: str) -> None:
    shard = 901
    assert await store.claim_shard_epoch(shard, 5, "node-a")
    assert not await store.claim_shard_epoch(shard, 4, "node-b")
    assert not await store.claim_shard_epoch(shard, 5, "node-b")
    assert await _shard_row(db_dsn, shard) == (5, "node-a")
    # The same claim again (a retry after an unknown commit outcome) still holds.
    assert await store.claim_shard_epoch(shard, 5, "node-a")
    assert await store.claim_shard_epoch(shard, 6, "node-b")
    assert await _shard_row(db_dsn, shard) == (6, "node-b")
    assert not await store.claim_shard_epoch(shard, 5, "node-a")


def test_preload_sql_matches_the_state_machine() -> None:
    # load_due spells its source states literally (to match the partial index); they
    # must be exactly the states the machine lets the preloader move to PRELOADED.
    moves = {TaskEvent.PRELOAD, TaskEvent.BACKOFF_ELAPSED}
    sources = set().union(*(states.sources(e) for e in moves))
    assert sources == {TaskStatus.SCHEDULED, TaskStatus.RETRYING}
    assert {states.transition(s, e) for e in moves for s in states.sources(e)} == {
        TaskStatus.PRELOADED
    }


async def _set_status(dsn: str, task: NewTask, status: TaskStatus) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE tasks SET status = %s WHERE scheduled_at = %s AND id = %s",
            (status.value, task.scheduled_at, task.id),
        )


async def _status(store: Store, tenant: Tenant, task: NewTask) -> TaskStatus:
    found = await store.get_task(tenant.id, task.id)
    assert found is not None
    return found.status


async def test_load_due_moves_only_due_rows_of_the_shard(
    store: Store, tenant: Tenant, db_dsn: str
) -> None:
    shard, epoch = 902, 7
    horizon = NOW + timedelta(minutes=60)

    def on_shard(**kw: Any) -> NewTask:
        return make_task(shard=shard, **kw)

    due = on_shard(due_at=NOW - timedelta(seconds=5))
    retrying = on_shard(due_at=NOW + timedelta(minutes=10))
    later = on_shard(due_at=horizon + timedelta(seconds=1))
    other_shard = make_task(shard=903, due_at=NOW)
    running = on_shard(due_at=NOW)
    blocked = on_shard(due_at=NOW, unresolved_dependencies=1)
    # Scheduled in a later partition but due now (a retry moved due_at): still found.
    future_partition = on_shard(scheduled_at=NOW + timedelta(days=2), due_at=NOW)
    everything = [due, retrying, later, other_shard, running, blocked, future_partition]
    await insert_tasks(store, tenant.id, everything)
    await _set_status(db_dsn, retrying, TaskStatus.RETRYING)
    await _set_status(db_dsn, running, TaskStatus.RUNNING)
    assert await store.claim_shard_epoch(shard, epoch, "node-a")
    runs = RunStore(store)

    loaded, lost = await runs.load_due({shard: epoch}, horizon, 100)

    assert not lost
    assert {t.id for t in loaded} == {due.id, retrying.id, future_partition.id}
    expected = {
        due.id: TaskStatus.PRELOADED,
        retrying.id: TaskStatus.PRELOADED,
        future_partition.id: TaskStatus.PRELOADED,
        later.id: TaskStatus.SCHEDULED,
        other_shard.id: TaskStatus.SCHEDULED,
        running.id: TaskStatus.RUNNING,
        blocked.id: TaskStatus.SCHEDULED,
    }
    assert {t.id: await _status(store, tenant, t) for t in everything} == expected
    assert await runs.load_due({shard: epoch}, horizon, 100) == ([], frozenset())


async def test_load_due_takes_the_earliest_up_to_the_limit(store: Store, tenant: Tenant) -> None:
    shard, epoch = 904, 1
    tasks = [make_task(shard=shard, due_at=NOW - timedelta(seconds=s)) for s in range(5)]
    await insert_tasks(store, tenant.id, tasks)
    await store.claim_shard_epoch(shard, epoch, "node-a")

    first, _ = await RunStore(store).load_due({shard: epoch}, NOW + timedelta(seconds=1), 2)

    # The earliest two (the wheel orders them; the statement need not).
    assert {t.id for t in first} == {tasks[4].id, tasks[3].id}


async def test_a_stale_epoch_is_reported_lost_and_changes_nothing(
    store: Store, tenant: Tenant
) -> None:
    shard = 905
    task = make_task(shard=shard, due_at=NOW - timedelta(seconds=1))
    await insert_tasks(store, tenant.id, [task])
    horizon = NOW + timedelta(minutes=1)
    runs = RunStore(store)

    assert await runs.load_due({shard: 1}, horizon, 10) == ([], {shard})  # never claimed
    await store.claim_shard_epoch(shard, 1, "node-a")
    await store.claim_shard_epoch(shard, 2, "node-b")
    assert await runs.load_due({shard: 1}, horizon, 10) == ([], {shard})

    assert await _status(store, tenant, task) is TaskStatus.SCHEDULED
    loaded, lost = await runs.load_due({shard: 2}, horizon, 10)
    assert [t.id for t in loaded] == [task.id] and not lost


async def test_the_fence_keeps_only_the_shards_whose_epoch_is_the_callers(store: Store) -> None:
    await store.claim_shard_epoch(912, 3, "node-a")
    await store.claim_shard_epoch(913, 5, "node-b")
    async with store.transaction() as conn:
        owned = await store.owned_shards(conn, {912: 3, 913: 4, 914: 1})
    assert owned == {912}


async def _wait_for_lock_waiter(dsn: str, deadline_s: float = 10.0) -> None:
    """Poll until some session of this database waits on a heavyweight lock."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while loop.time() < end:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            row = await cur.fetchone()
            if row is not None and row[0] > 0:
                return
            await asyncio.sleep(0.02)
    raise AssertionError("no session ever waited on a lock")


async def test_a_new_claim_waits_for_the_old_owners_open_write(store: Store, db_dsn: str) -> None:
    # The fence of docs/architecture.md#d5: the claim cannot commit while a write of the old epoch
    # is in flight, so no write of the old owner can land after the new owner took over.
    shard = 911
    await store.claim_shard_epoch(shard, 1, "node-a")
    async with await Store.open(db_dsn, 1, 1) as newcomer:
        async with store.transaction() as conn:
            assert await store.owned_shards(conn, {shard: 1}) == {shard}
            claim = asyncio.create_task(newcomer.claim_shard_epoch(shard, 2, "node-b"))
            await _wait_for_lock_waiter(db_dsn)
            assert not claim.done()
        assert await claim
    async with store.transaction() as conn:
        assert await store.owned_shards(conn, {shard: 1}) == set()


async def test_open_against_an_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        await Store.open("postgresql://postgres@127.0.0.1:1/x", 1, 1, open_timeout_s=1.0)


async def test_task_has_a_field_for_every_tasks_column(db_dsn: str) -> None:
    # Rows are read with SELECT * and picked by Task's fields: a column without a field
    # would silently never reach callers, a field without a column fails every read.
    async with await psycopg.AsyncConnection.connect(db_dsn) as conn:
        cur = await conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name = 'tasks'"
        )
        columns = {str(row[0]) for row in await cur.fetchall()}
    assert {f.name for f in dataclasses.fields(Task)} == columns


async def test_a_self_committing_statement_the_server_refuses_is_unavailable_not_unknown(
    store: Store,
) -> None:
    """The server answered (the connection lives on): the statement rolled back, so the
    caller may retry it; only a connection that broke leaves the outcome unknown (that
    case: test_commit_outcome)."""
    with pytest.raises(StoreUnavailable) as raised:
        async with store.self_committing() as conn:
            await conn.execute("SET statement_timeout = 10")
            await conn.execute("SELECT pg_sleep(1)")
    assert not isinstance(raised.value, CommitOutcomeUnknown)
    assert isinstance(raised.value.__cause__, psycopg.errors.QueryCanceled)


async def test_a_pooled_connection_the_server_ended_is_never_handed_out(db_dsn: str) -> None:
    """The pool's check looks for input on an idle connection instead of a round trip
    (database.check_pooled): a backend the server ended has said so (FATAL, then EOF),
    and the pool must take another connection rather than fail the statement."""
    async with await Store.open(db_dsn, min_size=1, max_size=1) as store:
        async with store.connection() as conn:
            pid = conn.info.backend_pid
            assert not _has_input(conn), "a healthy idle connection has nothing to read"
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

            async def gone() -> bool:
                cur = await admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
                return await cur.fetchone() is None

            await eventually(gone, timeout_s=10, what=f"backend {pid} gone")
        async with store.connection() as conn:
            assert conn.info.backend_pid != pid
            await conn.execute("SELECT 1")


async def test_a_pipelined_transaction_commits_what_it_queued_and_reads_its_results(
    store: Store,
) -> None:
    shard = 915
    await store.claim_shard_epoch(shard, 1, "node-a")
    async with store.pipelined_transaction() as conn:
        fence = await store.fence(conn, {shard: 1, 916: 1})
        queued = await conn.execute(
            "UPDATE shard_owners SET node_id = 'node-b' WHERE shard = %s RETURNING epoch",
            (shard,),
        )
        # Reading the fence sends both statements (one round trip) and answers it.
        assert await fence.owned() == {shard}
        assert await queued.fetchall() == [(1,)]
    async with store.connection() as conn:
        cur = await conn.execute("SELECT node_id FROM shard_owners WHERE shard = %s", (shard,))
        assert await cur.fetchall() == [("node-b",)]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


async def test_a_pipelined_transaction_writes_nothing_when_a_statement_fails(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A statement that fails makes the server skip the rest of the pipeline: the error is
    raised where its result (or the COMMIT's) is read, the transaction rolls back, and the
    connection goes back to the pool idle, as with ``transaction`` (the pool would roll
    back a connection returned in a transaction, with a warning: none may come)."""
    shard = 917
    await store.claim_shard_epoch(shard, 1, "node-a")
    with pytest.raises(psycopg.errors.DivisionByZero):
        async with store.pipelined_transaction() as conn:
            await conn.execute("UPDATE shard_owners SET node_id = 'x' WHERE shard = %s", (shard,))
            await conn.execute("SELECT 1 / 0")  # never read: the COMMIT's sync raises it
    with pytest.raises(StoreUnavailable) as raised:
        async with store.pipelined_transaction() as conn:
            await conn.execute("UPDATE shard_owners SET node_id = 'y' WHERE shard = %s", (shard,))
            await conn.execute("SET LOCAL statement_timeout = 10")
            await (await conn.execute("SELECT pg_sleep(1)")).fetchall()
    assert isinstance(raised.value.__cause__, psycopg.errors.QueryCanceled)
    assert not isinstance(raised.value, CommitOutcomeUnknown)
    with pytest.raises(RuntimeError):
        async with store.pipelined_transaction() as conn:
            await conn.execute("UPDATE shard_owners SET node_id = 'z' WHERE shard = %s", (shard,))
            raise RuntimeError("the block itself fails")
    async with store.connection() as conn:
        cur = await conn.execute("SELECT node_id FROM shard_owners WHERE shard = %s", (shard,))
        assert await cur.fetchall() == [("node-a",)]
    assert not [r for r in caplog.records if "returned connection" in r.getMessage()]

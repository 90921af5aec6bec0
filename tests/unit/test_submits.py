"""Submits in batches: key resolution and column arrays (pure), and the group-commit
coalescer's batching and error routing, driven against an in-memory store."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from fixtures.loop import one_loop_turn
from fixtures.stores import prepared_task

from chronoshard.scheduler.api.tasks import submit_committer
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import (
    NewTask,
    PreparedTask,
    SubmitResult,
    Task,
    TaskRef,
)
from chronoshard.scheduler.core.states import TaskStatus
from chronoshard.scheduler.dispatch.group_commit import GroupCommitter
from chronoshard.scheduler.errors import (
    IdempotencyConflict,
    SchedulerError,
    StoreUnavailable,
    TenantNotFound,
)
from chronoshard.scheduler.store.submits import (
    KeyOwner,
    Request,
    insert_params,
    keyed_in_claim_order,
    resolve_keys,
)

AT = datetime(2030, 1, 1, tzinfo=UTC)
TENANT_A = uuid.UUID(int=1)
TENANT_B = uuid.UUID(int=2)


def prepared(key: str | None = None, payload: dict[str, Any] | None = None) -> PreparedTask:
    task = NewTask(
        id=new_task_id(),
        type="t",
        scheduled_at=AT,
        due_at=AT,
        shard=0,
        payload=payload if payload is not None else {"v": 1},
        idempotency_key=key,
        jitter_mode=JitterMode.NONE,
    )
    return prepared_task(task)


def owner_of(p: PreparedTask) -> KeyOwner:
    return KeyOwner(p.new.id, p.new.scheduled_at, p.fingerprint)


# --- pure -------------------------------------------------------------------------------


def test_claim_order_is_by_tenant_then_key_and_keeps_first_occurrences_first() -> None:
    b_x, a_y, a_x1, a_x2 = prepared("x"), prepared("y"), prepared("x"), prepared("x")
    plain = prepared()
    requests: list[Request] = [
        (TENANT_B, b_x),
        (TENANT_A, a_y),
        (TENANT_A, plain),
        (TENANT_A, a_x1),
        (TENANT_A, a_x2),
    ]
    ordered = keyed_in_claim_order(requests)
    assert [p for _, p in ordered] == [a_x1, a_x2, a_y, b_x]


def test_resolve_keys_own_repeat_conflict_and_no_key() -> None:
    mine, repeat, other = prepared("k1"), prepared("k2"), prepared("k3", {"v": 2})
    plain = prepared()
    earlier_same = prepared("k2")  # same request as `repeat`, written earlier
    earlier_other = prepared("k3", {"v": 1})  # same key, different payload
    owners = {
        (TENANT_A, "k1"): owner_of(mine),
        (TENANT_A, "k2"): owner_of(earlier_same),
        (TENANT_A, "k3"): owner_of(earlier_other),
    }
    resolutions = resolve_keys(
        [(TENANT_A, mine), (TENANT_A, repeat), (TENANT_A, other), (TENANT_A, plain)], owners
    )
    assert resolutions[0] is None
    assert resolutions[1] == TaskRef(AT, earlier_same.new.id)
    conflict = resolutions[2]
    assert isinstance(conflict, IdempotencyConflict)
    assert (conflict.key, conflict.original_task_id) == ("k3", earlier_other.new.id)
    assert resolutions[3] is None


def test_resolve_keys_scopes_keys_by_tenant() -> None:
    a, b = prepared("k"), prepared("k", {"v": 9})
    owners = {(TENANT_A, "k"): owner_of(a), (TENANT_B, "k"): owner_of(b)}
    assert resolve_keys([(TENANT_A, a), (TENANT_B, b)], owners) == [None, None]


def test_insert_params_are_parallel_arrays_in_request_order() -> None:
    first, second = prepared("k"), prepared(payload={"x": [1, 2]})
    statement, columns = insert_params([(TENANT_A, first), (TENANT_B, second)])
    assert statement == "insert_tasks"
    lengths = {len(values) for values in columns.values()}
    assert lengths == {2}
    assert columns["id"] == [first.new.id, second.new.id]
    assert columns["tenant_id"] == [TENANT_A, TENANT_B]
    assert columns["idempotency_key"] == ["k", None]
    assert columns["payload"] == [first.payload_json, second.payload_json]
    assert columns["jitter_mode"] == ["NONE", "NONE"]
    assert columns["trace_context"] == [None, None]


def test_insert_params_of_one_request_are_the_batch_columns_as_scalars() -> None:
    # A lone submit takes the scalar statement; its values must be exactly what the batch
    # statement would have unnested for it.
    one = prepared("k", {"x": [1, 2]})
    statement, row = insert_params([(TENANT_A, one)])
    assert statement == "insert_task"
    _, columns = insert_params([(TENANT_A, one), (TENANT_B, prepared())])
    assert row == {name: values[0] for name, values in columns.items()}


# --- the coalescer, against an in-memory store ------------------------------------------


def _task(tenant_id: uuid.UUID, p: PreparedTask) -> Task:
    """The row the database would return for ``p`` (columns it fills are None/zero)."""
    fields = {name: getattr(p.new, name, None) for name in Task.__dataclass_fields__}
    fields.update(
        tenant_id=tenant_id,
        status=TaskStatus.SCHEDULED,
        fencing_token=0,
        retry_count=0,
        attempt=0,
        created_at=AT,
        updated_at=AT,
    )
    return Task(**fields)


class FakeStore:
    """A SubmitStore that writes nothing; answers each request, records the batches it
    was given."""

    def __init__(self) -> None:
        self.batches: list[list[Request]] = []
        self.singles: list[Request] = []
        self.fail_batch: BaseException | None = None
        self.bad_ids: set[uuid.UUID] = set()
        self.unknown_tenants: set[uuid.UUID] = set()

    async def insert_each(self, requests: Sequence[Request]) -> list[SubmitResult | SchedulerError]:
        self.batches.append(list(requests))
        await one_loop_turn()
        if self.fail_batch is not None:
            raise self.fail_batch
        if any(p.new.id in self.bad_ids for _, p in requests):
            raise ValueError("a row the database refuses")
        return [self._one(t, p) for t, p in requests]

    async def insert_tasks(
        self, tenant_id: uuid.UUID, prepared: Sequence[PreparedTask]
    ) -> list[SubmitResult]:
        [p] = prepared
        self.singles.append((tenant_id, p))
        if p.new.id in self.bad_ids:
            raise ValueError("a row the database refuses")
        outcome = self._one(tenant_id, p)
        if isinstance(outcome, SchedulerError):
            raise outcome
        return [outcome]

    def _one(self, tenant_id: uuid.UUID, p: PreparedTask) -> SubmitResult | SchedulerError:
        if tenant_id in self.unknown_tenants:
            return TenantNotFound(tenant_id)
        return SubmitResult(_task(tenant_id, p), created=True)


@contextlib.asynccontextmanager
async def coalescer(
    store: FakeStore, **kwargs: Any
) -> AsyncIterator[GroupCommitter[Request, SubmitResult]]:
    """The TaskService's submit group commit over ``store``, started and stopped."""
    committer = submit_committer(store, **kwargs)  # type: ignore[arg-type]
    committer.start()
    try:
        yield committer
    finally:
        await committer.stop()


async def test_concurrent_submits_share_one_batch_and_get_their_own_task() -> None:
    store = FakeStore()
    async with coalescer(store, linger_s=0.001) as submits:
        requests = [prepared() for _ in range(10)]
        results = await asyncio.gather(*(submits.submit((TENANT_A, p)) for p in requests))
        assert [r.task.id for r in results] == [p.new.id for p in requests]
        assert [len(b) for b in store.batches] == [10]
        stats = submits.get_stats()
        assert (stats["batches"], stats["requests"], stats["isolated"]) == (1, 10, 0)


async def test_batches_are_capped_and_a_later_submit_is_a_batch_of_its_own() -> None:
    store = FakeStore()
    async with coalescer(store, linger_s=0, max_batch=4) as submits:
        await asyncio.gather(*(submits.submit((TENANT_A, prepared())) for _ in range(10)))
        assert [len(b) for b in store.batches] == [4, 4, 2]
        # The queue drained; a later submit is a batch of its own.
        await submits.submit((TENANT_A, prepared()))
        assert [len(b) for b in store.batches] == [4, 4, 2, 1]


async def test_an_item_error_reaches_only_its_caller() -> None:
    store = FakeStore()
    store.unknown_tenants.add(TENANT_B)
    async with coalescer(store) as submits:
        good, bad = prepared(), prepared()
        outcomes = await asyncio.gather(
            submits.submit((TENANT_A, good)),
            submits.submit((TENANT_B, bad)),
            return_exceptions=True,
        )
        assert isinstance(outcomes[0], SubmitResult) and outcomes[0].task.id == good.new.id
        assert isinstance(outcomes[1], TenantNotFound)
        assert len(store.batches) == 1


async def test_a_batch_failing_as_a_whole_is_retried_one_by_one() -> None:
    store = FakeStore()
    async with coalescer(store) as submits:
        requests = [prepared() for _ in range(5)]
        store.bad_ids.add(requests[2].new.id)
        outcomes = await asyncio.gather(
            *(submits.submit((TENANT_A, p)) for p in requests), return_exceptions=True
        )
        assert isinstance(outcomes[2], ValueError)
        assert all(isinstance(o, SubmitResult) for i, o in enumerate(outcomes) if i != 2)
        assert [p for _, p in store.singles] == requests
        assert submits.get_stats()["isolated"] == 5


async def test_store_unavailable_is_every_callers_answer_and_nothing_is_retried() -> None:
    store = FakeStore()
    store.fail_batch = StoreUnavailable("connection lost")
    async with coalescer(store) as submits:
        outcomes = await asyncio.gather(
            *(submits.submit((TENANT_A, prepared())) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(o, StoreUnavailable) for o in outcomes)
        assert len({id(o) for o in outcomes}) == 3  # one exception object per caller
        assert store.singles == []


async def test_a_cancelled_caller_leaves_the_others_alone() -> None:
    store = FakeStore()
    async with coalescer(store, linger_s=0.05) as submits:
        # A batch with company first, so that the next one lingers (a lone one would
        # be flushed before the cancel).
        await asyncio.gather(*(submits.submit((TENANT_A, prepared())) for _ in range(2)))
        leaving = asyncio.ensure_future(submits.submit((TENANT_A, prepared())))
        staying = asyncio.ensure_future(submits.submit((TENANT_A, prepared())))
        await one_loop_turn()
        leaving.cancel()
        result = await staying
        assert isinstance(result, SubmitResult)
        with pytest.raises(asyncio.CancelledError):
            await leaving
        # The cancelled request was dropped before the write.
        assert [len(b) for b in store.batches] == [2, 1]

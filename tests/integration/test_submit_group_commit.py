"""Group commit of submits against a real PostgreSQL: ``SubmitStore.insert_each`` (several
tenants, per-item outcomes in one transaction) and concurrent ``SubmitTask`` RPCs through
a real grpc.aio server, where an invalid request or a reused key fails alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.grpc_servers import serving
from fixtures.stores import prepared_task, tenant_with_key
from google.protobuf import timestamp_pb2

from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.tasks import TaskServiceServicer, submit_committer
from chronoshard.scheduler.config import SchedulerConfig, SchedulingConfig
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import NewTask, PreparedTask, SubmitResult, Tenant
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.errors import IdempotencyConflict, InvalidArgument, TenantNotFound
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.submits import SubmitStore
from chronoshard.scheduler.store.tenants import TenantStore
from chronoshard.v1 import task_service_pb2, task_service_pb2_grpc
from chronoshard.wire import error_info_from_metadata

SHARDS = 16
AT = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
Req = task_service_pb2.SubmitTaskRequest


# Not fixtures.stores.new_task: tasks due at one fixed instant (AT) a day out, prepared
# as the wire would (fixtures.stores.prepared_task).
def _prepared(key: str | None = None, **overrides: Any) -> PreparedTask:
    task_id = new_task_id()
    fields: dict[str, Any] = {
        "id": task_id,
        "type": "t",
        "scheduled_at": AT,
        "due_at": AT,
        "shard": shard_of(task_id, SHARDS),
        "payload": {"v": 1},
        "idempotency_key": key,
        "jitter_mode": JitterMode.NONE,
    }
    fields.update(overrides)
    return prepared_task(NewTask(**fields))


def _fields(task: NewTask) -> dict[str, Any]:
    return {name: getattr(task, name) for name in NewTask.__dataclass_fields__}


async def _count(dsn: str, sql: str, *params: Any) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(sql, params)  # type: ignore[arg-type]
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_insert_each_gives_every_request_its_own_outcome(store: Store, db_dsn: str) -> None:
    (a, _), (b, _) = await tenant_with_key(store), await tenant_with_key(store)
    submits = SubmitStore(store)
    earlier = _prepared("k-old")
    await submits.insert_tasks(a.id, [earlier])
    plain_a, plain_b = _prepared(), _prepared()
    shared_first, shared_again = _prepared("k-new"), _prepared("k-new")
    repeat_of_earlier = _prepared("k-old")
    conflicting = _prepared("k-old", payload={"v": 2})
    same_key_other_tenant = _prepared("k-old", payload={"v": 2})
    unknown = uuid.uuid4()
    outcomes = await submits.insert_each(
        [
            (a.id, plain_a),
            (b.id, plain_b),
            (a.id, shared_first),
            (a.id, shared_again),
            (a.id, repeat_of_earlier),
            (a.id, conflicting),
            (b.id, same_key_other_tenant),
            (unknown, _prepared()),
        ]
    )
    created = [o.task.id for o in outcomes if isinstance(o, SubmitResult) and o.created]
    assert created == [
        plain_a.new.id,
        plain_b.new.id,
        shared_first.new.id,
        same_key_other_tenant.new.id,
    ]
    again, repeat = outcomes[3], outcomes[4]
    assert isinstance(again, SubmitResult) and again.task.id == shared_first.new.id
    assert isinstance(repeat, SubmitResult) and repeat.task.id == earlier.new.id
    assert not again.created and not repeat.created
    assert isinstance(outcomes[5], IdempotencyConflict)
    assert outcomes[5].original_task_id == earlier.new.id
    assert isinstance(outcomes[7], TenantNotFound)
    assert outcomes[6] == SubmitResult(outcomes[6].task, created=True)  # type: ignore[union-attr]
    assert outcomes[6].task.tenant_id == b.id  # type: ignore[union-attr]
    assert await _count(db_dsn, "SELECT count(*) FROM tasks WHERE tenant_id = %s", a.id) == 3
    assert await _count(db_dsn, "SELECT count(*) FROM tasks WHERE tenant_id = %s", b.id) == 2


async def test_a_batch_without_keys_is_one_self_committing_insert_with_outcomes_each(
    store: Store, db_dsn: str
) -> None:
    """No key to claim: the INSERT alone, outside a transaction; an unknown tenant's
    request and a repeated id fail alone, every other request's row is written."""
    tenant, _ = await tenant_with_key(store)
    submits = SubmitStore(store)
    first, second, repeated = _prepared(), _prepared(), _prepared()
    unknown = uuid.uuid4()
    outcomes = await submits.insert_each(
        [
            (tenant.id, first),
            (unknown, _prepared()),
            (tenant.id, repeated),
            (tenant.id, repeated),
            (tenant.id, second),
        ]
    )
    assert isinstance(outcomes[1], TenantNotFound) and outcomes[1].tenant_id == unknown
    assert isinstance(outcomes[3], InvalidArgument)
    written = [o.task.id for o in outcomes if isinstance(o, SubmitResult)]
    assert written == [first.new.id, repeated.new.id, second.new.id]
    assert all(isinstance(o, SubmitResult) and o.created for o in (outcomes[0], outcomes[4]))
    rows = "SELECT count(*) FROM tasks WHERE tenant_id = %s"
    assert await _count(db_dsn, rows, tenant.id) == 3
    assert await _count(db_dsn, rows, unknown) == 0
    # Round trip: what was sent comes back as written.
    [stored] = [o.task for o in outcomes[:1] if isinstance(o, SubmitResult)]
    assert stored.payload == {"v": 1} and stored.scheduled_at == AT


async def test_insert_tasks_stays_all_or_nothing(store: Store, db_dsn: str) -> None:
    tenant, _ = await tenant_with_key(store)
    submits = SubmitStore(store)
    await submits.insert_tasks(tenant.id, [_prepared("taken")])
    with pytest.raises(IdempotencyConflict):
        await submits.insert_tasks(
            tenant.id, [_prepared("fresh"), _prepared("taken", payload={"v": 2})]
        )
    keys = "SELECT count(*) FROM idempotency_keys WHERE tenant_id = %s"
    assert await _count(db_dsn, keys, tenant.id) == 1
    with pytest.raises(TenantNotFound):
        await submits.insert_tasks(uuid.uuid4(), [_prepared()])
    with pytest.raises(InvalidArgument):
        p = _prepared()
        await submits.insert_tasks(tenant.id, [p, p])


async def test_a_row_the_database_refuses_fails_alone(store: Store, db_dsn: str) -> None:
    tenant, _ = await tenant_with_key(store)
    # Built past the wire's validation: the database's CHECK on the type refuses it, which fails
    # the whole multi-row statement; the coalescer then writes each request alone.
    valid = _prepared()
    bad = PreparedTask(
        NewTask(**{**_fields(valid.new), "type": "x" * 300}), valid.payload_json, "fp"
    )
    good = [_prepared() for _ in range(3)]
    coalescer = submit_committer(SubmitStore(store), linger_s=0.01)
    coalescer.start()
    try:
        outcomes = await asyncio.gather(
            *(coalescer.submit((tenant.id, p)) for p in [good[0], bad, *good[1:]]),
            return_exceptions=True,
        )
    finally:
        await coalescer.stop()
    assert isinstance(outcomes[1], psycopg.errors.CheckViolation)
    assert [o.task.id for o in outcomes if isinstance(o, SubmitResult)] == [p.new.id for p in good]
    assert coalescer.get_stats()["isolated"] == 4
    assert await _count(db_dsn, "SELECT count(*) FROM tasks WHERE tenant_id = %s", tenant.id) == 3


@pytest.fixture
async def stub_and_key(store: Store) -> AsyncIterator[tuple[Any, str, Tenant]]:
    tenant, key = await tenant_with_key(store)
    config = SchedulerConfig(scheduling=SchedulingConfig(shard_count=SHARDS))
    servicer = TaskServiceServicer(
        config=config, store=store, authenticator=Authenticator(TenantStore(store))
    )
    async with serving(
        task_service_pb2_grpc.add_TaskServiceServicer_to_server, servicer
    ) as channel:
        yield task_service_pb2_grpc.TaskServiceStub(channel), key, tenant


async def test_concurrent_submit_rpcs_fail_alone(
    stub_and_key: tuple[Any, str, Tenant], db_dsn: str
) -> None:
    stub, key, tenant = stub_and_key
    auth = (("authorization", f"Bearer {key}"),)
    at = timestamp_pb2.Timestamp()
    at.FromDatetime(AT)
    first = await stub.SubmitTask(
        Req(type="t", scheduled_at=at, idempotency_key="k", payload_json=b'{"v": 1}'),
        metadata=auth,
    )
    requests = [Req(type="t", scheduled_at=at, payload_json=b'{"i": %d}' % i) for i in range(20)]
    requests[5] = Req(type="", scheduled_at=at)  # invalid: no type
    requests[9] = Req(type="t", scheduled_at=at, idempotency_key="k", payload_json=b'{"v": 2}')
    requests[13] = Req(type="t", scheduled_at=at, idempotency_key="k", payload_json=b'{"v": 1}')
    outcomes = await asyncio.gather(
        *(stub.SubmitTask(r, metadata=auth, timeout=10) for r in requests),
        return_exceptions=True,
    )
    failed = {i: o for i, o in enumerate(outcomes) if isinstance(o, grpc.aio.AioRpcError)}
    assert sorted(failed) == [5, 9]
    assert failed[5].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failed[9].code() == grpc.StatusCode.ALREADY_EXISTS
    info = error_info_from_metadata(failed[9].trailing_metadata())
    assert info is not None and info.field == "idempotency_key"
    repeat = outcomes[13]
    assert not isinstance(repeat, BaseException)
    assert repeat.task.id == first.task.id and not repeat.created
    stored = "SELECT count(*) FROM tasks WHERE tenant_id = %s"
    assert await _count(db_dsn, stored, tenant.id) == 1 + 17

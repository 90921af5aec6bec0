"""Row-level security on the tenant tables (migration 0014,
docs/operations.md#row-level-security) against a real PostgreSQL and a real node.

One node and two SDK workers (one with each tenant's key) run on this module's
database; two tenants each submit (SubmitTask and SubmitBatch), create a workflow, a
schedule they trigger and an expectation through the node's API, and the workers run
every task of both. That puts
rows of both tenants in every tenant table; the tests then read them three ways:

* as ``chronoshard_api`` with no tenant set (``SET ROLE``, as an operator in psql would):
  every tenant table reads empty, though the node's own role sees both tenants' rows;
* inside ``Store.tenant_transaction`` for tenant A, the one mechanism the API enters its
  tenant with: only A's rows, and writing a row of B (or moving one of A's to B) is
  refused or changes nothing;
* through the node's API with each tenant's key: each sees only its own.

The dispatch path (preload, intents, settlements, workflow progress, the ledger) ran
both tenants' tasks as the node's own role; the pool's connections come back from a
tenant transaction as that role, whether it committed or failed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
import pytest_asyncio
from fixtures.nodes import node_config, running_node
from fixtures.stores import tenant_with_key
from fixtures.waiting import eventually
from google.protobuf import duration_pb2
from psycopg import sql

from chronoshard import Client, ScheduleSpec, ScheduleWatch, TaskSpec, WorkflowTask
from chronoshard.errors import NotFoundError
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.scheduler.store.database import API_ROLE, TENANT_SETTING, Store
from chronoshard.services import EtcdProcess
from chronoshard.types import TaskStatus, WorkflowState
from chronoshard.v1 import watchdog_service_pb2 as watchdog_pb
from chronoshard.v1 import watchdog_service_pb2_grpc
from chronoshard.worker import TaskContext, Worker

SHARDS = 2
TASK_TYPE = "rls.echo"

# pytest-asyncio: the module-scoped node and the tests share the module's loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

TENANT_OF: Mapping[str, str] = {
    # Each tenant table, and how the node's own role tells the tenant of each of its rows.
    "tenants": "SELECT id AS tenant_id FROM tenants",
    "tasks": "SELECT tenant_id FROM tasks",
    "idempotency_keys": "SELECT tenant_id FROM idempotency_keys",
    "task_attempts": (
        "SELECT t.tenant_id FROM task_attempts AS a"
        " JOIN tasks AS t ON t.id = a.task_id AND t.scheduled_at = a.scheduled_at"
    ),
    "workflow_runs": "SELECT tenant_id FROM workflow_runs",
    "workflow_tasks": (
        "SELECT w.tenant_id FROM workflow_tasks AS x"
        " JOIN workflow_runs AS w ON w.id = x.workflow_id"
    ),
    "task_dependencies": (
        "SELECT w.tenant_id FROM task_dependencies AS x"
        " JOIN workflow_runs AS w ON w.id = x.workflow_id"
    ),
    "schedules": "SELECT tenant_id FROM schedules",
    "schedule_occurrences": "SELECT tenant_id FROM schedule_occurrences",
    "task_completions": "SELECT tenant_id FROM task_completions",
    "expectations": "SELECT tenant_id FROM expectations",
    "alerts": "SELECT tenant_id FROM alerts",
    "tenant_dispatch_buckets": "SELECT tenant_id FROM tenant_dispatch_buckets",
    # The nodes' dispatch allowances (0017).
    "tenant_dispatch_allowances": "SELECT tenant_id FROM tenant_dispatch_allowances",
    # The tenant whose key opened each worker stream (0016).
    "worker_sessions": "SELECT tenant_id FROM worker_sessions",
}
NOT_GRANTED = (
    "tenant_dispatch_buckets",
    "tenant_dispatch_allowances",
    "shard_owners",
    "canary_executions",
    "schema_migrations",
)
"""Tables the API never touches: the API role may not even read them."""


@dataclass(frozen=True)
class Made:
    """What one tenant made through the node's API."""

    name: str
    tenant_id: uuid.UUID
    key: str
    task_ids: tuple[str, ...]
    workflow_id: str
    schedule_id: str


@dataclass(frozen=True)
class World:
    node: SchedulerNode
    dsn: str
    a: Made
    b: Made

    @property
    def address(self) -> str:
        assert self.node.addresses is not None
        return self.node.addresses.grpc


async def owner_rows(dsn: str, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """``query`` as the node's own role (the test DSN's user, a superuser here)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query.encode(), params)  # test SQL, no input in it
        return await cur.fetchall()


def seconds(value: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=value)


async def make_for(client: Client, key: str, address: str, name: str) -> tuple[Made, list[str]]:
    """Rows of every tenant table for the client's tenant, through the node's API; the
    ids of the tasks the worker is to run."""
    task = TaskSpec(type=TASK_TYPE, payload={"who": name}, strict_timing=True, timeout_s=30)
    single = await client.submit(
        TASK_TYPE,
        {"who": name},
        strict_timing=True,
        idempotency_key=f"key-{name}",
        job_id=f"job-{name}",
    )
    batch = await client.submit_batch([task, task])
    batched = [r.task.id for r in batch if not isinstance(r, Exception)]
    assert len(batched) == 2, batch
    made = await client.create_workflow(
        f"wf-{name}",
        [WorkflowTask("first", task), WorkflowTask("second", task)],
        [("first", "second")],
        job_id=f"wf-job-{name}",
    )
    schedule = await client.create_schedule(
        ScheduleSpec(
            name=f"s-{name}",
            task=task,
            interval_s=3600,
            # Nothing for the materialiser to do: the one occurrence is the trigger's.
            start_at=datetime.now(UTC) + timedelta(days=1),
            watch=ScheduleWatch(disabled=True),
        )
    )
    run = await client.trigger_schedule(schedule.id)
    assert run.task_id is not None
    async with grpc.aio.insecure_channel(address) as channel:
        await watchdog_service_pb2_grpc.WatchdogServiceStub(channel).CreateExpectation(
            watchdog_pb.CreateExpectationRequest(job_id=f"job-{name}", interval=seconds(3600)),
            metadata=(("authorization", f"Bearer {key}"),),
            timeout=10,
        )
    tenant_id = uuid.UUID(single.task.tenant_id)
    ran = [single.task.id, *batched, *made.task_ids.values(), run.task_id]
    return Made(name, tenant_id, key, tuple(ran), made.workflow.id, schedule.id), ran


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(db_dsn: str, etcd: EtcdProcess) -> AsyncIterator[World]:
    async with running_node(node_config(db_dsn, etcd.endpoint, shard_count=SHARDS)) as node:
        assert node.addresses is not None
        address = node.addresses.grpc
        await eventually(
            lambda: len(node.shards.epochs()) == SHARDS, timeout_s=10, what="all shards claimed"
        )
        (_, key_a), (_, key_b) = [
            await tenant_with_key(node.store, rate_limit_rps=1000.0) for _ in range(2)
        ]
        # A worker with each tenant's key (workers serve every tenant's tasks; the key
        # says whose worker it is, in worker_sessions).
        workers = [Worker([address], api_key=key, slots=2) for key in (key_a, key_b)]

        async def echo(ctx: TaskContext) -> dict[str, Any]:
            return dict(ctx.payload)

        for worker in workers:
            worker.task(TASK_TYPE)(echo)
        running = [asyncio.create_task(worker.run()) for worker in workers]
        try:
            async with (
                Client(address, api_key=key_a) as client_a,
                Client(address, api_key=key_b) as client_b,
            ):
                a, ran_a = await make_for(client_a, key_a, address, "a")
                b, ran_b = await make_for(client_b, key_b, address, "b")

                async def all_completed() -> bool:
                    got = [await client_a.get(t) for t in ran_a] + [
                        await client_b.get(t) for t in ran_b
                    ]
                    return all(t.status is TaskStatus.COMPLETED for t in got)

                await eventually(all_completed, timeout_s=30, what="both tenants' tasks ran")
        finally:
            for worker in workers:
                worker.stop()
            await asyncio.wait_for(asyncio.gather(*running), timeout=10)
        # The watchdog's alerts about each tenant's job (WatchdogService.ListIncidents
        # reads them as the tenant), and one of the cluster's own, which no tenant sees.
        async with await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as conn:
            for made, tenant in ((a, a.tenant_id), (b, b.tenant_id), (None, None)):
                name = "cluster" if made is None else made.name
                await conn.execute(
                    "INSERT INTO alerts (kind, dedup_key, tenant_id, summary)"
                    " VALUES ('job_overdue', %s, %s, %s)",
                    (f"rls/{name}", tenant, f"{name}'s job is overdue"),
                )
        yield World(node, db_dsn, a, b)


async def test_the_dispatch_path_ran_both_tenants_tasks_as_the_nodes_role(world: World) -> None:
    # Both tenants' tasks went through preload, intent and settlement on one node and one
    # worker (the fixture waited for COMPLETED); the settlements wrote the ledger and the
    # workflow progress finished each run: all of it across tenants, by shard.
    for made in (world.a, world.b):
        ledger = await owner_rows(
            world.dsn,
            "SELECT job_id FROM task_completions WHERE tenant_id = %s ORDER BY job_id",
            (made.tenant_id,),
        )
        # The single submit's job, the triggered occurrence's (the schedule's name) and
        # the workflow run's, which its last task's completion wrote.
        n = made.name
        assert [job for (job,) in ledger] == sorted([f"job-{n}", f"s-{n}", f"wf-job-{n}"])
        [(state,)] = await owner_rows(
            world.dsn, "SELECT state FROM workflow_runs WHERE id = %s", (made.workflow_id,)
        )
        assert state == WorkflowState.SUCCEEDED.value


async def test_every_table_with_a_tenant_id_has_a_policy_and_the_role_bypasses_nothing(
    world: World,
) -> None:
    [(login, superuser, bypass)] = await owner_rows(
        world.dsn,
        "SELECT rolcanlogin, rolsuper, rolbypassrls FROM pg_roles WHERE rolname = %s",
        (API_ROLE,),
    )
    assert (login, superuser, bypass) == (False, False, False)
    guarded = await owner_rows(
        world.dsn,
        "SELECT c.relname, c.relrowsecurity, c.relforcerowsecurity,"
        " (SELECT count(*) FROM pg_policy AS p WHERE p.polrelid = c.oid)"
        " FROM pg_class AS c"
        " WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')"
        "   AND NOT c.relispartition"
        "   AND (c.relname = 'tenants' OR EXISTS (SELECT FROM pg_attribute AS a"
        "        WHERE a.attrelid = c.oid AND a.attname = 'tenant_id' AND NOT a.attisdropped)"
        "        OR c.relrowsecurity)",
    )
    # FORCE is off: the tables' owner (the node) is not restricted.
    assert {name: (on, forced, n) for name, on, forced, n in guarded} == {
        name: (True, False, 1) for name in TENANT_OF
    }
    for table in (*NOT_GRANTED, "tasks_default"):
        [(readable,)] = await owner_rows(
            world.dsn, "SELECT has_table_privilege(%s, %s, 'SELECT')", (API_ROLE, table)
        )
        assert readable is False, f"{API_ROLE} may read {table}"


async def test_without_a_tenant_set_the_api_role_sees_no_row_of_any_tenant_table(
    world: World,
) -> None:
    async with await psycopg.AsyncConnection.connect(world.dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(API_ROLE)))
        for table, tenant_of in TENANT_OF.items():
            if table in NOT_GRANTED:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    await conn.execute(sql.SQL("SELECT FROM {}").format(sql.Identifier(table)))
                continue
            owned = {t for (t,) in await owner_rows(world.dsn, tenant_of)}
            assert {world.a.tenant_id, world.b.tenant_id} <= owned, f"{table}: no rows to hide"
            cur = await conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
            )
            assert await cur.fetchone() == (0,), f"{table} shows rows with no tenant set"
        # Set and then gone (a transaction that set it ended): still nothing, no error.
        async with conn.transaction():
            await conn.execute(
                "SELECT set_config(%s, %s, true)", (TENANT_SETTING, str(world.a.tenant_id))
            )
        cur = await conn.execute("SELECT count(*) FROM tasks")
        assert await cur.fetchone() == (0,)


async def test_as_one_tenant_the_api_role_sees_only_that_tenants_rows(world: World) -> None:
    for made in (world.a, world.b):
        async with world.node.store.tenant_transaction(made.tenant_id) as conn:
            cur = await conn.execute("SELECT current_user")
            assert await cur.fetchone() == (API_ROLE,)
            for table, tenant_of in TENANT_OF.items():
                if table in NOT_GRANTED:
                    continue
                mine = [t for (t,) in await owner_rows(world.dsn, tenant_of) if t == made.tenant_id]
                cur = await conn.execute(
                    sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
                )
                assert await cur.fetchone() == (len(mine),), table
                assert mine, f"{table}: the tenant has no rows to see"
            cur = await conn.execute("SELECT DISTINCT tenant_id FROM tasks")
            assert await cur.fetchall() == [(made.tenant_id,)]


async def test_as_one_tenant_a_write_of_another_tenants_row_is_refused(world: World) -> None:
    store, a, b = world.node.store, world.a, world.b
    refused = [
        # A row written for B (WITH CHECK) ...
        (
            "INSERT INTO expectations (tenant_id, job_id, interval_s) VALUES (%s, 'x', 60)",
            (b.tenant_id,),
        ),
        # ... one of A's moved to B ...
        ("UPDATE tasks SET tenant_id = %s WHERE id = %s", (b.tenant_id, uuid.UUID(a.task_ids[0]))),
        # ... a row that belongs to B through its run.
        (
            "INSERT INTO workflow_tasks (task_id, workflow_id, ref, trigger_rule, position)"
            " VALUES (gen_random_uuid(), %s, 'x', 'all_success', 99)",
            (uuid.UUID(b.workflow_id),),
        ),
    ]
    for statement, params in refused:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
            async with store.tenant_transaction(a.tenant_id) as conn:
                await conn.execute(statement.encode(), params)
    # B's rows are not there to change or delete (USING): nothing happens to them.
    b_task = uuid.UUID(b.task_ids[0])
    async with store.tenant_transaction(a.tenant_id) as conn:
        for statement, params in (
            ("UPDATE tasks SET last_error = 'a was here' WHERE id = %s", (b_task,)),
            ("UPDATE task_attempts SET error = 'a was here' WHERE task_id = %s", (b_task,)),
            ("DELETE FROM schedules WHERE id = %s", (uuid.UUID(b.schedule_id),)),
            ("DELETE FROM expectations WHERE tenant_id = %s", (b.tenant_id,)),
        ):
            cur = await conn.execute(statement.encode(), params)
            assert cur.rowcount == 0, statement
    [(last_error, schedules, expectations)] = await owner_rows(
        world.dsn,
        "SELECT (SELECT last_error FROM tasks WHERE id = %s),"
        " (SELECT count(*) FROM schedules WHERE tenant_id = %s),"
        " (SELECT count(*) FROM expectations WHERE tenant_id = %s)",
        (b_task, b.tenant_id, b.tenant_id),
    )
    assert (last_error, schedules, expectations) == (None, 1, 1)


async def test_each_tenant_sees_only_its_own_through_the_nodes_api(world: World) -> None:
    for me, other in ((world.a, world.b), (world.b, world.a)):
        async with Client(world.address, api_key=me.key) as client:
            listed = (await client.list(page_size=100)).tasks
            assert sorted(t.id for t in listed) == sorted(me.task_ids)
            assert {t.tenant_id for t in listed} == {str(me.tenant_id)}
            with pytest.raises(NotFoundError):
                await client.get(other.task_ids[0])
            assert (await client.get(me.task_ids[0], attempts=True)).attempts
            schedules = (await client.list_schedules()).schedules
            assert [s.id for s in schedules] == [me.schedule_id]
            with pytest.raises(NotFoundError):
                await client.get_schedule(other.schedule_id)
            runs = (await client.list_workflows()).workflows
            assert [w.id for w in runs] == [me.workflow_id]
            with pytest.raises(NotFoundError):
                await client.get_workflow(other.workflow_id)
        async with grpc.aio.insecure_channel(world.address) as channel:
            listed_jobs = await watchdog_service_pb2_grpc.WatchdogServiceStub(
                channel
            ).ListExpectations(
                watchdog_pb.ListExpectationsRequest(),
                metadata=(("authorization", f"Bearer {me.key}"),),
                timeout=10,
            )
        assert [e.job_id for e in listed_jobs.expectations] == [f"job-{me.name}"]


async def test_a_pooled_connection_leaves_a_tenant_transaction_as_the_nodes_role(
    world: World,
) -> None:
    async with await Store.open(world.dsn, min_size=1, max_size=1) as store:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            async with store.tenant_transaction(world.a.tenant_id) as conn:
                await conn.execute("SELECT FROM shard_owners")
        async with store.tenant_transaction(world.a.tenant_id) as conn:
            await conn.execute("SELECT count(*) FROM tasks")
        # The pool's one connection, after a failed and a committed tenant transaction.
        async with store.connection() as conn:
            cur = await conn.execute(
                "SELECT current_user = session_user, current_setting(%s, true),"
                " (SELECT count(DISTINCT tenant_id) FROM tasks)",
                (TENANT_SETTING,),
            )
            assert await cur.fetchone() == (True, "", 2)

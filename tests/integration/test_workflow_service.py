"""WorkflowService and the settlement of workflow tasks against a real PostgreSQL.

The servicer runs on a real grpc.aio server (port 0) and is called through the
generated stub. Tasks are run by the real settlement statements (``RunStore.complete``,
``RunStore.fail``) on rows moved to DISPATCHED by SQL, as a worker's attempt would
leave them: what is checked is what the completion transaction does to the run (the
counters, the failures it propagates, the run's state), read back with plain SQL.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.grpc_servers import serving
from fixtures.stores import tenant_with_key

from chronoshard.clock import FakeClock
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.workflows import WorkflowServiceServicer
from chronoshard.scheduler.cluster.routing import ChangedTask
from chronoshard.scheduler.config import SchedulerConfig, SchedulingConfig
from chronoshard.scheduler.core.models import Task, TaskRef
from chronoshard.scheduler.core.retry import FailureReport
from chronoshard.scheduler.core.runs import Completion, Failure, SettleResult
from chronoshard.scheduler.errors import PartOfWorkflow
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.runs import RunStore
from chronoshard.scheduler.store.tasks import TaskQueries
from chronoshard.scheduler.store.tenants import TenantStore
from chronoshard.scheduler.store.workflow_progress import places
from chronoshard.v1 import common_pb2, task_service_pb2
from chronoshard.v1 import workflow_service_pb2 as pb
from chronoshard.v1 import workflow_service_pb2_grpc as pb_grpc
from chronoshard.wire import error_info_from_metadata

pytestmark = pytest.mark.store(own_database=True)

CONFIG = SchedulerConfig(scheduling=SchedulingConfig(shard_count=8))
NOW = datetime.now(UTC).replace(microsecond=0)
DIAMOND = [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")]
FATAL = FailureReport(retryable=False, timed_out=False, cancelled=False)


@dataclass
class Recorder:
    submitted: list[ChangedTask] = field(default_factory=list)
    cancels: list[Task] = field(default_factory=list)

    def tasks_submitted(self, tasks: Sequence[ChangedTask]) -> None:
        self.submitted.extend(tasks)

    def cancel_requested(self, task: Task, reason: str) -> None:
        self.cancels.append(task)


@dataclass
class Env:
    stub: pb_grpc.WorkflowServiceStub
    store: Store
    dsn: str
    tenant_id: uuid.UUID
    key: str
    listener: Recorder
    runs: RunStore

    @property
    def auth(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.key}"),)

    async def create(
        self,
        edges: Sequence[tuple[str, str]],
        refs: Sequence[str] = (),
        *,
        rules: Mapping[str, int] | None = None,
        key: str = "",
    ) -> pb.CreateWorkflowResponse:
        return await self.stub.CreateWorkflow(
            request(edges, refs, rules=rules, key=key), metadata=self.auth, timeout=10
        )

    async def get(self, run_id: str) -> pb.GetWorkflowResponse:
        return await self.stub.GetWorkflow(
            pb.GetWorkflowRequest(id=run_id), metadata=self.auth, timeout=10
        )

    async def sql(self, query: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute(query, params or {})  # type: ignore[arg-type]
            return await cur.fetchall() if cur.description else []

    async def rows(self, made: pb.CreateWorkflowResponse) -> dict[str, tuple[str, int]]:
        """ref -> (status, unresolved_dependencies)."""
        found = await self.sql(
            "SELECT id, status, unresolved_dependencies FROM tasks WHERE workflow_id = %(w)s",
            {"w": made.workflow.id},
        )
        by_id = {str(task_id): (status, left) for task_id, status, left in found}
        return {ref: by_id[task_id] for ref, task_id in made.task_ids.items()}

    async def ref(self, made: pb.CreateWorkflowResponse, name: str) -> TaskRef:
        """The task ``name`` moved to DISPATCHED under its next token with its attempt
        row, as an intent leaves it."""
        task_id = uuid.UUID(made.task_ids[name])
        rows = await self.sql(
            "WITH moved AS (UPDATE tasks SET status = 'DISPATCHED',"
            " fencing_token = fencing_token + 1, attempt = attempt + 1 WHERE id = %(id)s"
            " RETURNING id, attempt, scheduled_at, fencing_token)"
            " INSERT INTO task_attempts (task_id, attempt, scheduled_at, fencing_token, state)"
            " SELECT id, attempt, scheduled_at, fencing_token, 'DISPATCHED' FROM moved"
            " RETURNING scheduled_at",
            {"id": task_id},
        )
        return TaskRef(rows[0][0], task_id)

    async def complete(
        self, made: pb.CreateWorkflowResponse, name: str, result: str | None = None
    ) -> SettleResult:
        ref = await self.ref(made, name)
        token = await self._token(ref)
        return await self.runs.complete([Completion(ref, token, result)])

    async def fail(self, made: pb.CreateWorkflowResponse, name: str) -> SettleResult:
        ref = await self.ref(made, name)
        token = await self._token(ref)
        return await self.runs.fail([Failure(ref, token, "boom", FATAL)], datetime.now(UTC))

    async def _token(self, ref: TaskRef) -> int:
        rows = await self.sql("SELECT fencing_token FROM tasks WHERE id = %(id)s", {"id": ref.id})
        token: int = rows[0][0]
        return token

    async def state(self, made: pb.CreateWorkflowResponse) -> int:
        return (await self.get(made.workflow.id)).workflow.state


def request(
    edges: Sequence[tuple[str, str]],
    refs: Sequence[str] = (),
    *,
    rules: Mapping[str, int] | None = None,
    key: str = "",
) -> pb.CreateWorkflowRequest:
    names = list(dict.fromkeys([*refs, *(ref for edge in edges for ref in edge)]))
    return pb.CreateWorkflowRequest(
        name="pipeline",
        tasks=[
            pb.WorkflowTask(
                ref=name,
                task=task_service_pb2.SubmitTaskRequest(
                    type=f"step.{name}", payload_json=b'{"n": 1}', strict_timing=True
                ),
                trigger_rule=(rules or {}).get(name, pb.TRIGGER_RULE_UNSPECIFIED),  # type: ignore[arg-type]
            )
            for name in names
        ],
        edges=[pb.WorkflowEdge(parent=parent, child=child) for parent, child in edges],
        idempotency_key=key,
    )


@pytest.fixture
async def env(store: Store, fresh_db_dsn: str) -> AsyncIterator[Env]:
    tenant, key = await tenant_with_key(store)
    listener = Recorder()
    servicer = WorkflowServiceServicer(
        config=CONFIG,
        store=store,
        authenticator=Authenticator(TenantStore(store)),
        listener=listener,
        clock=FakeClock(NOW),
    )
    async with serving(pb_grpc.add_WorkflowServiceServicer_to_server, servicer) as channel:
        yield Env(
            pb_grpc.WorkflowServiceStub(channel),
            store,
            fresh_db_dsn,
            tenant.id,
            key,
            listener,
            RunStore(store),
        )


async def _refused(call: Awaitable[Any], code: grpc.StatusCode) -> common_pb2.ErrorInfo:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code, raised.value.details()
    info = error_info_from_metadata(raised.value.trailing_metadata())
    assert info is not None
    return info


# --- create and read ----------------------------------------------------------------------


async def test_a_diamond_is_written_whole_with_its_in_degrees(env: Env) -> None:
    made = await env.create(DIAMOND)
    assert made.created and set(made.task_ids) == {"A", "B", "C", "D"}
    assert await env.rows(made) == {
        "A": ("SCHEDULED", 0),
        "B": ("SCHEDULED", 1),
        "C": ("SCHEDULED", 1),
        "D": ("SCHEDULED", 2),
    }
    # Only the root is routed (the others wait for their parents).
    assert [str(t.id) for t in env.listener.submitted] == [made.task_ids["A"]]
    got = await env.get(made.workflow.id)
    assert got.workflow.state == pb.WORKFLOW_STATE_RUNNING
    assert (got.workflow.task_count, got.workflow.edge_count) == (4, 4)
    assert (got.tasks[0].ref, got.tasks[-1].ref) == ("A", "D")
    assert {(e.parent, e.child) for e in got.edges} == set(DIAMOND)
    assert all(t.task.workflow_id == made.workflow.id for t in got.tasks)
    # Every task of the run is scheduled at the run's instant.
    assert {t.task.scheduled_at.ToDatetime() for t in got.tasks} == {
        got.workflow.scheduled_at.ToDatetime()
    }


@pytest.mark.parametrize(
    ("build", "field", "words"),
    [
        (
            lambda: request([("a", "b"), ("b", "c"), ("c", "a")]),
            "edges",
            "a cycle: a -> b -> c -> a",
        ),
        (
            lambda: pb.CreateWorkflowRequest(
                tasks=request([], ["a"]).tasks, edges=[pb.WorkflowEdge(parent="a", child="zz")]
            ),
            "edges[0].child",
            "no task has the reference 'zz'",
        ),
        (
            lambda: pb.CreateWorkflowRequest(tasks=[*request([], ["a"]).tasks] * 2),
            "tasks[1].ref",
            "already the reference",
        ),
        (lambda: pb.CreateWorkflowRequest(), "tasks", "at least one task"),
    ],
)
async def test_a_bad_graph_is_refused_naming_the_field_with_nothing_written(
    env: Env, build: Any, field: str, words: str
) -> None:
    info = await _refused(
        env.stub.CreateWorkflow(build(), metadata=env.auth, timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == field and words in info.message, info
    assert await env.sql("SELECT count(*) FROM workflow_runs") == [(0,)]
    assert await env.sql("SELECT count(*) FROM tasks") == [(0,)]


async def test_a_task_cannot_choose_its_own_time_or_key(env: Env) -> None:
    timed = request([("a", "b")])
    timed.tasks[1].task.delay.FromTimedelta(timedelta(seconds=5))
    info = await _refused(
        env.stub.CreateWorkflow(timed, metadata=env.auth, timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "tasks[1].task.delay"
    keyed = request([("a", "b")])
    keyed.tasks[0].task.idempotency_key = "k"
    info = await _refused(
        env.stub.CreateWorkflow(keyed, metadata=env.auth, timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "tasks[0].task.idempotency_key"
    bad = request([("a", "b")])
    bad.tasks[1].task.payload_json = b"[1]"
    info = await _refused(
        env.stub.CreateWorkflow(bad, metadata=env.auth, timeout=10),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert info.field == "tasks[1].task.payload_json"
    assert await env.sql("SELECT count(*) FROM tasks") == [(0,)]


async def test_an_idempotency_key_returns_the_original_and_refuses_another_request(
    env: Env,
) -> None:
    first = await env.create(DIAMOND, key="nightly-1")
    again = await env.create(DIAMOND, key="nightly-1")
    assert (again.created, again.workflow.id) == (False, first.workflow.id)
    assert dict(again.task_ids) == dict(first.task_ids)
    info = await _refused(
        env.stub.CreateWorkflow(request([("A", "B")], key="nightly-1"), metadata=env.auth),
        grpc.StatusCode.ALREADY_EXISTS,
    )
    assert info.field == "idempotency_key"
    assert await env.sql("SELECT count(*) FROM workflow_runs") == [(1,)]


async def test_another_tenants_workflow_is_not_found(env: Env, store: Store) -> None:
    made = await env.create(DIAMOND)
    _, other_key = await tenant_with_key(store)
    await _refused(
        env.stub.GetWorkflow(
            pb.GetWorkflowRequest(id=made.workflow.id),
            metadata=(("authorization", f"Bearer {other_key}"),),
        ),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_list_pages_newest_first_and_filters_by_state(env: Env) -> None:
    made = [await env.create([("a", "b")]) for _ in range(5)]
    seen: list[str] = []
    token = ""
    while True:
        page = await env.stub.ListWorkflows(
            pb.ListWorkflowsRequest(page_size=2, page_token=token), metadata=env.auth
        )
        seen.extend(w.id for w in page.workflows)
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted(m.workflow.id for m in made) and len(seen) == 5
    done = await env.stub.ListWorkflows(
        pb.ListWorkflowsRequest(state=pb.WORKFLOW_STATE_SUCCEEDED), metadata=env.auth
    )
    assert list(done.workflows) == []
    await _refused(
        env.stub.ListWorkflows(pb.ListWorkflowsRequest(page_token="nope!"), metadata=env.auth),
        grpc.StatusCode.INVALID_ARGUMENT,
    )


# --- unlocking ------------------------------------------------------------------------------


async def test_the_diamond_unlocks_by_counters_in_the_completion_transaction(env: Env) -> None:
    made = await env.create(DIAMOND)
    ids = {ref: uuid.UUID(task_id) for ref, task_id in made.task_ids.items()}
    after_a = await env.complete(made, "A", '{"rows": 3}')
    assert {shard for shard, _ in after_a.due} and len(after_a.due) == 2
    assert await env.rows(made) == {
        "A": ("COMPLETED", 0),
        "B": ("SCHEDULED", 0),
        "C": ("SCHEDULED", 0),
        "D": ("SCHEDULED", 2),
    }
    assert (await env.complete(made, "B", '{"b": 1}')).due == []
    assert (await env.rows(made))["D"] == ("SCHEDULED", 1)
    after_c = await env.complete(made, "C", '{"c": 2}')
    assert len(after_c.due) == 1
    assert (await env.rows(made))["D"] == ("SCHEDULED", 0)
    # D's assignment carries its parents' results exactly as they were returned.
    async with env.store.connection() as conn:
        place = (await (await places(conn, [ids["D"]])).read())[ids["D"]]
    assert place.ref == "D"
    assert [(p.ref, p.result_json) for p in place.parents] == [
        ("B", '{"b": 1}'),
        ("C", '{"c": 2}'),
    ]
    assert await env.state(made) == pb.WORKFLOW_STATE_RUNNING
    await env.complete(made, "D")
    got = await env.get(made.workflow.id)
    assert got.workflow.state == pb.WORKFLOW_STATE_SUCCEEDED
    assert got.workflow.HasField("finished_at")


async def test_concurrent_completions_of_parents_count_every_decrement_once(env: Env) -> None:
    width = 120
    parents = [f"p{i}" for i in range(width)]
    made = await env.create([("root", p) for p in parents] + [(p, "sink") for p in parents])
    await env.complete(made, "root")
    refs = [await env.ref(made, p) for p in parents]
    # Twelve batches at once, each its own transaction on its own connection.
    batches = [refs[i::12] for i in range(12)]
    results = await asyncio.gather(
        *(env.runs.complete([Completion(r, 1, None) for r in batch]) for batch in batches)
    )
    released = [due for result in results for due in result.due]
    assert len(released) == 1  # the sink, once, by whichever batch was last
    assert (await env.rows(made))["sink"] == ("SCHEDULED", 0)
    assert all(o.value == "OK" for r in results for o in r.outcomes.values())


# --- failure ----------------------------------------------------------------------------


async def test_a_dead_lettered_parent_fails_its_all_success_descendants_with_itself_as_cause(
    env: Env,
) -> None:
    made = await env.create([*DIAMOND, ("D", "E")])
    await env.complete(made, "A")
    await env.fail(made, "B")
    rows = await env.rows(made)
    assert rows["B"][0] == "DEAD_LETTER"
    assert rows["D"][0] == "UPSTREAM_FAILED" and rows["E"][0] == "UPSTREAM_FAILED"
    got = await env.get(made.workflow.id)
    causes = {t.ref: t.upstream_cause for t in got.tasks}
    assert causes["D"] == "B" and causes["E"] == "B" and causes["C"] == ""
    assert got.workflow.state == pb.WORKFLOW_STATE_RUNNING  # C still runs
    await env.complete(made, "C")
    # Neither B nor C moved the failed D's count (a terminal task keeps it); C ends the run.
    assert (await env.rows(made))["D"] == ("UPSTREAM_FAILED", 2)
    assert await env.state(made) == pb.WORKFLOW_STATE_FAILED


async def test_an_all_done_child_runs_after_a_failed_parent(env: Env) -> None:
    made = await env.create(DIAMOND, rules={"D": pb.TRIGGER_RULE_ALL_DONE})
    await env.complete(made, "A")
    assert (await env.fail(made, "B")).due == []
    assert (await env.rows(made))["D"] == ("SCHEDULED", 1)
    assert len((await env.complete(made, "C")).due) == 1
    assert (await env.rows(made))["D"] == ("SCHEDULED", 0)
    d = uuid.UUID(made.task_ids["D"])
    async with env.store.connection() as conn:
        place = (await (await places(conn, [d])).read())[d]
    assert {(p.ref, p.status.value) for p in place.parents} == {
        ("B", "DEAD_LETTER"),
        ("C", "COMPLETED"),
    }
    await env.complete(made, "D")
    assert await env.state(made) == pb.WORKFLOW_STATE_FAILED


# --- cancel and retry ----------------------------------------------------------------------


async def test_cancel_cancels_waiting_tasks_at_once_and_running_ones_cooperatively(
    env: Env,
) -> None:
    made = await env.create(DIAMOND)
    await env.complete(made, "A")
    b = await env.ref(made, "B")
    await env.sql("UPDATE tasks SET status = 'RUNNING' WHERE id = %(id)s", {"id": b.id})
    cancelled = await env.stub.CancelWorkflow(
        pb.CancelWorkflowRequest(id=made.workflow.id, reason="wrong input"), metadata=env.auth
    )
    assert (cancelled.cancelled, cancelled.stopping) == (2, 1)
    rows = await env.rows(made)
    assert rows["C"][0] == "CANCELLED" and rows["D"][0] == "CANCELLED"  # never UPSTREAM_FAILED
    assert rows["B"][0] == "RUNNING"
    assert {str(t.id) for t in env.listener.cancels} == {
        made.task_ids["B"],
        made.task_ids["C"],
        made.task_ids["D"],
    }
    assert cancelled.workflow.state == pb.WORKFLOW_STATE_RUNNING
    # The worker acknowledges: B ends CANCELLED and with it the run.
    cancel = FailureReport(retryable=False, timed_out=False, cancelled=True)
    await env.runs.fail([Failure(b, 1, "stopped", cancel)], datetime.now(UTC))
    assert await env.state(made) == pb.WORKFLOW_STATE_CANCELLED
    again = await env.stub.CancelWorkflow(
        pb.CancelWorkflowRequest(id=made.workflow.id), metadata=env.auth
    )
    assert (again.cancelled, again.workflow.state) == (0, pb.WORKFLOW_STATE_CANCELLED)


async def test_retry_reopens_from_the_failure_on_and_keeps_what_completed(env: Env) -> None:
    made = await env.create(DIAMOND)
    await _refused(
        env.stub.RetryWorkflow(pb.RetryWorkflowRequest(id=made.workflow.id), metadata=env.auth),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    await env.complete(made, "A")
    await env.fail(made, "B")
    await env.complete(made, "C")
    assert await env.state(made) == pb.WORKFLOW_STATE_FAILED
    # RetryTask on one of its tasks points at RetryWorkflow.
    with pytest.raises(PartOfWorkflow):
        await TaskQueries(env.store).retry_task(
            env.tenant_id, uuid.UUID(made.task_ids["B"]), datetime.now(UTC)
        )
    env.listener.submitted.clear()
    retried = await env.stub.RetryWorkflow(
        pb.RetryWorkflowRequest(id=made.workflow.id), metadata=env.auth
    )
    assert retried.reopened == 2 and retried.workflow.state == pb.WORKFLOW_STATE_RUNNING
    assert await env.rows(made) == {
        "A": ("COMPLETED", 0),
        "B": ("SCHEDULED", 0),
        "C": ("COMPLETED", 0),
        "D": ("SCHEDULED", 1),
    }
    assert [str(t.id) for t in env.listener.submitted] == [made.task_ids["B"]]
    got = await env.get(made.workflow.id)
    assert {t.ref: t.upstream_cause for t in got.tasks}["D"] == ""
    await env.complete(made, "B")
    await env.complete(made, "D")
    assert await env.state(made) == pb.WORKFLOW_STATE_SUCCEEDED

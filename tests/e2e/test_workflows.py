"""DAG workflows end to end (docs/architecture.md#d9): real PostgreSQL, etcd, two
scheduler node processes and two worker processes, driven through the generated
``WorkflowService`` stub (the client library is not used: these tests pin the wire
contract itself).

Every task is ``wf.step`` (``workflow_workers.py``), which records each start in
``wf_starts`` with what the SDK showed it (``ctx.workflow_id``, ``ctx.workflow_ref``,
``ctx.parents``) and the worker's clock; the tests compare those starts with the tasks'
``finished_at`` from ``GetWorkflow`` (PostgreSQL's ``now()`` of the completing
transaction, on the same machine's clock: a child dispatched after its parent's commit
starts strictly later).

1. **Diamond** A -> B, A -> C, B -> D, C -> D: each task runs once, only after its
   parents completed; D's ``ctx.parents`` holds B's and C's results exactly.
2. **Fan-out/fan-in, 1,000 wide**: root -> 1,000 middle tasks -> one sink, over two
   workers: every one of the 1,000 concurrent completions took its one off the sink's
   counter (all 0, the sink ran once, after the last); the sink saw 1,000 parents, the
   results within ``workflows.max_parent_results_bytes`` exact and the rest omitted.
3. **A failing parent**: B dead-letters; D under ``all_success`` becomes UPSTREAM_FAILED
   (cause B) and never starts; D under ``all_done`` runs and sees B's DEAD_LETTER.
4. **Cancel and retry**: a cancel stops the running root (CANCELLED) and cancels the
   waiting tasks (CANCELLED, not UPSTREAM_FAILED); retrying a running run is
   FAILED_PRECONDITION; a failed run retried after the handler is fixed re-runs only
   what did not complete.
5. **Crash**: B and C on shards of one node, D on a shard of the other; that other node
   is SIGKILLed right after B and C complete (as soon as GetWorkflow shows it, and
   again frozen first so that the crash certainly precedes D's dispatch); D still runs
   exactly once, within the crash bound of docs/failure-model.md (lease TTL + 2 s).
   Last: these kill nodes of the module's cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.waiting import eventually
from harness.cluster import Cluster, owners, running_cluster, spread

from chronoshard import exact_json, wire
from chronoshard.services import EtcdProcess
from chronoshard.v1 import (
    common_pb2,
    task_service_pb2,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)

wf = workflow_service_pb2

SHARDS = 16
LEASE_TTL_S = 3.0
# docs/failure-model.md: the TTL + 2 s crash bound holds while ack_timeout_s <= TTL + 1.5 s.
ACK_TIMEOUT_S = LEASE_TTL_S + 1.0
CRASH_BOUND_S = LEASE_TTL_S + 2.0
ENV = {
    "CHRONOSHARD_ETCD__LEASE_TTL_S": str(LEASE_TTL_S),
    "CHRONOSHARD_ETCD__SELF_FENCE_MARGIN_S": "1",
    "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
    "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": str(ACK_TIMEOUT_S),
    "CHRONOSHARD_GRPC__KEEPALIVE_TIME_S": "1",
    "CHRONOSHARD_GRPC__KEEPALIVE_TIMEOUT_S": "1",
}
WORKER = "workflow_workers:worker"
WORKERS = 2
TASK_TYPE = "wf.step"

WIDE = 1000
# Each middle task returns ~1.5 KiB: 1,000 of them are ~1.5 MiB, past the default bound
# on what one assignment carries of its parents' results, so the sink sees some omitted.
PAD = 1500
MAX_PARENT_RESULTS_BYTES = 1024 * 1024
# A few seconds on an idle machine; generous for 2 shared cores.
SMALL_RUN_TIMEOUT_S = 30.0
WIDE_RUN_TIMEOUT_S = 120.0
RPC_TIMEOUT_S = 10.0
# GetWorkflow of the wide run carries ~1.5 MiB of results.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

DDL = """
CREATE TABLE IF NOT EXISTS wf_starts (
    task_id uuid NOT NULL,
    workflow_id uuid,
    ref text,
    attempt integer NOT NULL,
    token bigint NOT NULL,
    worker_id text NOT NULL,
    started_at timestamptz NOT NULL,
    parents jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS wf_starts_workflow_idx ON wf_starts (workflow_id);
CREATE TABLE IF NOT EXISTS wf_gates (name text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS wf_flags (name text PRIMARY KEY);
"""


# --- the cluster and the API ---------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(
    db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Two nodes and two ``workflow_workers`` processes, shared by every test here."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    with running_cluster(
        db_dsn,
        etcd.endpoint,
        tmp_path_factory.mktemp("workflow-logs"),
        nodes=2,
        workers=0,
        shard_count=SHARDS,
        scheduler_env=ENV,
    ) as running:
        for i in range(WORKERS):
            running.start_worker(f"wf-worker-{i + 1}", WORKER, E2E_DSN=db_dsn)
        yield running


class Api:
    """``WorkflowService`` on whichever live node answers, as the tenant's API key."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._metadata = (("authorization", f"Bearer {cluster.api_key}"),)
        # Nodes not to call (a frozen one would hold each call to its deadline).
        self.avoid: set[str] = set()

    def _stub(self, address: str) -> workflow_service_pb2_grpc.WorkflowServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(
                address,
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            self._channels[address] = channel
        return workflow_service_pb2_grpc.WorkflowServiceStub(channel)

    async def call(self, method: str, request: Any) -> Any:
        # A node killed by the crash test answers UNAVAILABLE until the harness sees it
        # dead: go on to the next live one.
        failure: grpc.aio.AioRpcError | None = None
        for name in sorted(self._cluster.live() - self.avoid):
            call = getattr(self._stub(self._cluster.nodes[name].address), method)
            try:
                return await call(request, metadata=self._metadata, timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                failure = exc
        assert failure is not None, "no live node"
        raise failure

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


@pytest.fixture
async def api(cluster: Cluster) -> AsyncIterator[Api]:
    opened = Api(cluster)
    try:
        yield opened
    finally:
        await opened.close()


@contextlib.contextmanager
def _logs_on_failure(cluster: Cluster) -> Iterator[None]:
    try:
        yield
    except BaseException:
        print(cluster.logs())
        raise


# --- building requests ---------------------------------------------------------------------


def _task(
    ref: str,
    payload: Mapping[str, Any],
    *,
    rule: int = wf.TRIGGER_RULE_ALL_SUCCESS,
    timeout_s: int | None = None,
) -> workflow_service_pb2.WorkflowTask:
    submit = task_service_pb2.SubmitTaskRequest(
        type=TASK_TYPE,
        payload_json=exact_json.dumps(dict(payload)).encode(),
        # Strict: children run the moment they are released, not within a jitter window.
        strict_timing=True,
        max_retries=0,
    )
    if timeout_s is not None:
        submit.timeout.FromSeconds(timeout_s)
    return wf.WorkflowTask(ref=ref, task=submit, trigger_rule=rule)  # type: ignore[arg-type]


def _request(
    name: str,
    tasks: Sequence[workflow_service_pb2.WorkflowTask],
    edges: Sequence[tuple[str, str]],
) -> workflow_service_pb2.CreateWorkflowRequest:
    return wf.CreateWorkflowRequest(
        name=name,
        tasks=list(tasks),
        edges=[wf.WorkflowEdge(parent=p, child=c) for p, c in edges],
    )


DIAMOND_EDGES = [("A", "B"), ("A", "C"), ("B", "D"), ("C", "D")]


def _diamond(
    name: str,
    payloads: Mapping[str, Mapping[str, Any]],
    *,
    d_rule: int = wf.TRIGGER_RULE_ALL_SUCCESS,
) -> workflow_service_pb2.CreateWorkflowRequest:
    # A, B and C leave the rule UNSPECIFIED: the default, all_success.
    unspecified = wf.TRIGGER_RULE_UNSPECIFIED
    tasks = [
        _task(ref, payloads.get(ref, {"result": ref}), rule=d_rule if ref == "D" else unspecified)
        for ref in "ABCD"
    ]
    return _request(name, tasks, DIAMOND_EDGES)


@dataclass(frozen=True)
class Created:
    id: uuid.UUID
    task_ids: dict[str, uuid.UUID]


async def _create(api: Api, request: workflow_service_pb2.CreateWorkflowRequest) -> Created:
    reply = await api.call("CreateWorkflow", request)
    assert reply.created
    assert set(reply.task_ids) == {t.ref for t in request.tasks}
    return Created(
        id=uuid.UUID(reply.workflow.id),
        task_ids={ref: uuid.UUID(task_id) for ref, task_id in reply.task_ids.items()},
    )


# --- reading a run -------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskView:
    ref: str
    id: uuid.UUID
    status: str
    finished_at: datetime | None
    unresolved: int
    upstream_cause: str
    result: Any
    last_error: str
    shard: int
    attempt: int


@dataclass(frozen=True)
class RunView:
    state: str
    finished_at: datetime | None
    tasks: dict[str, TaskView]
    order: list[str]


def _status(value: int) -> str:
    return common_pb2.TaskStatus.Name(value).removeprefix("TASK_STATUS_")  # type: ignore[arg-type]


async def _get(api: Api, workflow_id: uuid.UUID) -> RunView:
    reply = await api.call("GetWorkflow", wf.GetWorkflowRequest(id=str(workflow_id)))
    tasks: dict[str, TaskView] = {}
    for item in reply.tasks:
        t = item.task
        tasks[item.ref] = TaskView(
            ref=item.ref,
            id=uuid.UUID(t.id),
            status=_status(t.status),
            finished_at=wire.timestamp_from_pb(t.finished_at)
            if t.HasField("finished_at")
            else None,
            unresolved=t.unresolved_dependencies,
            upstream_cause=item.upstream_cause,
            result=exact_json.loads(t.result_json.decode()) if t.result_json else None,
            last_error=t.last_error,
            shard=t.shard,
            attempt=t.attempt,
        )
    workflow = reply.workflow
    return RunView(
        state=wf.WorkflowState.Name(workflow.state).removeprefix("WORKFLOW_STATE_"),
        finished_at=wire.timestamp_from_pb(workflow.finished_at)
        if workflow.HasField("finished_at")
        else None,
        tasks=tasks,
        order=[item.ref for item in reply.tasks],
    )


async def _finished(api: Api, workflow_id: uuid.UUID, timeout_s: float) -> RunView:
    """The run once it left RUNNING (every task terminal)."""

    async def done() -> RunView | None:
        run = await _get(api, workflow_id)
        return None if run.state == "RUNNING" else run

    return await eventually(
        done, timeout_s=timeout_s, what=f"workflow {workflow_id} finished", interval_s=0.1
    )


@dataclass(frozen=True)
class Start:
    task_id: uuid.UUID
    workflow_id: uuid.UUID | None
    ref: str | None
    attempt: int
    worker_id: str
    started_at: datetime
    # ctx.parents as the handler saw it: ref -> {task_id, status, result, omitted}, and
    # the refs in ctx.parents' order.
    parents: dict[str, Any]
    parent_order: list[str]


def _starts(dsn: str, workflow_id: uuid.UUID) -> list[Start]:
    """What the handlers recorded for the run, one row per start, oldest first."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT task_id, workflow_id, ref, attempt, worker_id, started_at, parents::text"
            " FROM wf_starts WHERE workflow_id = %s ORDER BY started_at",
            (workflow_id,),
        ).fetchall()
    out: list[Start] = []
    for row in rows:
        # exact_json, not psycopg's json.loads: numbers as the handler saw them.
        seen: list[dict[str, Any]] = exact_json.loads(row[6])
        parents = {p.pop("ref"): p for p in seen}
        out.append(Start(*row[:6], parents, list(parents)))
    return out


def _by_ref(starts: Sequence[Start]) -> dict[str, list[Start]]:
    out: dict[str, list[Start]] = {}
    for start in starts:
        assert start.ref is not None, "a workflow task without ctx.workflow_ref"
        out.setdefault(start.ref, []).append(start)
    return out


def _once(starts: Mapping[str, list[Start]], ref: str) -> Start:
    runs = starts.get(ref, [])
    assert len(runs) == 1, f"{ref} started {len(runs)} times"
    return runs[0]


def _seen(run: RunView, ref: str, result: Any, status: str = "COMPLETED") -> dict[str, Any]:
    """A parent as the handler recorded ``ctx.parents[ref]``."""
    return {
        "task_id": str(run.tasks[ref].id),
        "status": status,
        "result": result,
        "omitted": False,
    }


def _execute(dsn: str, sql: str, *params: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, params)


def _after(start: Start, parent: TaskView) -> None:
    assert parent.finished_at is not None, f"{parent.ref} has no finished_at"
    assert start.started_at > parent.finished_at, (
        f"{start.ref} started at {start.started_at.isoformat()}, before its parent"
        f" {parent.ref} finished at {parent.finished_at.isoformat()}"
    )


# --- 1. the diamond ------------------------------------------------------------------------


async def test_a_diamond_runs_each_task_once_after_its_parents(cluster: Cluster, api: Api) -> None:
    with _logs_on_failure(cluster):
        results: dict[str, Any] = {
            "A": {"ref": "A"},
            "B": {"rows": [1, 2, {"nested": None}], "big": 123456789012345678901234567890},
            "C": "c-result",
            "D": {"merged": True},
        }
        created = await _create(
            api, _diamond("diamond", {ref: {"result": value} for ref, value in results.items()})
        )
        run = await _finished(api, created.id, SMALL_RUN_TIMEOUT_S)
        starts = _by_ref(_starts(cluster.dsn, created.id))

        assert run.state == "SUCCEEDED" and run.finished_at is not None
        assert {ref: t.status for ref, t in run.tasks.items()} == dict.fromkeys("ABCD", "COMPLETED")
        assert {ref: t.unresolved for ref, t in run.tasks.items()} == dict.fromkeys("ABCD", 0)
        assert {ref: run.tasks[ref].id for ref in "ABCD"} == created.task_ids
        assert run.order[0] == "A" and run.order[-1] == "D"  # parents first
        assert {ref: t.result for ref, t in run.tasks.items()} == results

        a, b, c, d = (_once(starts, ref) for ref in "ABCD")
        for ref, start in zip("ABCD", (a, b, c, d), strict=True):
            assert (start.workflow_id, start.ref, start.task_id) == (
                created.id,
                ref,
                created.task_ids[ref],
            )
        assert a.started_at < min(b.started_at, c.started_at, d.started_at)
        _after(b, run.tasks["A"])
        _after(c, run.tasks["A"])
        _after(d, run.tasks["B"])
        _after(d, run.tasks["C"])

        assert a.parents == {}
        assert b.parents == {"A": _seen(run, "A", results["A"])}
        assert c.parents == {"A": _seen(run, "A", results["A"])}
        assert d.parents == {
            "B": _seen(run, "B", results["B"]),
            "C": _seen(run, "C", results["C"]),
        }
        assert d.parent_order == [r for r in run.order if r in ("B", "C")]  # the run's order


# --- 2. fan-out / fan-in, 1,000 wide -------------------------------------------------------


def _mid(i: int) -> str:
    return f"m{i:04d}"


def _mid_result(i: int) -> dict[str, Any]:
    return {"i": i, "pad": "x" * PAD}


async def test_a_thousand_wide_fan_in_counts_every_completion_once(
    cluster: Cluster, api: Api
) -> None:
    with _logs_on_failure(cluster):
        mids = [_mid(i) for i in range(WIDE)]
        tasks = [_task("root", {"result": "root"})]
        tasks += [_task(_mid(i), {"result": {"i": i}, "pad": PAD}) for i in range(WIDE)]
        tasks.append(_task("sink", {"result": "sink"}))
        edges = [("root", m) for m in mids] + [(m, "sink") for m in mids]
        created = await _create(api, _request("fan-in", tasks, edges))

        run = await _finished(api, created.id, WIDE_RUN_TIMEOUT_S)
        starts = _by_ref(_starts(cluster.dsn, created.id))

        assert run.state == "SUCCEEDED"
        not_completed = {r: t.status for r, t in run.tasks.items() if t.status != "COMPLETED"}
        assert not_completed == {}
        assert len(run.tasks) == WIDE + 2
        # Every decrement counted once under concurrent completions: none left over.
        left = {r: t.unresolved for r, t in run.tasks.items() if t.unresolved != 0}
        assert left == {}, f"unresolved_dependencies not 0: {dict(list(left.items())[:10])}"

        twice = {r: len(s) for r, s in starts.items() if len(s) != 1}
        assert twice == {}, f"started other than once: {dict(list(twice.items())[:10])}"
        assert set(starts) == {"root", "sink", *mids}
        # The middle tasks ran concurrently, on both workers.
        assert len({starts[m][0].worker_id for m in mids}) == WORKERS
        root, sink = starts["root"][0], starts["sink"][0]
        for m in mids:
            _after(starts[m][0], run.tasks["root"])
        last = max(mids, key=lambda m: run.tasks[m].finished_at or datetime.min.replace(tzinfo=UTC))
        _after(sink, run.tasks[last])
        assert root.parents == {}

        # The sink saw all 1,000, in the run's order; the results it was given are exact.
        parents = sink.parents
        assert len(parents) == WIDE
        mid_refs = set(mids)
        assert sink.parent_order == [r for r in run.order if r in mid_refs]
        included: list[str] = []
        for m in sink.parent_order:
            seen = parents[m]
            assert (seen["task_id"], seen["status"]) == (str(run.tasks[m].id), "COMPLETED"), m
            if seen["omitted"]:
                assert seen["result"] is None, f"{m} omitted but with a result"
            else:
                assert seen["result"] == _mid_result(int(m[1:])), f"{m}'s result is not exact"
                included.append(m)
        # Within the bound (counted on compact JSON, which the stored text is no shorter
        # than), and the first N in order, never a gap (docs/worker-sdk.md, Workflows).
        sizes = {m: len(exact_json.dumps(_mid_result(int(m[1:]))).encode()) for m in mids}
        carried = sum(sizes[m] for m in included)
        assert sum(sizes.values()) > MAX_PARENT_RESULTS_BYTES  # the scenario passes the bound
        assert carried <= MAX_PARENT_RESULTS_BYTES, f"{carried} bytes of results carried"
        assert len(included) < WIDE, "1.5 MiB of results and none omitted"
        assert included, "every result omitted: the bound is 1 MiB, one result ~1.5 KiB"
        assert included == sink.parent_order[: len(included)], "an omitted result in a gap"
        print(
            f"fan-in: sink saw {len(included)} results ({carried} bytes),"
            f" {WIDE - len(included)} omitted"
        )


# --- 3. a failing parent -------------------------------------------------------------------


async def test_a_dead_lettered_parent_fails_all_success_and_feeds_all_done(
    cluster: Cluster, api: Api
) -> None:
    with _logs_on_failure(cluster):
        flag = f"fail-{uuid.uuid4().hex}"
        _execute(cluster.dsn, "INSERT INTO wf_flags (name) VALUES (%s)", flag)
        payloads = {"B": {"fail_while": flag, "result": "B"}, "C": {"result": {"c": 3}}}
        strict = await _create(api, _diamond("fail-all-success", payloads))
        lenient = await _create(
            api, _diamond("fail-all-done", payloads, d_rule=wf.TRIGGER_RULE_ALL_DONE)
        )

        # all_success: D can never run, so it is UPSTREAM_FAILED, naming B.
        run = await _finished(api, strict.id, SMALL_RUN_TIMEOUT_S)
        starts = _by_ref(_starts(cluster.dsn, strict.id))
        assert run.state == "FAILED"
        statuses = {ref: t.status for ref, t in run.tasks.items()}
        assert statuses == {
            "A": "COMPLETED",
            "B": "DEAD_LETTER",
            "C": "COMPLETED",
            "D": "UPSTREAM_FAILED",
        }
        assert run.tasks["D"].upstream_cause == "B"
        assert [run.tasks[r].upstream_cause for r in "ABC"] == ["", "", ""]
        assert "D" not in starts, "an UPSTREAM_FAILED task started"
        for ref in "ABC":
            _once(starts, ref)

        # all_done: D runs once both are terminal, and sees B's failure and C's result.
        run = await _finished(api, lenient.id, SMALL_RUN_TIMEOUT_S)
        starts = _by_ref(_starts(cluster.dsn, lenient.id))
        assert run.state == "FAILED"  # a task dead-lettered
        statuses = {ref: t.status for ref, t in run.tasks.items()}
        assert statuses == {
            "A": "COMPLETED",
            "B": "DEAD_LETTER",
            "C": "COMPLETED",
            "D": "COMPLETED",
        }
        d = _once(starts, "D")
        _after(d, run.tasks["B"])
        _after(d, run.tasks["C"])
        assert d.parents == {
            "B": _seen(run, "B", None, status="DEAD_LETTER"),
            "C": _seen(run, "C", {"c": 3}),
        }


# --- 4. cancel and retry -------------------------------------------------------------------


async def test_cancel_stops_the_running_root_and_cancels_the_waiting_tasks(
    cluster: Cluster, api: Api
) -> None:
    with _logs_on_failure(cluster):
        tasks = [
            # Blocks until cancelled; the timeout only bounds a broken run.
            _task("A", {"until_cancelled": True}, timeout_s=120),
            _task("B", {"result": "B"}),
            _task("C", {"result": "C"}),
        ]
        created = await _create(api, _request("cancel", tasks, [("A", "B"), ("A", "C")]))

        async def root_running() -> bool:
            run = await _get(api, created.id)
            return run.tasks["A"].status == "RUNNING"

        await eventually(root_running, timeout_s=SMALL_RUN_TIMEOUT_S, what="A RUNNING")

        # A running workflow cannot be retried.
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await api.call("RetryWorkflow", wf.RetryWorkflowRequest(id=str(created.id)))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value

        reply = await api.call(
            "CancelWorkflow", wf.CancelWorkflowRequest(id=str(created.id), reason="e2e cancel")
        )
        assert (reply.cancelled, reply.stopping) == (2, 1)

        run = await _finished(api, created.id, SMALL_RUN_TIMEOUT_S)
        starts = _by_ref(_starts(cluster.dsn, created.id))
        assert run.state == "CANCELLED"
        assert {ref: t.status for ref, t in run.tasks.items()} == dict.fromkeys("ABC", "CANCELLED")
        # Cancelled by the cancel itself, not failed by A's cancellation.
        assert [run.tasks[r].upstream_cause for r in "BC"] == ["", ""]
        assert [run.tasks[r].last_error for r in "BC"] == ["e2e cancel", "e2e cancel"]
        assert set(starts) == {"A"}, "a waiting task started after the cancel"
        _once(starts, "A")


async def test_retry_reruns_only_what_did_not_complete(cluster: Cluster, api: Api) -> None:
    with _logs_on_failure(cluster):
        flag = f"fail-{uuid.uuid4().hex}"
        _execute(cluster.dsn, "INSERT INTO wf_flags (name) VALUES (%s)", flag)
        payloads = {
            "A": {"result": "a"},
            "B": {"fail_while": flag, "result": {"b": "fixed"}},
            "C": {"result": {"c": 1}},
            "D": {"result": "d"},
        }
        created = await _create(api, _diamond("retry", payloads))
        run = await _finished(api, created.id, SMALL_RUN_TIMEOUT_S)
        assert run.state == "FAILED"
        assert (run.tasks["B"].status, run.tasks["D"].status) == ("DEAD_LETTER", "UPSTREAM_FAILED")
        before = _by_ref(_starts(cluster.dsn, created.id))
        assert {ref: len(s) for ref, s in before.items()} == {"A": 1, "B": 1, "C": 1}

        # Fix the handler, then retry from the failures on.
        _execute(cluster.dsn, "DELETE FROM wf_flags WHERE name = %s", flag)
        reply = await api.call("RetryWorkflow", wf.RetryWorkflowRequest(id=str(created.id)))
        assert reply.reopened == 2  # B (DEAD_LETTER) and D (UPSTREAM_FAILED)

        run = await _finished(api, created.id, SMALL_RUN_TIMEOUT_S)
        starts = _by_ref(_starts(cluster.dsn, created.id))
        assert run.state == "SUCCEEDED"
        assert {ref: t.status for ref, t in run.tasks.items()} == dict.fromkeys("ABCD", "COMPLETED")
        assert run.tasks["D"].upstream_cause == ""
        # What completed was kept: A and C did not run again.
        assert {ref: len(s) for ref, s in starts.items()} == {"A": 1, "B": 2, "C": 1, "D": 1}
        d = _once(starts, "D")
        _after(starts["B"][1], run.tasks["A"])
        _after(d, run.tasks["B"])
        assert d.parents == {
            "B": _seen(run, "B", {"b": "fixed"}),
            "C": _seen(run, "C", {"c": 1}),
        }
        assert run.tasks["B"].result == {"b": "fixed"}


# --- 5. the node owning D's shard dies right after B and C complete -----------------------

CRASH_PICKS = 30
"""Diamonds created, at most, to find one whose B and C are on shards of one node and D
on a shard of the other: 1 in 4 are, so 30 fail to with probability (3/4)^30 < 0.02 %."""


async def _crash_diamond(api: Api, cluster: Cluster, gate: str) -> tuple[Created, str]:
    """A diamond whose B and C block on ``gate``, B's and C's shards owned by one node and
    D's by another (the victim, returned): B's and C's completions commit on a node that
    lives on, and D's release has to cross to the node that dies. The diamonds not taken
    are cancelled at once (their B and C end CANCELLED, their D never runs)."""
    await spread(cluster)
    payloads = {
        "B": {"gate": gate, "result": {"b": 2}},
        "C": {"gate": gate, "result": {"c": 3}},
    }
    for attempt in range(CRASH_PICKS):
        created = await _create(api, _diamond(f"crash-{attempt}", payloads))
        shards = {ref: t.shard for ref, t in (await _get(api, created.id)).tasks.items()}
        owner = owners(cluster.dsn)
        victim = owner[shards["D"]]
        if owner[shards["B"]] == owner[shards["C"]] != victim:
            return created, victim
        await api.call("CancelWorkflow", wf.CancelWorkflowRequest(id=str(created.id)))
    raise AssertionError(f"no diamond of {CRASH_PICKS} had B and C away from D's shard owner")


async def _parents_blocked(api: Api, created: Created) -> None:
    async def blocked() -> bool:
        run = await _get(api, created.id)
        return all(run.tasks[r].status == "RUNNING" for r in "BC")

    await eventually(blocked, timeout_s=SMALL_RUN_TIMEOUT_S, what="B and C RUNNING")


async def _release_and_wait(api: Api, cluster: Cluster, created: Created, gate: str) -> RunView:
    """Open the gate; the run as soon as GetWorkflow shows B and C COMPLETED."""
    _execute(cluster.dsn, "INSERT INTO wf_gates (name) VALUES (%s)", gate)

    async def parents_done() -> RunView | None:
        run = await _get(api, created.id)
        return run if all(run.tasks[r].status == "COMPLETED" for r in "BC") else None

    return await eventually(
        parents_done, timeout_s=SMALL_RUN_TIMEOUT_S, what="B and C COMPLETED", interval_s=0.01
    )


async def _ran_once_after_the_crash(
    api: Api, cluster: Cluster, created: Created, died_at: datetime
) -> tuple[RunView, Start]:
    """The run SUCCEEDED with every task started once, D after B and C with their
    results, and D started within the crash bound of ``died_at``."""
    run = await _finished(api, created.id, SMALL_RUN_TIMEOUT_S + CRASH_BOUND_S)
    starts = _by_ref(_starts(cluster.dsn, created.id))
    assert run.state == "SUCCEEDED"
    assert {ref: t.status for ref, t in run.tasks.items()} == dict.fromkeys("ABCD", "COMPLETED")
    for ref in "ABC":
        _once(starts, ref)
    d = _once(starts, "D")
    _after(d, run.tasks["B"])
    _after(d, run.tasks["C"])
    assert d.parents == {"B": _seen(run, "B", {"b": 2}), "C": _seen(run, "C", {"c": 3})}
    # docs/failure-model.md: a dead scheduler's tasks resume within lease TTL + 2 s.
    since_s = (d.started_at - died_at).total_seconds()
    assert since_s <= CRASH_BOUND_S, f"D started {since_s:.3f} s after the crash"
    return run, d


def _report(
    label: str, run: RunView, d: Start, victim: str, at_kill: str, died_at: datetime
) -> None:
    due = max(run.tasks[r].finished_at or died_at for r in "BC")
    print(
        f"{label}: D on shard {run.tasks['D'].shard} of {victim}, {at_kill} at the kill;"
        f" D started {(d.started_at - due).total_seconds():.3f} s after B and C finished,"
        f" {(d.started_at - died_at).total_seconds():.3f} s after the crash"
        f" (bound {CRASH_BOUND_S} s), attempt {run.tasks['D'].attempt}"
    )


async def test_the_child_runs_once_when_its_shards_owner_is_killed_after_its_parents(
    cluster: Cluster, api: Api
) -> None:
    """SIGKILL as soon as GetWorkflow shows B and C COMPLETED: D's owner may have
    dispatched D in between (then its worker settles through the survivor) or not (then
    the survivor takes the shard over and dispatches it); either way D runs once."""
    with _logs_on_failure(cluster):
        gate = f"gate-{uuid.uuid4().hex}"
        created, victim = await _crash_diamond(api, cluster, gate)
        await _parents_blocked(api, created)
        released = await _release_and_wait(api, cluster, created, gate)
        cluster.nodes[victim].process.kill()
        killed_at = datetime.now(UTC)
        run, d = await _ran_once_after_the_crash(api, cluster, created, killed_at)
        _report("kill", run, d, victim, released.tasks["D"].status, killed_at)


async def test_the_child_runs_once_when_its_shards_owner_died_before_releasing_it(
    cluster: Cluster, api: Api
) -> None:
    """The same crash, made certain to fall between B's and C's completions and D's
    dispatch: D's owner is frozen (SIGSTOP) before the gate opens, so it cannot act on
    D's release, and SIGKILLed once B and C completed. D is then run only by the node
    that takes its shard over, within the crash bound of the freeze (the moment the
    owner stopped renewing its etcd lease). Starts a third node first: the test before
    left one."""
    with _logs_on_failure(cluster):
        if len(cluster.live()) < 2:
            await asyncio.to_thread(cluster.start_node, "node-3")
        gate = f"gate-{uuid.uuid4().hex}"
        created, victim = await _crash_diamond(api, cluster, gate)
        await _parents_blocked(api, created)
        api.avoid.add(victim)  # a frozen node would hold every call to its deadline
        cluster.nodes[victim].process.pause()
        frozen_at = datetime.now(UTC)
        try:
            released = await _release_and_wait(api, cluster, created, gate)
        finally:
            cluster.nodes[victim].process.kill()
        at_kill = released.tasks["D"].status
        assert at_kill in ("SCHEDULED", "PRELOADED"), f"D {at_kill} while its owner was frozen"
        run, d = await _ran_once_after_the_crash(api, cluster, created, frozen_at)
        _report("freeze+kill", run, d, victim, at_kill, frozen_at)

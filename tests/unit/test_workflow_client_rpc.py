"""The client's workflow calls over a real gRPC channel, against a scripted test double
of WorkflowService (a ``grpc.aio`` server on port 0): what each method sends, what it
returns, how a refusal maps to an exception, and which calls go on to another node
after UNAVAILABLE. The real service is tested in tests/integration/test_workflow_cli.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from chronoshard import _convert as convert
from chronoshard.client import Client
from chronoshard.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError
from chronoshard.sync_client import SyncClient
from chronoshard.types import (
    TaskSpec,
    TriggerRule,
    WorkflowEdge,
    WorkflowState,
    WorkflowTask,
)
from chronoshard.v1 import common_pb2, workflow_service_pb2, workflow_service_pb2_grpc
from chronoshard.wire import error_info_metadata

T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
S = grpc.StatusCode
W = workflow_service_pb2


@dataclass
class FakeWorkflowService(workflow_service_pb2_grpc.WorkflowServiceServicer):  # type: ignore[misc]
    """Keeps the workflows it was sent; ``unavailable`` fails those methods always."""

    unavailable: set[str] = field(default_factory=set)
    seen: list[tuple[str, Any]] = field(default_factory=list)
    runs: dict[str, W.GetWorkflowResponse] = field(default_factory=dict)

    async def _enter(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.seen.append((method, request))
        if method in self.unavailable:
            await context.abort(S.UNAVAILABLE, "node going away")

    def _workflow(self, workflow_id: str) -> W.Workflow:
        return self.runs[workflow_id].workflow

    async def CreateWorkflow(
        self, request: W.CreateWorkflowRequest, context: grpc.aio.ServicerContext
    ) -> W.CreateWorkflowResponse:
        await self._enter("CreateWorkflow", request, context)
        if any(task.ref == "bad ref" for task in request.tasks):
            info = common_pb2.ErrorInfo(
                code="INVALID_ARGUMENT", reason="INVALID_ARGUMENT", field="tasks[1].ref"
            )
            await context.abort(
                S.INVALID_ARGUMENT, "not a reference", trailing_metadata=error_info_metadata(info)
            )
        workflow_id = f"wf-{len(self.runs) + 1}"
        workflow = W.Workflow(
            id=workflow_id,
            name=request.name,
            state=W.WORKFLOW_STATE_RUNNING,
            task_count=len(request.tasks),
            edge_count=len(request.edges),
            idempotency_key=request.idempotency_key,
        )
        workflow.scheduled_at.CopyFrom(convert.timestamp(T0, "scheduled_at"))
        states = [
            W.WorkflowTaskState(
                ref=task.ref,
                task=common_pb2.Task(
                    id=f"{workflow_id}-{task.ref}",
                    type=task.task.type,
                    status=common_pb2.TASK_STATUS_SCHEDULED,
                    payload_json=task.task.payload_json,
                    workflow_id=workflow_id,
                ),
                trigger_rule=task.trigger_rule,
            )
            for task in request.tasks
        ]
        self.runs[workflow_id] = W.GetWorkflowResponse(
            workflow=workflow, tasks=states, edges=request.edges
        )
        return W.CreateWorkflowResponse(
            workflow=workflow, task_ids={s.ref: s.task.id for s in states}, created=True
        )

    async def GetWorkflow(
        self, request: W.GetWorkflowRequest, context: grpc.aio.ServicerContext
    ) -> W.GetWorkflowResponse:
        await self._enter("GetWorkflow", request, context)
        return self.runs[request.id]

    async def ListWorkflows(
        self, request: W.ListWorkflowsRequest, context: grpc.aio.ServicerContext
    ) -> W.ListWorkflowsResponse:
        await self._enter("ListWorkflows", request, context)
        found = [
            run.workflow
            for run in reversed(self.runs.values())  # newest first
            if request.state in (0, run.workflow.state)
        ]
        start = int(request.page_token or 0)
        end = start + (request.page_size or 100)
        return W.ListWorkflowsResponse(
            workflows=found[start:end], next_page_token=str(end) if end < len(found) else ""
        )

    async def CancelWorkflow(
        self, request: W.CancelWorkflowRequest, context: grpc.aio.ServicerContext
    ) -> W.CancelWorkflowResponse:
        await self._enter("CancelWorkflow", request, context)
        workflow = self._workflow(request.id)
        workflow.state = W.WORKFLOW_STATE_CANCELLED
        return W.CancelWorkflowResponse(
            workflow=workflow, cancelled=len(request.reason), stopping=1
        )

    async def RetryWorkflow(
        self, request: W.RetryWorkflowRequest, context: grpc.aio.ServicerContext
    ) -> W.RetryWorkflowResponse:
        await self._enter("RetryWorkflow", request, context)
        workflow = self._workflow(request.id)
        if workflow.state == W.WORKFLOW_STATE_RUNNING:
            info = common_pb2.ErrorInfo(
                code="FAILED_PRECONDITION", reason="WORKFLOW_RUNNING", field="id"
            )
            await context.abort(
                S.FAILED_PRECONDITION,
                f"workflow {request.id} is still running",
                trailing_metadata=error_info_metadata(info),
            )
        workflow.state = W.WORKFLOW_STATE_RUNNING
        return W.RetryWorkflowResponse(workflow=workflow, reopened=2)


@dataclass
class Server:
    service: FakeWorkflowService
    target: str
    server: grpc.aio.Server


async def _start() -> Server:
    service = FakeWorkflowService()
    server = grpc.aio.server()
    workflow_service_pb2_grpc.add_WorkflowServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return Server(service, f"127.0.0.1:{port}", server)


@pytest.fixture
async def fake() -> AsyncIterator[Server]:
    server = await _start()
    yield server
    await server.server.stop(None)


def _diamond() -> list[WorkflowTask]:
    return [
        WorkflowTask("fetch", TaskSpec(type="records.fetch", payload={"day": 1})),
        WorkflowTask("a", TaskSpec(type="t.a")),
        WorkflowTask("b", TaskSpec(type="t.b")),
        WorkflowTask("join", TaskSpec(type="t.join"), TriggerRule.ALL_DONE),
    ]


DIAMOND_EDGES = [("fetch", "a"), ("fetch", "b"), WorkflowEdge("a", "join"), ("b", "join")]


async def test_the_async_client_sends_and_reads_every_call(fake: Server) -> None:
    async with Client(fake.target, timeout_s=5.0) as client:
        made = await client.create_workflow(
            "diamond", _diamond(), DIAMOND_EDGES, delay_s=30, idempotency_key="k"
        )
        [(_, sent)] = fake.service.seen
        assert sent.delay.seconds == 30 and sent.idempotency_key == "k"
        assert [e.child for e in sent.edges] == ["a", "b", "join", "join"]
        assert made.created and made.workflow.state is WorkflowState.RUNNING
        assert made.task_ids["join"] == "wf-1-join" and len(made.task_ids) == 4

        detail = await client.get_workflow(made.workflow.id)
        assert [t.ref for t in detail.tasks] == ["fetch", "a", "b", "join"]
        assert detail.tasks[0].task.payload == {"day": 1}
        assert detail.tasks[3].trigger_rule is TriggerRule.ALL_DONE
        assert detail.edges[2] == WorkflowEdge("a", "join")

        await client.create_workflow("second", _diamond()[:1])
        page = await client.list_workflows(page_size=1)
        assert [w.name for w in page.workflows] == ["second"] and page.next_page_token
        names = [w.name async for w in client.iter_workflows(page_size=1)]
        assert names == ["second", "diamond"]

        with pytest.raises(FailedPreconditionError) as running:
            await client.retry_workflow(made.workflow.id)
        assert running.value.reason == "WORKFLOW_RUNNING"
        assert "is still running" in str(running.value)

        cancelled = await client.cancel_workflow(made.workflow.id, "abc")
        assert (cancelled.cancelled, cancelled.stopping) == (3, 1)
        assert cancelled.workflow.state is WorkflowState.CANCELLED
        assert [w.name async for w in client.iter_workflows(state="CANCELLED")] == ["diamond"]
        retried = await client.retry_workflow(made.workflow.id)
        assert retried.reopened == 2 and retried.workflow.state is WorkflowState.RUNNING

        bad = [*_diamond()[:1], WorkflowTask("bad ref", TaskSpec(type="t"))]
        with pytest.raises(InvalidArgumentError) as refused:
            await client.create_workflow("bad", bad)
        assert refused.value.field == "tasks[1].ref"


async def test_what_cannot_be_encoded_is_refused_before_any_call(fake: Server) -> None:
    async with Client(fake.target, timeout_s=5.0) as client:
        with pytest.raises(TypeError, match=r"^edges\[1\]: "):
            await client.create_workflow("w", _diamond(), [("fetch", "a"), "fetch->b"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="at most one of at and delay_s"):
            await client.create_workflow("w", _diamond(), at=T0, delay_s=1)
        with pytest.raises(ValueError, match="state must be one of"):
            await client.list_workflows(state="DONE")
    assert fake.service.seen == []


async def test_the_sync_client_has_the_same_calls(fake: Server) -> None:
    def scripted() -> None:
        with SyncClient(fake.target, timeout_s=5.0) as client:
            # Generators are read on the caller's thread, before the call.
            made = client.create_workflow(
                "sync", (t for t in _diamond()), (e for e in DIAMOND_EDGES), at=T0
            )
            assert made.workflow.task_count == 4 and made.workflow.edge_count == 4
            assert client.get_workflow(made.workflow.id).workflow.name == "sync"
            assert [w.id for w in client.iter_workflows()] == [made.workflow.id]
            assert client.list_workflows(state=WorkflowState.FAILED).workflows == ()
            assert client.cancel_workflow(made.workflow.id).workflow.state is (
                WorkflowState.CANCELLED
            )
            assert client.retry_workflow(made.workflow.id).reopened == 2

    await asyncio.to_thread(scripted)
    [(_, sent), *_] = fake.service.seen
    assert sent.scheduled_at.ToDatetime(tzinfo=UTC) == T0


async def test_failover_repeats_reads_cancels_and_keyed_creates_only(fake: Server) -> None:
    failing = await _start()
    failing.service.unavailable = {
        "CreateWorkflow",
        "GetWorkflow",
        "ListWorkflows",
        "CancelWorkflow",
        "RetryWorkflow",
    }
    try:
        async with Client([failing.target, fake.target], timeout_s=2.0) as client:
            for i in range(4):  # round-robin: some calls start at the failing node
                made = await client.create_workflow("k", _diamond()[:1], idempotency_key=f"key-{i}")
                await client.get_workflow(made.workflow.id)
                await client.list_workflows()
                await client.cancel_workflow(made.workflow.id)
            assert len(fake.service.seen) == 16
            before = len(fake.service.seen)
            unavailable = 0
            for _ in range(4):
                for call in (
                    client.create_workflow("no-key", _diamond()[:1]),
                    client.retry_workflow("wf-1"),
                ):
                    try:
                        await call
                    except UnavailableError:
                        unavailable += 1
                    except FailedPreconditionError:
                        pass  # reached the good node: the fake's retry of a running run
            # Each of the 8 calls was sent once: those that reached the failing node came
            # back UNAVAILABLE (it may have been applied), none went on to the other.
            unsafe_at_failing = [
                m
                for m, r in failing.service.seen
                if m == "RetryWorkflow" or (m == "CreateWorkflow" and not r.idempotency_key)
            ]
            assert unavailable == len(unsafe_at_failing) >= 2
            assert len(fake.service.seen) - before == 8 - unavailable
    finally:
        await failing.server.stop(None)

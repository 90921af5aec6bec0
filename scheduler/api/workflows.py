"""The ``WorkflowService`` servicer: DAGs of tasks (docs/architecture.md#d9).

The same three steps as every servicer: the caller's tenant from its API key, the whole
request validated (:mod:`.workflow_requests`) before anything is written, then one
transaction in :class:`~chronoshard.scheduler.store.workflows.WorkflowStore`. What a
call changes that a shard's owner must act on goes to the node's router after the
commit, like a submit's or a cancel's: the new run's tasks without parents, the tasks a
retry reopened or a cancel released (due now), and the cancels themselves.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, TypeAlias

import grpc

from chronoshard.clock import Clock, SystemClock
from chronoshard.scheduler.api import boundary, convert, task_requests, workflow_requests
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.task_requests import SubmitLimits
from chronoshard.scheduler.cluster.routing import ChangedTask
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.models import Task, Tenant
from chronoshard.scheduler.core.workflows import RunState
from chronoshard.scheduler.errors import (
    InvalidArgument,
    WorkflowKeyReused,
    WorkflowNotFound,
    WorkflowStillRunning,
)
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.submits import SubmitStore
from chronoshard.scheduler.store.workflows import CANCELLED_REASON, WorkflowRun, WorkflowStore
from chronoshard.v1 import workflow_service_pb2 as pb
from chronoshard.v1 import workflow_service_pb2_grpc

Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
DEFAULT_PAGE_SIZE = 100


class WorkflowListener(Protocol):
    """What the node hears from the WorkflowService, after each commit (the router)."""

    def tasks_submitted(self, tasks: Sequence[ChangedTask]) -> None: ...

    def cancel_requested(self, task: Task, reason: str) -> None: ...


class _NoListener:
    def tasks_submitted(self, tasks: Sequence[ChangedTask]) -> None:
        pass

    def cancel_requested(self, task: Task, reason: str) -> None:
        pass


class WorkflowServiceServicer(workflow_service_pb2_grpc.WorkflowServiceServicer):
    """The ``chronoshard.v1.WorkflowService`` implementation (see ``docs/api.md``)."""

    def __init__(
        self,
        *,
        config: SchedulerConfig,
        store: Store,
        authenticator: Authenticator,
        listener: WorkflowListener | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._workflows = WorkflowStore(store, SubmitStore(store))
        self._auth = authenticator
        self._listener: WorkflowListener = listener or _NoListener()
        self._clock = clock or SystemClock()
        self._limits = SubmitLimits.from_config(config)
        self._max_page_size = config.limits.max_list_page_size

    # --- the RPCs -------------------------------------------------------------------------

    async def CreateWorkflow(
        self, request: pb.CreateWorkflowRequest, context: Context
    ) -> pb.CreateWorkflowResponse:
        trace = task_requests.trace_context_from_metadata(context.invocation_metadata())
        return await boundary.serve_tenant(
            "WorkflowService.CreateWorkflow",
            context,
            self._auth,
            lambda tenant: self._create(tenant, request, trace),
        )

    async def GetWorkflow(
        self, request: pb.GetWorkflowRequest, context: Context
    ) -> pb.GetWorkflowResponse:
        return await boundary.serve_tenant(
            "WorkflowService.GetWorkflow", context, self._auth, lambda t: self._get(t, request)
        )

    async def ListWorkflows(
        self, request: pb.ListWorkflowsRequest, context: Context
    ) -> pb.ListWorkflowsResponse:
        return await boundary.serve_tenant(
            "WorkflowService.ListWorkflows", context, self._auth, lambda t: self._list(t, request)
        )

    async def CancelWorkflow(
        self, request: pb.CancelWorkflowRequest, context: Context
    ) -> pb.CancelWorkflowResponse:
        return await boundary.serve_tenant(
            "WorkflowService.CancelWorkflow",
            context,
            self._auth,
            lambda t: self._cancel(t, request),
        )

    async def RetryWorkflow(
        self, request: pb.RetryWorkflowRequest, context: Context
    ) -> pb.RetryWorkflowResponse:
        return await boundary.serve_tenant(
            "WorkflowService.RetryWorkflow", context, self._auth, lambda t: self._retry(t, request)
        )

    # --- handlers -------------------------------------------------------------------------

    async def _create(
        self,
        tenant: Tenant,
        request: pb.CreateWorkflowRequest,
        trace: dict[str, str] | None,
    ) -> pb.CreateWorkflowResponse:
        new = workflow_requests.create_from_pb(
            request,
            tenant_id=tenant.id,
            now=self._clock.now(),
            limits=self._limits,
            trace_context=trace,
        )
        run, created = await self._workflows.create(new)
        if not created:
            if run.request_fingerprint != new.fingerprint:
                assert new.idempotency_key is not None
                raise WorkflowKeyReused(new.idempotency_key, run.id)
            tasks, _ = await self._workflows.tasks_and_edges(run)
            return pb.CreateWorkflowResponse(
                workflow=workflow_to_pb(run),
                task_ids={t.ref: str(t.task.id) for t in tasks},
                created=False,
            )
        roots = [p.new for _, _, p in new.tasks if p.new.unresolved_dependencies == 0]
        self._listener.tasks_submitted(roots)
        return pb.CreateWorkflowResponse(
            workflow=workflow_to_pb(run),
            task_ids={ref: str(p.new.id) for ref, _, p in new.tasks},
            created=True,
        )

    async def _get(self, tenant: Tenant, request: pb.GetWorkflowRequest) -> pb.GetWorkflowResponse:
        run = await self._found(tenant, request.id)
        tasks, edges = await self._workflows.tasks_and_edges(run)
        return pb.GetWorkflowResponse(
            workflow=workflow_to_pb(run),
            tasks=[
                pb.WorkflowTaskState(
                    ref=t.ref,
                    task=convert.task_to_pb(t.task),
                    trigger_rule=workflow_requests.RULE_TO_PB[t.trigger_rule],
                    upstream_cause=t.upstream_cause or "",
                )
                for t in tasks
            ],
            edges=[pb.WorkflowEdge(parent=parent, child=child) for parent, child in edges],
        )

    async def _list(
        self, tenant: Tenant, request: pb.ListWorkflowsRequest
    ) -> pb.ListWorkflowsResponse:
        size = request.page_size or DEFAULT_PAGE_SIZE
        if size > self._max_page_size:
            raise InvalidArgument("page_size", f"must be at most {self._max_page_size}")
        state = workflow_requests.state_from_pb(request.state, "state")
        after = _page_token_from_pb(request.page_token)
        found = await self._workflows.page(tenant.id, state, after, size + 1)
        response = pb.ListWorkflowsResponse(workflows=[workflow_to_pb(r) for r in found[:size]])
        if len(found) > size:
            last = found[size - 1]
            response.next_page_token = _page_token_to_pb(last.created_at, last.id)
        return response

    async def _cancel(
        self, tenant: Tenant, request: pb.CancelWorkflowRequest
    ) -> pb.CancelWorkflowResponse:
        run = await self._found(tenant, request.id)
        if run.state is not RunState.RUNNING:
            return pb.CancelWorkflowResponse(workflow=workflow_to_pb(run))
        reason = task_requests.reason_from_pb(request.reason, default=CANCELLED_REASON)
        result = await self._workflows.cancel(run, reason)
        for task in [*result.cancelled, *result.stopping]:
            self._listener.cancel_requested(task, reason)
        if result.due:
            self._listener.tasks_submitted(result.due)
        return pb.CancelWorkflowResponse(
            workflow=workflow_to_pb(result.run),
            cancelled=len(result.cancelled),
            stopping=len(result.stopping),
        )

    async def _retry(
        self, tenant: Tenant, request: pb.RetryWorkflowRequest
    ) -> pb.RetryWorkflowResponse:
        run = await self._found(tenant, request.id)
        if run.state is RunState.RUNNING:
            raise WorkflowStillRunning(run.id)
        result = await self._workflows.retry(run)
        if result.due:
            self._listener.tasks_submitted(result.due)
        return pb.RetryWorkflowResponse(
            workflow=workflow_to_pb(result.run), reopened=result.reopened
        )

    async def _found(self, tenant: Tenant, value: str) -> WorkflowRun:
        run_id = convert.uuid_from_pb(value, "id")
        run = await self._workflows.get(tenant.id, run_id)
        if run is None:
            raise WorkflowNotFound(run_id)
        return run


def workflow_to_pb(run: WorkflowRun) -> pb.Workflow:
    out = pb.Workflow(
        id=str(run.id),
        tenant_id=str(run.tenant_id),
        name=run.name,
        state=workflow_requests.STATE_TO_PB[run.state],
        scheduled_at=convert.ts_to_pb(run.scheduled_at),
        created_at=convert.ts_to_pb(run.created_at),
        task_count=run.task_count,
        edge_count=run.edge_count,
        idempotency_key=run.idempotency_key or "",
        job_id=run.job_id or "",
        schedule_id="" if run.schedule_id is None else str(run.schedule_id),
    )
    if run.logical_date is not None:
        out.logical_date.CopyFrom(convert.ts_to_pb(run.logical_date))
    if run.finished_at is not None:
        out.finished_at.CopyFrom(convert.ts_to_pb(run.finished_at))
    return out


def _page_token_to_pb(created_at: datetime, run_id: uuid.UUID) -> str:
    return convert.name_page_token_to_pb(f"{created_at.isoformat()} {run_id}")


def _page_token_from_pb(token: str) -> tuple[datetime, uuid.UUID] | None:
    text = convert.name_page_token_from_pb(token)
    if text == "":
        return None
    try:
        at, _, run_id = text.partition(" ")
        created_at = datetime.fromisoformat(at)
        if created_at.tzinfo is None:
            raise ValueError("naive")
        return created_at, uuid.UUID(run_id)
    except ValueError:
        raise InvalidArgument("page_token", "not a token this server issued") from None

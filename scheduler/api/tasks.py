"""The ``TaskService`` servicer: what clients call to submit, read, cancel and retry tasks.

Each RPC is the same three steps. The caller is authenticated from its API key
(:class:`~.auth.Authenticator`), and that tenant, never a request field, scopes
everything the call can see or touch (docs/architecture.md#d11). The request is parsed and validated
completely by the pure functions of :mod:`.task_requests` (values read through
:mod:`.convert`) before anything is written, so a bad field is refused
(``INVALID_ARGUMENT`` naming it) with nothing written; that is the only validation a
submit gets (the store writes what it is handed: ``store.submits.SubmitStore``). Then
one store call does the work, in one transaction, run as the caller's tenant
(:meth:`~chronoshard.scheduler.store.database.Store.tenant_transaction`: row-level
security admits that tenant's rows only). Single ``SubmitTask`` calls share that
transaction with concurrent ones (group commit, the node's one
:class:`~chronoshard.scheduler.dispatch.group_commit.GroupCommitter` in its isolating
mode): each is still answered only after its row committed, with its own outcome. Such
a transaction holds several tenants' rows, so it runs as the node's role instead, not
under row-level security: each request's tenant is the one its key authenticated
(:mod:`chronoshard.scheduler.store.submits`).

``SubmitStream`` carries single submits on one open stream: each request is a
``SubmitTask`` of its own (the same validation and group commit), answered in the order
sent, and a refused request is answered with its ``ErrorInfo`` rather than ending the
stream (:meth:`TaskServiceServicer._streamed_submit`, through
:func:`.boundary.refusal_of`, the same translation the unary calls get).

Errors leave in exactly one place, :meth:`TaskServiceServicer._serve`, through the
node's one error boundary (:func:`.boundary.serve`): a :class:`~.errors.SchedulerError`
becomes the gRPC status its class names plus an ``ErrorInfo`` (reason, field,
retryable) in the trailing metadata (see ``chronoshard.wire``), both bounded in size;
anything else is a bug, logged with its traceback and answered ``INTERNAL`` with a
generic message, so internals never reach a client.

A tenant's quotas show here twice (docs/operations.md#tenants-and-quotas): a submit over
the tenant's submit rate is refused before anything is written (``RESOURCE_EXHAUSTED``
with a ``RetryInfo``, :mod:`.quotas`), and ``GetTask`` of a task that is due but waits
says so when the tenant's dispatch quotas are what holds it (``waiting_reason``, read
from the same rows the dispatch rounds' check reads).

What the node must do when tasks appear or are cancelled (wake the preloader, forget a
timer, tell a worker) it learns through the :class:`SubmitListener` it passes in, called
after the transaction committed; a listener that raises is logged and ignored, because
the write has happened and the client must hear so.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc

from chronoshard.clock import Clock, SystemClock
from chronoshard.scheduler.api import boundary, convert, task_requests
from chronoshard.scheduler.api.auth import Authenticator
from chronoshard.scheduler.api.quotas import SubmitQuotas
from chronoshard.scheduler.cluster.routing import ChangedTask
from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.ids import new_task_id, unix_ms
from chronoshard.scheduler.core.listing import PageCursor
from chronoshard.scheduler.core.models import PreparedTask, SubmitResult, Task, Tenant
from chronoshard.scheduler.core.quotas import HeldBy
from chronoshard.scheduler.core.states import TaskStatus
from chronoshard.scheduler.dispatch.group_commit import GroupCommitter
from chronoshard.scheduler.errors import (
    IdempotencyConflict,
    InvalidArgument,
    StoreUnavailable,
    TaskNotFound,
)
from chronoshard.scheduler.store.database import Store
from chronoshard.scheduler.store.quotas import DispatchQuotaStore
from chronoshard.scheduler.store.submits import (
    DEFAULT_LINGER_S,
    DEFAULT_MAX_BATCH,
    Request,
    SubmitStore,
)
from chronoshard.scheduler.store.tasks import TaskQueries
from chronoshard.scheduler.turns import in_turns
from chronoshard.v1 import task_service_pb2, task_service_pb2_grpc

log = logging.getLogger(__name__)

STREAM_IN_FLIGHT = 256
"""Requests of one ``SubmitStream`` read ahead of their answers: past it the stream is
not read until an answer goes out."""

SUBMIT_CHUNK = 250
"""Items of a keyless ``SubmitBatch`` validated and sent to PostgreSQL at a time: one
INSERT per chunk, written while the next chunk is validated (bench/README.md, "Submit
batches in chunks")."""

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]

WAITING_REASONS = {
    HeldBy.RATE: "TENANT_RATE_LIMIT",
    HeldBy.CONCURRENCY: "TENANT_CONCURRENCY_LIMIT",
}
"""``Task.waiting_reason`` for what holds a due task back."""
_WAITING = frozenset({TaskStatus.SCHEDULED, TaskStatus.PRELOADED, TaskStatus.RETRYING})


class SubmitListener(Protocol):
    """What the node hears from the API, after each commit."""

    def tasks_submitted(self, tasks: Sequence[ChangedTask]) -> None:
        """Tasks became SCHEDULED: created by a submit, re-queued by RetryTask, or
        workflow children a cancel or resolution released.

        The node wakes its preloader if one of them is due within the lookahead."""
        ...

    def cancel_requested(self, task: Task, reason: str) -> None:
        """A cancel was written: ``task`` is CANCELLED (the node drops its timer and
        tells a worker holding a DISPATCHED attempt) or still RUNNING with the request
        recorded (the node tells the worker to stop)."""
        ...


class _NoListener:
    def tasks_submitted(self, tasks: Sequence[ChangedTask]) -> None:
        pass

    def cancel_requested(self, task: Task, reason: str) -> None:
        pass


class TaskServiceServicer(task_service_pb2_grpc.TaskServiceServicer):
    """The ``chronoshard.v1.TaskService`` implementation (see ``docs/api.md``)."""

    def __init__(
        self,
        *,
        config: SchedulerConfig,
        store: Store,
        authenticator: Authenticator,
        listener: SubmitListener | None = None,
        clock: Clock | None = None,
        submit_quotas: SubmitQuotas | None = None,
    ) -> None:
        self._store = store
        self._submit_store = SubmitStore(store)
        self._quota_rows = DispatchQuotaStore(store)
        # None: no submit rate is enforced (a servicer without a node, in tests).
        self._submit_quotas = submit_quotas
        self._queries = TaskQueries(store)
        self._auth = authenticator
        self._listener: SubmitListener = listener or _NoListener()
        self._clock = clock or SystemClock()
        self._limits = task_requests.SubmitLimits.from_config(config)
        self._max_batch = config.limits.max_batch_tasks
        self._max_page_size = config.limits.max_list_page_size
        # Single submits from many clients share transactions (group commit); each
        # caller is answered after its own row committed. Built on the serving loop.
        self._submits = submit_committer(self._submit_store)
        self._submits.start()

    @property
    def submits(self) -> GroupCommitter[Request, SubmitResult]:
        """The single submits' group commit, for the metrics endpoint."""
        return self._submits

    async def stop(self) -> None:
        """Flush the submits queued, then refuse more (retryable ``NODE_STOPPING``)."""
        await self._submits.stop()

    # --- the RPCs (each is the boundary wrapper around one handler) ----------------------

    async def SubmitTask(
        self, request: task_service_pb2.SubmitTaskRequest, context: Context
    ) -> task_service_pb2.SubmitTaskResponse:
        return await self._serve("SubmitTask", self._submit_task, request, context)

    async def SubmitBatch(
        self, request: task_service_pb2.SubmitBatchRequest, context: Context
    ) -> task_service_pb2.SubmitBatchResponse:
        return await self._serve("SubmitBatch", self._submit_batch, request, context)

    async def SubmitStream(
        self, requests: AsyncIterator[task_service_pb2.SubmitStreamRequest], context: Context
    ) -> AsyncIterator[task_service_pb2.SubmitStreamReply]:
        # The caller is authenticated once, for the whole stream; a refusal ends the call
        # as it would a unary one.
        tenant = await boundary.serve_tenant(
            "TaskService.SubmitStream", context, self._auth, _the_tenant
        )
        # Requests are read ahead of their answers (each is a submit of its own, sharing
        # the group commit with every other caller) and answered in the order they came.
        # At most STREAM_IN_FLIGHT wait at once: then the stream is not read, and gRPC's
        # flow control holds the caller back.
        in_flight = asyncio.Semaphore(STREAM_IN_FLIGHT)
        answers: asyncio.Queue[asyncio.Future[task_service_pb2.SubmitStreamReply] | None] = (
            asyncio.Queue()
        )

        async def read() -> None:
            try:
                async for request in requests:
                    await in_flight.acquire()
                    answers.put_nowait(
                        asyncio.ensure_future(self._streamed_submit(tenant, request))
                    )
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read(), name="SubmitStream reader")
        try:
            while (answer := await answers.get()) is not None:
                reply = await answer
                in_flight.release()
                yield reply
            await reader  # the request stream's own failure, if it had one
        finally:
            reader.cancel()
            while not answers.empty():
                if (pending := answers.get_nowait()) is not None:
                    pending.cancel()

    async def GetTask(
        self, request: task_service_pb2.GetTaskRequest, context: Context
    ) -> task_service_pb2.GetTaskResponse:
        return await self._serve("GetTask", self._get_task, request, context)

    async def ListTasks(
        self, request: task_service_pb2.ListTasksRequest, context: Context
    ) -> task_service_pb2.ListTasksResponse:
        return await self._serve("ListTasks", self._list_tasks, request, context)

    async def CancelTask(
        self, request: task_service_pb2.CancelTaskRequest, context: Context
    ) -> task_service_pb2.CancelTaskResponse:
        return await self._serve("CancelTask", self._cancel_task, request, context)

    async def RetryTask(
        self, request: task_service_pb2.RetryTaskRequest, context: Context
    ) -> task_service_pb2.RetryTaskResponse:
        return await self._serve("RetryTask", self._retry_task, request, context)

    async def ResolveTask(
        self, request: task_service_pb2.ResolveTaskRequest, context: Context
    ) -> task_service_pb2.ResolveTaskResponse:
        return await self._serve("ResolveTask", self._resolve_task, request, context)

    async def _serve(
        self,
        method: str,
        handler: Callable[[Tenant, _Req, Context], Awaitable[_Resp]],
        request: _Req,
        context: Context,
    ) -> _Resp:
        """Authenticate, run ``handler``, and translate every error (:mod:`.boundary`)."""
        return await boundary.serve_tenant(
            f"TaskService.{method}", context, self._auth, lambda t: handler(t, request, context)
        )

    # --- handlers -------------------------------------------------------------------------

    async def _submit_task(
        self, tenant: Tenant, request: task_service_pb2.SubmitTaskRequest, context: Context
    ) -> task_service_pb2.SubmitTaskResponse:
        trace = task_requests.trace_context_from_metadata(context.invocation_metadata())
        return _submit_response(await self._submit_one(tenant, request, trace, prefix=""))

    async def _streamed_submit(
        self, tenant: Tenant, request: task_service_pb2.SubmitStreamRequest
    ) -> task_service_pb2.SubmitStreamReply:
        """One request of a ``SubmitStream``: its answer, or its refusal as the reply (the
        stream stays open)."""
        reply = task_service_pb2.SubmitStreamReply()
        try:
            trace = task_requests.trace_context_from_metadata(request.trace_context.items())
            result = await self._submit_one(tenant, request.task, trace, prefix="task.")
        except Exception as exc:
            info, retry_after_s = boundary.refusal_of("TaskService.SubmitStream", exc)
            reply.error.CopyFrom(info)
            if retry_after_s is not None:
                reply.retry_after_s = retry_after_s
            return reply
        _write_submitted(reply.submitted, result)
        return reply

    async def _submit_one(
        self,
        tenant: Tenant,
        request: task_service_pb2.SubmitTaskRequest,
        trace: dict[str, str] | None,
        *,
        prefix: str,
    ) -> SubmitResult:
        """A single submit (``SubmitTask``, or one request of a ``SubmitStream``): validated,
        checked against the submit rate, and written through the group commit."""
        prepared = self._prepare(tenant, request, trace, prefix=prefix)
        self._check_submit_rate(tenant, 1)
        try:
            result = await self._submits.submit((tenant.id, prepared))
        except IdempotencyConflict as exc:
            exc.field = f"{prefix}idempotency_key"  # type: ignore[attr-defined]
            raise
        self._notify_submitted([result])
        return result

    async def _submit_batch(
        self, tenant: Tenant, request: task_service_pb2.SubmitBatchRequest, context: Context
    ) -> task_service_pb2.SubmitBatchResponse:
        # All or nothing: the batch is written in one transaction, and the first invalid
        # item fails the call (field "tasks[i].<field>") with nothing committed. The
        # per-item `error` outcome of SubmitBatchResult is therefore never used: a
        # response lists only accepted items, in request order.
        if len(request.tasks) > self._max_batch:
            raise InvalidArgument("tasks", f"at most {self._max_batch} tasks per batch")
        trace = task_requests.trace_context_from_metadata(context.invocation_metadata())
        keyed = any(item.idempotency_key for item in request.tasks)
        if keyed or not self._submit_rate_admits(tenant, len(request.tasks)):
            # Keys are claimed before any row goes in; and a batch over the submit rate
            # is refused (after validation, as ever) before anything reaches PostgreSQL.
            prepared = await in_turns(
                request.tasks, functools.partial(self._prepare_item, tenant, trace, 0)
            )
            _check_batch_keys(prepared)
            self._check_submit_rate(tenant, len(prepared))
            results = await self._insert(tenant, prepared, prefix="tasks[{}].")
        else:
            # Without keys there is nothing to claim first: each chunk is written while
            # the next is validated (SubmitStore.insert_streamed).
            results = await self._submit_store.insert_streamed(
                tenant.id, self._prepared_chunks(tenant, request, trace)
            )
        self._notify_submitted(results)
        # Written into the response in place: a message given to another's constructor
        # is copied, and three levels of copies were a third of the call's CPU.
        response = task_service_pb2.SubmitBatchResponse()
        await in_turns(results, lambda _, r: _write_submitted(response.results.add().submitted, r))
        return response

    async def _get_task(
        self, tenant: Tenant, request: task_service_pb2.GetTaskRequest, context: Context
    ) -> task_service_pb2.GetTaskResponse:
        task_id = convert.uuid_from_pb(request.id, "id")
        task, attempts = await self._store.get_task_attempts(
            tenant.id, task_id, attempts=request.include_attempts
        )
        if task is None:
            raise TaskNotFound(task_id)
        response = task_service_pb2.GetTaskResponse(task=convert.task_to_pb(task))
        reason = await self._waiting_reason(task)
        if reason is not None:
            response.task.waiting_reason = reason
        response.attempts.extend(convert.attempt_to_pb(a) for a in attempts)
        return response

    def _submit_rate_admits(self, tenant: Tenant, tasks: int) -> bool:
        """Whether the tenant's submit rate would let ``tasks`` through now (takes
        nothing)."""
        return self._submit_quotas is None or self._submit_quotas.admits(tenant.id, tasks)

    def _check_submit_rate(self, tenant: Tenant, tasks: int) -> None:
        """Refuse the submit (QuotaExceeded) if it is over the tenant's submit rate."""
        if self._submit_quotas is not None:
            self._submit_quotas.check(tenant.id, tasks)

    async def _waiting_reason(self, task: Task) -> str | None:
        """Why a due task still waits, if its tenant's dispatch quotas hold it: one read
        of the tenant's bucket and in-flight count, only for a task that is due and not
        yet dispatched."""
        if task.status not in _WAITING or task.due_at > self._clock.now():
            return None
        held_by = await self._quota_rows.held_by(task.tenant_id)
        return None if held_by is None else WAITING_REASONS[held_by]

    async def _list_tasks(
        self, tenant: Tenant, request: task_service_pb2.ListTasksRequest, context: Context
    ) -> task_service_pb2.ListTasksResponse:
        flt = task_requests.list_filter_from_pb(request)
        after = task_requests.page_token_from_pb(request.page_token, tenant.id, flt)
        page_size = task_requests.page_size_from_pb(request.page_size, self._max_page_size)
        # One row more than the page tells whether another page exists, so the last page
        # never ends with a token that leads to an empty one.
        tasks = await self._queries.list_tasks(
            tenant.id,
            flt,
            after=after,
            limit=page_size + 1,
            include_payloads=request.include_payloads,
        )
        response = task_service_pb2.ListTasksResponse(
            tasks=[
                convert.task_to_pb(t, include_payload=request.include_payloads)
                for t in tasks[:page_size]
            ]
        )
        if len(tasks) > page_size:
            last = tasks[page_size - 1]
            cursor = PageCursor(last.scheduled_at, last.id)
            response.next_page_token = task_requests.page_token_to_pb(cursor, tenant.id, flt)
        return response

    async def _cancel_task(
        self, tenant: Tenant, request: task_service_pb2.CancelTaskRequest, context: Context
    ) -> task_service_pb2.CancelTaskResponse:
        task_id = convert.uuid_from_pb(request.id, "id")
        reason = task_requests.reason_from_pb(request.reason)
        result = await self._queries.cancel_task(tenant.id, task_id, reason)
        if result.changed:
            # A repeated request keeps the first reason; tell the node the stored one.
            told = result.task.cancel_reason or reason
            self._notify(lambda: self._listener.cancel_requested(result.task, told))
        if result.due:
            self._notify(lambda: self._listener.tasks_submitted(result.due))
        return task_service_pb2.CancelTaskResponse(task=convert.task_to_pb(result.task))

    async def _retry_task(
        self, tenant: Tenant, request: task_service_pb2.RetryTaskRequest, context: Context
    ) -> task_service_pb2.RetryTaskResponse:
        task_id = convert.uuid_from_pb(request.id, "id")
        delay_s = 0.0
        if request.HasField("delay"):
            delay_s = task_requests.duration_arg_from_pb(request.delay, "delay")
        due_at = self._clock.now() + timedelta(seconds=delay_s)
        task = await self._queries.retry_task(tenant.id, task_id, due_at)
        self._notify(lambda: self._listener.tasks_submitted([task]))
        return task_service_pb2.RetryTaskResponse(task=convert.task_to_pb(task))

    async def _resolve_task(
        self, tenant: Tenant, request: task_service_pb2.ResolveTaskRequest, context: Context
    ) -> task_service_pb2.ResolveTaskResponse:
        task_id = convert.uuid_from_pb(request.id, "id")
        resolution = convert.resolution_from_pb(request.resolution)
        reason = task_requests.reason_from_pb(request.reason, default="no reason given")
        task, written, due = await self._queries.resolve_task(
            tenant.id, task_id, resolution, reason, self._clock.now()
        )
        if written:
            log.warning(
                "task outcome resolved by an operator",
                extra={
                    "task_id": str(task.id),
                    "tenant_id": str(tenant.id),
                    "shard": task.shard,
                    "fencing_token": task.fencing_token,
                    "resolution": resolution.value,
                    "reason": reason,
                },
            )
            if task.status is TaskStatus.SCHEDULED:
                self._notify(lambda: self._listener.tasks_submitted([task]))
            if due:
                self._notify(lambda: self._listener.tasks_submitted(due))
        return task_service_pb2.ResolveTaskResponse(task=convert.task_to_pb(task))

    # --- helpers --------------------------------------------------------------------------

    def _prepare(
        self,
        tenant: Tenant,
        request: task_service_pb2.SubmitTaskRequest,
        trace: dict[str, str] | None,
        *,
        prefix: str,
    ) -> PreparedTask:
        # The cluster clock (node.py): a stepped wall clock of this node must move neither
        # the submit time nor the time in the id.
        now = self._clock.now()
        return task_requests.submit_from_pb(
            request,
            tenant_id=tenant.id,
            task_id=new_task_id(lambda: unix_ms(now)),
            now=now,
            limits=self._limits,
            trace_context=trace,
            prefix=prefix,
        )

    async def _prepared_chunks(
        self,
        tenant: Tenant,
        request: task_service_pb2.SubmitBatchRequest,
        trace: dict[str, str] | None,
    ) -> AsyncIterator[list[PreparedTask]]:
        """The batch's items validated and prepared, :data:`SUBMIT_CHUNK` at a time; once
        every one is, the tenant's submit rate is checked (before the store commits)."""
        items = request.tasks
        for start in range(0, len(items), SUBMIT_CHUNK):
            chunk = items[start : start + SUBMIT_CHUNK]
            yield await in_turns(chunk, functools.partial(self._prepare_item, tenant, trace, start))
        self._check_submit_rate(tenant, len(items))

    def _prepare_item(
        self,
        tenant: Tenant,
        trace: dict[str, str] | None,
        offset: int,
        index: int,
        item: task_service_pb2.SubmitTaskRequest,
    ) -> PreparedTask:
        """Item ``offset + index`` of a batch, prepared (errors name ``tasks[i].<field>``)."""
        return self._prepare(tenant, item, trace, prefix=f"tasks[{offset + index}].")

    async def _insert(
        self, tenant: Tenant, prepared: Sequence[PreparedTask], *, prefix: str
    ) -> list[SubmitResult]:
        try:
            return await self._submit_store.insert_tasks(tenant.id, prepared)
        except IdempotencyConflict as exc:
            # Name the request field at fault; in a batch, the first item with that key.
            index = next(i for i, p in enumerate(prepared) if p.new.idempotency_key == exc.key)
            exc.field = prefix.format(index) + "idempotency_key"  # type: ignore[attr-defined]
            raise

    def _notify_submitted(self, results: Sequence[SubmitResult]) -> None:
        created = [r.task for r in results if r.created]
        if created:
            self._notify(lambda: self._listener.tasks_submitted(created))

    def _notify(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:
            # The write committed; failing the RPC now would invite a duplicate submit.
            # The node's periodic passes (preload, heartbeat answers) catch up.
            log.exception("TaskService listener failed after commit")


async def _the_tenant(tenant: Tenant) -> Tenant:
    return tenant


def _check_batch_keys(prepared: Sequence[PreparedTask]) -> None:
    """Two items of one batch may share an idempotency key only as the same request
    (the second then answers with the first's task, created=False)."""
    seen: dict[str, tuple[int, str]] = {}
    for i, p in enumerate(prepared):
        key = p.new.idempotency_key
        if key is None:
            continue
        first = seen.setdefault(key, (i, p.fingerprint))
        if first[1] != p.fingerprint:
            raise InvalidArgument(
                f"tasks[{i}].idempotency_key",
                f"repeats the key of tasks[{first[0]}] with a different request",
            )


def _submit_response(result: SubmitResult) -> task_service_pb2.SubmitTaskResponse:
    response = task_service_pb2.SubmitTaskResponse()
    _write_submitted(response, result)
    return response


def _write_submitted(msg: task_service_pb2.SubmitTaskResponse, result: SubmitResult) -> None:
    msg.created = result.created
    convert.write_task(msg.task, result.task)


def submit_committer(
    store: SubmitStore, *, linger_s: float = DEFAULT_LINGER_S, max_batch: int = DEFAULT_MAX_BATCH
) -> GroupCommitter[Request, SubmitResult]:
    """Group commit for single submits. A request that fails on its own (a reused key, an
    unknown tenant) fails alone; a batch the database refuses as a whole (one bad row
    would take its neighbours down) is written again one request at a time, so the
    culprit fails by itself; ``StoreUnavailable`` (nothing written, or the read-back could
    not tell: ``CommitOutcomeUnknown``) is every caller's answer."""

    async def alone(request: Request) -> SubmitResult:
        [result] = await store.insert_tasks(request[0], [request[1]])
        return result

    return GroupCommitter(
        "submits",
        store.insert_each,
        max_batch=max_batch,
        linger_s=linger_s,
        isolate=alone,
        whole_batch_errors=(StoreUnavailable,),
    )

"""The client over a real gRPC channel, against a scripted test double of TaskService.

``FakeTaskService`` is a real ``grpc.aio`` server on port 0 that answers from a script:
it records every request with its metadata and remaining deadline, fails calls with a
status plus the ``ErrorInfo`` trailer exactly as the scheduler does (``chronoshard.wire``),
and can hold calls open to observe concurrency. It is not the scheduler: end-to-end tests
of the client against real scheduler nodes live in ``tests/e2e``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from chronoshard import (
    AlreadyExistsError,
    ChronoshardError,
    Client,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    NotSentError,
    QuotaExceededError,
    ResourceExhaustedError,
    StaleFencingTokenError,
    SubmitResult,
    SyncClient,
    TaskSpec,
    TaskStatus,
    UnavailableError,
)
from chronoshard import _convert as convert
from chronoshard.client import MAX_BATCH_ITEMS, channel_options
from chronoshard.errors import (
    AbortedError,
    InternalError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from chronoshard.v1 import common_pb2, task_service_pb2, task_service_pb2_grpc
from chronoshard.wire import error_info_metadata

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
S = grpc.StatusCode


@dataclass
class Failure:
    code: grpc.StatusCode
    details: str
    info: common_pb2.ErrorInfo | None = None


@dataclass
class Seen:
    method: str
    request: Any
    metadata: dict[str, str]
    time_remaining: float | None


@dataclass
class FakeTaskService(task_service_pb2_grpc.TaskServiceServicer):  # type: ignore[misc]
    """Scripted TaskService. ``fail[method]`` fails the next calls of a method (a list,
    consumed in order); ``hold`` keeps every call open until it is set."""

    fail: dict[str, list[Failure]] = field(default_factory=dict)
    fail_batch_call: dict[int, Failure] = field(default_factory=dict)
    hold: asyncio.Event | None = None
    # Opens `hold` once this many calls are in flight at the same time (see below).
    open_hold_at: int | None = None
    _release: asyncio.TimerHandle | None = None
    # Set when the first call arrives; one for waiting in the test's loop, one for threads.
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    arrived_threadsafe: threading.Event = field(default_factory=threading.Event)
    seen: list[Seen] = field(default_factory=list)
    tasks: dict[str, common_pb2.Task] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    batch_calls: int = 0

    async def _enter(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.seen.append(
            Seen(
                method,
                request,
                {m.key: m.value for m in context.invocation_metadata()},
                context.time_remaining(),
            )
        )
        self.arrived.set()
        self.arrived_threadsafe.set()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.hold is not None:
                self._maybe_open_hold(self.hold)
                await self.hold.wait()
            scripted = self.fail.get(method)
            if scripted:
                await _abort(context, scripted.pop(0))
        finally:
            self.in_flight -= 1

    def _maybe_open_hold(self, hold: asyncio.Event) -> None:
        """With ``open_hold_at = n``: once n calls are in flight, wait a moment for more to
        arrive before letting them all go. A call beyond n opens it at once (the test then
        fails on max_in_flight); the moment only gives a missing bound time to show."""
        if self.open_hold_at is None:
            return
        if self.in_flight > self.open_hold_at:
            hold.set()
        elif self.in_flight == self.open_hold_at and self._release is None:
            self._release = asyncio.get_running_loop().call_later(0.3, hold.set)

    def _new_task(self, req: task_service_pb2.SubmitTaskRequest) -> common_pb2.Task:
        task = common_pb2.Task(
            id=str(uuid.uuid4()),
            type=req.type,
            status=common_pb2.TASK_STATUS_SCHEDULED,
            payload_json=req.payload_json,
            queue=req.queue,
            priority=req.priority,
            idempotency_key=req.idempotency_key,
        )
        task.scheduled_at.CopyFrom(convert.timestamp(T0, "scheduled_at"))
        self.tasks[task.id] = task
        return task

    async def SubmitTask(
        self, request: task_service_pb2.SubmitTaskRequest, context: grpc.aio.ServicerContext
    ) -> task_service_pb2.SubmitTaskResponse:
        await self._enter("SubmitTask", request, context)
        return task_service_pb2.SubmitTaskResponse(task=self._new_task(request), created=True)

    async def SubmitBatch(
        self, request: task_service_pb2.SubmitBatchRequest, context: grpc.aio.ServicerContext
    ) -> task_service_pb2.SubmitBatchResponse:
        await self._enter("SubmitBatch", request, context)
        self.batch_calls += 1
        failure = self.fail_batch_call.get(self.batch_calls)
        if failure is not None:
            await _abort(context, failure)
        results = []
        for item in request.tasks:
            if item.type == "refuse":
                info = common_pb2.ErrorInfo(
                    code="INVALID_ARGUMENT", reason="BAD_TYPE", message="no", field="type"
                )
                results.append(task_service_pb2.SubmitBatchResult(error=info))
            else:
                submitted = task_service_pb2.SubmitTaskResponse(
                    task=self._new_task(item), created=True
                )
                results.append(task_service_pb2.SubmitBatchResult(submitted=submitted))
        return task_service_pb2.SubmitBatchResponse(results=results)

    def _task(self, task_id: str) -> common_pb2.Task:
        return self.tasks[task_id]

    async def GetTask(
        self, request: task_service_pb2.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> task_service_pb2.GetTaskResponse:
        await self._enter("GetTask", request, context)
        if request.id not in self.tasks:
            info = common_pb2.ErrorInfo(code="NOT_FOUND", reason="TASK_NOT_FOUND", field="id")
            await _abort(context, Failure(grpc.StatusCode.NOT_FOUND, "task not found", info))
        attempts = []
        if request.include_attempts:
            attempts = [common_pb2.TaskAttempt(attempt=1, state=common_pb2.ATTEMPT_STATE_FAILED)]
        return task_service_pb2.GetTaskResponse(task=self._task(request.id), attempts=attempts)

    async def ListTasks(
        self, request: task_service_pb2.ListTasksRequest, context: grpc.aio.ServicerContext
    ) -> task_service_pb2.ListTasksResponse:
        await self._enter("ListTasks", request, context)
        ordered = sorted(self.tasks)
        start = int(request.page_token or 0)
        size = request.page_size or 100
        end = start + size
        return task_service_pb2.ListTasksResponse(
            tasks=[self.tasks[i] for i in ordered[start:end]],
            next_page_token=str(end) if end < len(ordered) else "",
        )

    async def CancelTask(
        self, request: task_service_pb2.CancelTaskRequest, context: grpc.aio.ServicerContext
    ) -> task_service_pb2.CancelTaskResponse:
        await self._enter("CancelTask", request, context)
        task = self._task(request.id)
        task.status = common_pb2.TASK_STATUS_CANCELLED
        task.last_error = request.reason
        return task_service_pb2.CancelTaskResponse(task=task)

    async def RetryTask(
        self, request: task_service_pb2.RetryTaskRequest, context: grpc.aio.ServicerContext
    ) -> task_service_pb2.RetryTaskResponse:
        await self._enter("RetryTask", request, context)
        task = self._task(request.id)
        task.status = common_pb2.TASK_STATUS_SCHEDULED
        task.due_at.CopyFrom(
            convert.timestamp(T0 + timedelta(seconds=request.delay.ToNanoseconds() / 1e9), "d")
        )
        return task_service_pb2.RetryTaskResponse(task=task)


async def _abort(context: grpc.aio.ServicerContext, failure: Failure) -> None:
    trailer = error_info_metadata(failure.info) if failure.info is not None else ()
    await context.abort(failure.code, failure.details, trailing_metadata=trailer)


@dataclass
class Server:
    service: FakeTaskService
    target: str
    server: grpc.aio.Server


async def start_server() -> Server:
    service = FakeTaskService()
    server = grpc.aio.server()
    task_service_pb2_grpc.add_TaskServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return Server(service, f"127.0.0.1:{port}", server)


@pytest.fixture
async def fake() -> AsyncIterator[Server]:
    server = await start_server()
    yield server
    await server.server.stop(None)


@pytest.fixture
async def client(fake: Server) -> AsyncIterator[Client]:
    async with Client(fake.target, timeout_s=5.0) as c:
        yield c


# --- happy paths ---------------------------------------------------------------------------


async def test_submit_get_cancel_retry_round_trip(fake: Server, client: Client) -> None:
    result = await client.submit("email.send", {"to": "x"}, priority="critical", queue="mail")
    assert isinstance(result, SubmitResult) and result.created
    assert result.task.payload == {"to": "x"} and result.task.queue == "mail"
    sent = fake.service.seen[0].request
    assert sent.payload_json == b'{"to":"x"}'
    assert sent.priority == common_pb2.PRIORITY_CRITICAL

    task = await client.get(result.task.id, attempts=True)
    assert task.id == result.task.id and task.status is TaskStatus.SCHEDULED
    assert [a.attempt for a in task.attempts] == [1]

    cancelled = await client.cancel(uuid.UUID(task.id), reason="not needed")
    assert cancelled.status is TaskStatus.CANCELLED and cancelled.last_error == "not needed"

    retried = await client.retry(task.id, delay_s=30)
    assert retried.due_at == T0 + timedelta(seconds=30)


async def test_list_pages_and_iter_tasks_follow_tokens(fake: Server, client: Client) -> None:
    await client.submit_batch([TaskSpec(type=f"t{i}") for i in range(7)])
    page = await client.list(page_size=3, statuses=[TaskStatus.SCHEDULED])
    assert len(page.tasks) == 3 and page.next_page_token == "3"
    listed = [t.id async for t in client.iter_tasks(page_size=3, statuses=iter(["SCHEDULED"]))]
    assert listed == sorted(fake.service.tasks)
    list_calls = [s.request for s in fake.service.seen if s.method == "ListTasks"]
    # One page, then three more for the iteration; the generator of statuses was kept.
    assert [r.page_token for r in list_calls] == ["", "", "3", "6"]
    assert all(list(r.statuses) == [common_pb2.TASK_STATUS_SCHEDULED] for r in list_calls)


async def test_api_key_is_sent_as_bearer_metadata(fake: Server) -> None:
    async with Client(fake.target, api_key="s3cret") as keyed:
        await keyed.submit("t")
    async with Client(fake.target) as anonymous:
        await anonymous.submit("t")
    first, second = fake.service.seen
    assert first.metadata["authorization"] == "Bearer s3cret"
    assert "authorization" not in second.metadata
    assert first.metadata["user-agent"].startswith("chronoshard-python/")


async def test_bad_arguments_fail_before_any_call(fake: Server, client: Client) -> None:
    with pytest.raises(ValueError, match="at must be a timezone-aware"):
        await client.submit("t", at=datetime(2026, 1, 1, 9, 0))
    with pytest.raises(TypeError, match="payload must be a dict"):
        await client.submit("t", ["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        await client.submit("t", {"when": datetime.now(UTC)})
    with pytest.raises(ValueError, match="at must be a timezone-aware"):
        TaskSpec(type="b", at=datetime(2026, 1, 1))  # refused as soon as the spec is built
    with pytest.raises(TypeError, match=r"specs\[1\]: payload is not JSON-serialisable"):
        await client.submit_batch(
            [TaskSpec(type="a"), TaskSpec(type="b", payload={"x": float("nan")})]
        )
    assert fake.service.seen == []


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason", "field_name", "retryable", "cls"),
    [
        (S.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE", "payload_json", False, InvalidArgumentError),
        (S.NOT_FOUND, "TASK_NOT_FOUND", "id", False, NotFoundError),
        (S.ALREADY_EXISTS, "IDEMPOTENCY_KEY_REUSED", "idempotency_key", False, AlreadyExistsError),
        (S.FAILED_PRECONDITION, "INVALID_TRANSITION", "", False, FailedPreconditionError),
        (S.FAILED_PRECONDITION, "STALE_FENCING_TOKEN", "", False, StaleFencingTokenError),
        (S.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", "", True, QuotaExceededError),
        (S.RESOURCE_EXHAUSTED, "MESSAGE_TOO_LARGE", "", False, ResourceExhaustedError),
        (S.UNAVAILABLE, "SHARD_EPOCH_LOST", "", True, UnavailableError),
        (S.UNAUTHENTICATED, "BAD_API_KEY", "", False, UnauthenticatedError),
        (S.PERMISSION_DENIED, "FORBIDDEN", "", False, PermissionDeniedError),
        (S.ABORTED, "COMPARE_AND_SET_LOST", "", True, AbortedError),
        (S.INTERNAL, "INTERNAL", "", False, InternalError),
    ],
)
async def test_each_status_maps_to_its_exception(
    fake: Server,
    client: Client,
    code: grpc.StatusCode,
    reason: str,
    field_name: str,
    retryable: bool,
    cls: type[ChronoshardError],
) -> None:
    details = f"refused: {reason.lower()}"
    info = common_pb2.ErrorInfo(
        code=code.name, reason=reason, message=details, field=field_name, retryable=retryable
    )
    fake.service.fail["SubmitTask"] = [Failure(code, details, info)]
    with pytest.raises(cls) as caught:
        await client.submit("t")
    error = caught.value
    assert type(error) is cls
    assert error.code is code
    assert error.reason == reason
    assert error.field == (field_name or None)
    assert error.retryable is retryable
    assert error.details == details
    assert isinstance(error.__cause__, grpc.aio.AioRpcError)


async def test_status_without_error_info_uses_the_code(fake: Server, client: Client) -> None:
    fake.service.fail["GetTask"] = [Failure(grpc.StatusCode.UNAVAILABLE, "shard moving")]
    with pytest.raises(UnavailableError) as caught:
        await client.get("x")
    assert (caught.value.reason, caught.value.retryable, caught.value.field) == (
        "UNAVAILABLE",
        True,
        None,
    )


async def test_not_found_from_the_servers_own_logic(client: Client) -> None:
    with pytest.raises(NotFoundError) as caught:
        await client.get(uuid.uuid4())
    assert caught.value.reason == "TASK_NOT_FOUND" and caught.value.field == "id"


async def test_unreachable_server_is_unavailable_at_once_and_nothing_is_sent() -> None:
    dead = await start_server()
    await dead.server.stop(None)  # the port is now closed
    async with Client(dead.target, timeout_s=5.0) as c:
        started = time.monotonic()
        with pytest.raises(UnavailableError) as caught:
            await c.submit("t")
    assert time.monotonic() - started < 2.0  # not the 5 s deadline
    assert caught.value.retryable and caught.value.reason == "NO_TARGET_READY"
    assert "not sent" in str(caught.value) and dead.target in str(caught.value)


# --- deadlines and concurrency -------------------------------------------------------------


async def test_every_call_carries_the_deadline(fake: Server) -> None:
    async with Client(fake.target, timeout_s=3.0) as c:
        submitted = await c.submit("t")
        await c.submit_batch([TaskSpec(type="t")])
        await c.get(submitted.task.id)
        await c.list()
        await c.cancel(submitted.task.id)
        await c.retry(submitted.task.id)
    seen = {s.method: s.time_remaining for s in fake.service.seen}
    assert set(seen) == {
        "SubmitTask",
        "SubmitBatch",
        "GetTask",
        "ListTasks",
        "CancelTask",
        "RetryTask",
    }
    for method, remaining in seen.items():
        # The grpc-timeout header is rounded up to its unit: allow a few ms above 3 s.
        assert remaining is not None and 0 < remaining <= 3.05, method


async def test_a_call_that_outlives_its_deadline_fails(fake: Server) -> None:
    fake.service.hold = asyncio.Event()  # never set: the server never answers
    started = time.monotonic()
    async with Client(fake.target, timeout_s=0.3) as c:
        with pytest.raises(DeadlineExceededError) as caught:
            await c.submit("t")
    assert time.monotonic() - started < 3.0
    assert caught.value.code is grpc.StatusCode.DEADLINE_EXCEEDED and caught.value.retryable


async def test_waiting_for_a_slot_counts_against_the_deadline(fake: Server) -> None:
    fake.service.hold = asyncio.Event()  # never set
    async with Client(fake.target, timeout_s=0.3, max_in_flight=1) as c:
        outcomes = await asyncio.gather(*(c.get(str(i)) for i in range(5)), return_exceptions=True)
    assert all(isinstance(o, DeadlineExceededError) for o in outcomes)
    queued = [
        o
        for o in outcomes
        if isinstance(o, ChronoshardError) and o.reason == "CLIENT_QUEUE_TIMEOUT"
    ]
    # One slot and the same deadline for all: the first call holds the slot until every
    # other deadline has passed (at most the next one can slip in at the very end).
    assert len(queued) >= 3
    assert len(fake.service.seen) == 5 - len(queued)  # queued calls were never sent


@pytest.mark.parametrize("limit", [16, None])
async def test_in_flight_calls_are_bounded_per_channel(fake: Server, limit: int | None) -> None:
    bound = limit or 64  # None: the client's default
    fake.service.hold = asyncio.Event()
    fake.service.open_hold_at = bound  # all calls wait until `bound` are in flight at once
    c = Client(fake.target, timeout_s=10.0, max_in_flight=limit) if limit else Client(fake.target)
    async with c:
        results = await asyncio.gather(*(c.submit("t", {"i": i}) for i in range(500)))
    assert len(results) == 500 and all(r.created for r in results)
    # Reaching the bound shows the server could see that many; never more shows the bound.
    assert fake.service.max_in_flight == bound


# --- batches -------------------------------------------------------------------------------


async def test_submit_batch_splits_into_chunks_of_at_most_1000(
    fake: Server, client: Client
) -> None:
    specs = [TaskSpec(type="refuse" if i == 1500 else "t", payload={"i": i}) for i in range(2345)]
    results = await client.submit_batch(specs)
    calls = [s.request for s in fake.service.seen if s.method == "SubmitBatch"]
    assert [len(r.tasks) for r in calls] == [MAX_BATCH_ITEMS, MAX_BATCH_ITEMS, 345]
    assert len(results) == 2345
    for i, result in enumerate(results):
        if i == 1500:
            assert isinstance(result, InvalidArgumentError)
            assert (result.reason, result.field) == ("BAD_TYPE", "type")
        else:
            assert isinstance(result, SubmitResult) and result.task.payload == {"i": i}


async def test_submit_batch_also_bounds_chunk_bytes(fake: Server) -> None:
    async with Client(fake.target, max_batch_bytes=20_000) as c:
        results = await c.submit_batch([TaskSpec(type="t", payload={"x": "y" * 5000})] * 10)
    sizes = [len(s.request.tasks) for s in fake.service.seen]
    assert sum(sizes) == 10 and max(sizes) <= 3
    assert all(isinstance(r, SubmitResult) for r in results)


async def test_failed_chunk_marks_its_items_and_skips_the_rest(
    fake: Server, client: Client
) -> None:
    info = common_pb2.ErrorInfo(code="RESOURCE_EXHAUSTED", reason="QUOTA_EXCEEDED", retryable=True)
    fake.service.fail_batch_call[2] = Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down", info)
    results = await client.submit_batch([TaskSpec(type="t")] * 2500)
    assert fake.service.batch_calls == 2  # the third chunk was never sent
    assert all(isinstance(r, SubmitResult) for r in results[:1000])
    assert all(isinstance(r, ResourceExhaustedError) for r in results[1000:2000])
    skipped = results[2000:]
    assert all(isinstance(r, NotSentError) and r.retryable for r in skipped)
    assert isinstance(skipped[0], NotSentError) and "QUOTA_EXCEEDED" in skipped[0].details


# --- channels ------------------------------------------------------------------------------


def test_channel_options_set_keepalives_and_limits() -> None:
    options = dict(channel_options(extra={"grpc.keepalive_time_ms": 15_000}))
    assert options["grpc.keepalive_time_ms"] == 15_000
    assert options["grpc.keepalive_timeout_ms"] > 0
    assert options["grpc.http2.ping_timeout_ms"] > 0
    assert options["grpc.keepalive_permit_without_calls"] == 1
    assert options["grpc.http2.max_pings_without_data"] == 0
    assert options["grpc.max_send_message_length"] == 4 * 1024 * 1024
    assert options["grpc.max_receive_message_length"] >= 4 * 1024 * 1024


async def test_several_targets_share_the_calls(fake: Server) -> None:
    other = await start_server()
    try:
        async with Client([fake.target, other.target]) as c:
            for _ in range(8):
                with pytest.raises(NotFoundError):
                    await c.get("missing")
        # Round-robin over connected targets (the very first call may find only one).
        assert len(fake.service.seen) + len(other.service.seen) == 8
        assert min(len(fake.service.seen), len(other.service.seen)) >= 3
    finally:
        await other.server.stop(None)


async def test_a_dead_target_is_skipped_by_every_call(fake: Server) -> None:
    dead = await start_server()
    await dead.server.stop(None)
    async with Client([dead.target, fake.target], timeout_s=2.0) as c:
        # Unkeyed submits too: no call is sent to a node that is not connected.
        submitted = [await c.submit("t") for _ in range(5)]
        await c.submit_batch([TaskSpec(type="t")] * 3)
        for result in submitted:
            await c.get(result.task.id)
            await c.cancel(result.task.id)
            await c.retry(result.task.id)
        await c.list()
    assert len(dead.service.seen) == 0
    assert len(fake.service.seen) == 5 + 1 + 5 * 3 + 1


async def test_a_node_that_dies_is_skipped_from_then_on(fake: Server) -> None:
    doomed = await start_server()
    async with Client([doomed.target, fake.target], timeout_s=2.0) as c:
        for _ in range(4):
            await c.list()
        assert doomed.service.seen  # both served
        await doomed.server.stop(None)
        for _ in range(10):
            await c.list()  # the first may find the connection's end: it goes on elsewhere
            await c.submit("t")
    assert len(fake.service.seen) >= 20


def _unavailable_forever(service: FakeTaskService, *methods: str) -> None:
    for method in methods:
        service.fail[method] = [Failure(grpc.StatusCode.UNAVAILABLE, "cannot serve")] * 100


async def test_calls_safe_to_repeat_go_on_to_another_node_after_unavailable(
    fake: Server,
) -> None:
    failing = await start_server()
    _unavailable_forever(failing.service, "ListTasks", "GetTask", "CancelTask", "SubmitTask")
    _unavailable_forever(failing.service, "SubmitBatch")
    try:
        async with Client([failing.target, fake.target], timeout_s=2.0) as c:
            task = (await c.submit("t", idempotency_key="k-0")).task
            for i in range(10):
                await c.list()
                await c.get(task.id)
                await c.cancel(task.id)
                await c.submit("t", idempotency_key=f"k-{i + 1}")
                await c.submit_batch([TaskSpec(type="t", idempotency_key=f"b-{i}")])
        # Half the calls start at the failing node (round-robin), all end on the other.
        assert len(failing.service.seen) >= 10
        assert len(fake.service.seen) == 1 + 10 * 5
    finally:
        await failing.server.stop(None)


async def test_calls_unsafe_to_repeat_are_not_sent_twice(fake: Server) -> None:
    failing = await start_server()
    _unavailable_forever(failing.service, "SubmitTask", "SubmitBatch", "RetryTask")
    task_id = fake.service._new_task(task_service_pb2.SubmitTaskRequest(type="t")).id
    unsafe: list[Callable[[Client], Awaitable[object]]] = [
        lambda c: c.submit("t"),
        lambda c: c.retry(task_id),
        # One item without a key makes the whole batch unsafe to repeat.
        lambda c: c.submit_batch([TaskSpec(type="t", idempotency_key="b"), TaskSpec("t")]),
    ]
    unavailable = 0
    try:
        async with Client([failing.target, fake.target], timeout_s=2.0) as c:
            for _ in range(6):
                for call in unsafe:
                    try:
                        result = await call(c)
                    except UnavailableError:
                        unavailable += 1
                        continue
                    if isinstance(result, list) and isinstance(result[0], UnavailableError):
                        unavailable += 1
        # Every attempt that reached the failing node came back to the caller as
        # UNAVAILABLE (it may have been applied): none was sent again elsewhere.
        assert unavailable == len(failing.service.seen) >= 6
        assert len(fake.service.seen) == 18 - unavailable
    finally:
        await failing.server.stop(None)


async def test_closed_client_refuses_calls(fake: Server) -> None:
    c = Client(fake.target)
    await c.submit("t")
    await c.close()
    with pytest.raises(RuntimeError, match="closed"):
        await c.submit("t")


async def test_close_fails_calls_in_flight_without_cancelling_the_caller(fake: Server) -> None:
    fake.service.hold = asyncio.Event()  # never set
    c = Client(fake.target, timeout_s=5.0)
    call = asyncio.create_task(c.get("x"))
    await fake.service.arrived.wait()  # the call reached the server
    await c.close()
    with pytest.raises(ChronoshardError) as caught:
        await call
    assert (caught.value.code, caught.value.reason) == (S.CANCELLED, "CLIENT_CLOSED")


def test_client_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="target"):
        Client([])
    with pytest.raises(ValueError, match="timeout_s"):
        Client("h:1", timeout_s=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        Client("h:1", max_in_flight=0)


# --- SyncClient ----------------------------------------------------------------------------


def _use_from_threads(target: str, threads: int, per_thread: int) -> list[object]:
    """Runs in a worker thread (no event loop there): many threads share one SyncClient."""
    outcomes: list[object] = []
    lock = threading.Lock()
    with SyncClient(target, timeout_s=5.0) as sync:

        def work(n: int) -> None:
            for i in range(per_thread):
                result = sync.submit("t", {"thread": n, "i": i})
                task = sync.get(result.task.id)
                with lock:
                    outcomes.append(task.payload)
            try:
                sync.get("missing")
            except NotFoundError as exc:
                with lock:
                    outcomes.append(exc)

        pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        outcomes.append(sync.submit_batch([TaskSpec(type="t")] * 3))
        outcomes.append([t.id for t in sync.iter_tasks(page_size=4)])
    with pytest.raises(RuntimeError, match="closed"):
        sync.get("x")
    return outcomes


async def test_sync_client_works_from_threads(fake: Server) -> None:
    outcomes = await asyncio.to_thread(_use_from_threads, fake.target, 4, 5)
    payloads = [o for o in outcomes[:-2] if isinstance(o, dict)]
    errors = [o for o in outcomes[:-2] if isinstance(o, NotFoundError)]
    assert sorted((p["thread"], p["i"]) for p in payloads) == [
        (n, i) for n in range(4) for i in range(5)
    ]
    assert len(errors) == 4
    batch, listed = outcomes[-2], outcomes[-1]
    assert isinstance(batch, list) and all(isinstance(r, SubmitResult) for r in batch)
    assert listed == sorted(fake.service.tasks)


async def test_sync_client_closed_by_another_thread_releases_waiting_callers(
    fake: Server,
) -> None:
    fake.service.hold = asyncio.Event()  # never set: the call stays in flight

    def run() -> ChronoshardError:
        sync = SyncClient(fake.target, timeout_s=5.0)
        outcome: list[BaseException] = []

        def call() -> None:
            try:
                sync.get("x")
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        assert fake.service.arrived_threadsafe.wait(timeout=5.0)  # the call reached the server
        sync.close()
        caller.join(timeout=5.0)
        assert not caller.is_alive()
        (error,) = outcome
        assert isinstance(error, ChronoshardError)
        return error

    error = await asyncio.to_thread(run)
    assert error.reason == "CLIENT_CLOSED"


async def test_sync_client_close_is_idempotent_and_stops_its_thread(fake: Server) -> None:
    def run() -> bool:
        sync = SyncClient(fake.target)
        sync.submit("t")
        thread = sync._thread
        sync.close()
        sync.close()
        return thread.is_alive()

    assert await asyncio.to_thread(run) is False

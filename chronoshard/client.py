"""The Python client of ``TaskService``, ``ScheduleService`` and ``WorkflowService``:
submit, inspect, cancel and retry tasks; create, read, change and run recurring
schedules; create, read, cancel and retry DAG workflows. Also the watchdog's incidents
(``WatchdogService.ListIncidents``) and the cluster's worker sessions
(``AdminService.ListWorkerSessions``).

:class:`Client` is the asyncio client; :class:`~chronoshard.sync_client.SyncClient`
offers the same methods as blocking calls. Both speak the types of
:mod:`chronoshard.types` and raise the exceptions of :mod:`chronoshard.errors`; protobuf
stays inside :mod:`chronoshard._convert`.

Connection discipline follows docs/architecture.md#d12, where each rule answers a failure
measured here:

* **Explicit keepalives.** The client pings an idle connection (``keepalive_time``) and
  drops it when the ack is late (``keepalive_timeout`` and ``http2.ping_timeout`` — the
  latter is the real ping-ack timeout and defaults to 60 s), even with no call open
  (``permit_without_calls``), so a server that vanished without a FIN is noticed in seconds.
  The rate stays well inside the server's ping policy (one per second at most).
* **A deadline on every call** (``timeout_s``, default 10 s). The time a call waits for a
  free slot (below) counts against it: a caller who asked for 10 s never waits longer,
  and a call that timed out while queued was never sent (reason ``CLIENT_QUEUE_TIMEOUT``).
* **Bounded in-flight calls per channel** (``max_in_flight``, default 64): 2,000
  concurrent unary calls on one grpcio channel ended CANCELLED, a semaphore of ~64 did
  not. Bulk submission should use :meth:`Client.submit_batch` anyway: it packs up to 1,000
  tasks (and ~3.5 MiB, under the server's 4 MiB limit) into one call.

With several targets the client opens one channel per target and sends each call to a
connected one, round-robin; any node accepts every call of the three services,
so a dead node is skipped. A call that a node failed with UNAVAILABLE goes on to another
node — within the same deadline, each node at most once — when repeating it is harmless:
reads, cancels, pauses, and submits (and workflow creates) with idempotency keys
(:mod:`chronoshard._failover` holds the policy and says why). Anything else the caller
decides: errors carry ``retryable``.

A call refused because the tenant is over its submit rate (:class:`QuotaExceededError`,
``RESOURCE_EXHAUSTED`` with the server's ``RetryInfo``) wrote nothing, so it is always
safe to send again: with ``max_quota_wait_s`` the client waits the delay the node asked
for and sends it again (to the next node), as long as its waits add up to no more than
that and stay within the call's deadline; otherwise, or by default (0), it raises the
error, whose ``retry_after_s`` says how long to wait.

A node refuses a tenant homed in another region (:class:`WrongRegionError`, reason
``WRONG_REGION``, naming the home region); nothing was done. With ``regions`` (a region's
name to its nodes' targets) the client follows it: it moves to that region's targets for
this call and every later one (once per call: a region that sends it on again raises).

gRPC's asyncio channels belong to the event loop that created them, so a :class:`Client`
opens its channels on first use and is then bound to that loop (using it from another loop
raises RuntimeError instead of hanging). Blocking code uses ``SyncClient``, which drives a
Client on a private loop (see :mod:`chronoshard.sync_client` for why).

With OpenTelemetry configured in the process, each submit call (``SubmitTask``,
``SubmitBatch``, ``CreateWorkflow``) runs in a PRODUCER span whose context goes into the
call's metadata as ``traceparent``: the node stores it with the tasks, and the worker's
run links back to it (:mod:`chronoshard.tracing`, docs/tracing.md). Without it the
metadata is what it always was.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc

from chronoshard import __version__, tracing
from chronoshard import _convert as convert
from chronoshard import _failover as failover
from chronoshard._submit_stream import SubmitStream
from chronoshard.errors import (
    ChronoshardError,
    DeadlineExceededError,
    NotSentError,
    QuotaExceededError,
    UnavailableError,
    WrongRegionError,
    from_rpc_error,
)
from chronoshard.types import (
    BackfillResult,
    Incident,
    JitterMode,
    Priority,
    Resolution,
    RetryPolicy,
    Schedule,
    ScheduleDetails,
    SchedulePage,
    ScheduleRun,
    ScheduleSpec,
    SubmitResult,
    Task,
    TaskPage,
    TaskSpec,
    TaskStatus,
    WorkerSession,
    WorkerSessionPage,
    Workflow,
    WorkflowCancelResult,
    WorkflowCreateResult,
    WorkflowDetail,
    WorkflowEdge,
    WorkflowPage,
    WorkflowRetryResult,
    WorkflowState,
    WorkflowTask,
    coerce_enum,
)
from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    schedule_service_pb2,
    schedule_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    watchdog_service_pb2,
    watchdog_service_pb2_grpc,
    workflow_service_pb2,
    workflow_service_pb2_grpc,
)
from chronoshard.wire import DEFAULT_QUEUE

__all__ = [
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_TIMEOUT_S",
    "MAX_BATCH_ITEMS",
    "Client",
    "TLSConfig",
    "channel_options",
]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_IN_FLIGHT = 64
# The server's cap on SubmitBatch items.
MAX_BATCH_ITEMS = 1000
# The server's default receive limit is 4 MiB; a batch chunk stays under it with headroom
# for the envelope. Larger answers (a page of tasks with payloads) may come back.
DEFAULT_MAX_SEND_MESSAGE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_BATCH_BYTES = 3 * 1024 * 1024 + 512 * 1024
KEEPALIVE_TIME_S = 20.0
KEEPALIVE_TIMEOUT_S = 10.0
# After a node restarts, a channel waits this long at most between reconnect attempts
# (gRPC's default grows to 120 s, during which every call fails UNAVAILABLE at once).
MAX_RECONNECT_BACKOFF_S = 5.0
# While no channel is connected yet (the first call, a node restarting), a call looks
# again after this long, doubling up to the cap: a local connection takes ~1 ms.
READY_POLL_INITIAL_S = 0.002
READY_POLL_MAX_S = 0.05

ChannelOption = tuple[str, int | str]


@dataclass(frozen=True)
class TLSConfig:
    """TLS for the channel: the CA that signed the server's certificate (None: the system
    roots), and a client certificate and key for mTLS. ``server_name`` overrides the name
    checked against the certificate (for connecting by IP address)."""

    root_certificates: bytes | None = None
    client_cert: bytes | None = None
    client_key: bytes | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("TLSConfig: client_cert and client_key go together")

    @classmethod
    def from_files(
        cls,
        *,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        server_name: str | None = None,
    ) -> TLSConfig:
        """Read PEM files: ``ca`` for the server's CA, ``cert`` and ``key`` for mTLS."""

        def read(path: str | Path | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return cls(read(ca), read(cert), read(key), server_name)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.client_key,
            certificate_chain=self.client_cert,
        )


def channel_options(
    *,
    max_send_message_bytes: int = DEFAULT_MAX_SEND_MESSAGE_BYTES,
    max_receive_message_bytes: int = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
    server_name: str | None = None,
    extra: Mapping[str, int | str] | None = None,
) -> list[ChannelOption]:
    """The options of every client channel (docs/architecture.md#d12); ``extra`` overrides any of
    them."""
    options: dict[str, int | str] = {
        "grpc.keepalive_time_ms": int(KEEPALIVE_TIME_S * 1000),
        "grpc.keepalive_timeout_ms": int(KEEPALIVE_TIMEOUT_S * 1000),
        # The ping-ack timeout that actually closes a dead connection (default 60 s).
        "grpc.http2.ping_timeout_ms": int(KEEPALIVE_TIMEOUT_S * 1000),
        "grpc.keepalive_permit_without_calls": 1,
        # 0 = no limit: without it a client sends two pings on an idle connection and then
        # stops, and a dead server is never detected between calls.
        "grpc.http2.max_pings_without_data": 0,
        "grpc.max_send_message_length": max_send_message_bytes,
        "grpc.max_receive_message_length": max_receive_message_bytes,
        "grpc.max_reconnect_backoff_ms": int(MAX_RECONNECT_BACKOFF_S * 1000),
        "grpc.primary_user_agent": f"chronoshard-python/{__version__}",
    }
    if server_name is not None:
        options["grpc.ssl_target_name_override"] = server_name
    options.update(extra or {})
    return list(options.items())


class _Endpoint:
    """One target: its channel, the unary methods of its services by RPC name, and the
    semaphore bounding calls in flight on it (one bound per channel, whatever the
    service: the limit is the channel's)."""

    def __init__(self, target: str, channel: grpc.aio.Channel, max_in_flight: int) -> None:
        self.target = target
        self.channel = channel
        # RPC names are unique across the services, so a call names its method only.
        self.methods: dict[str, Any] = {
            **_unary_methods(task_service_pb2_grpc.TaskServiceStub(channel), task_service_pb2),
            **_unary_methods(
                schedule_service_pb2_grpc.ScheduleServiceStub(channel), schedule_service_pb2
            ),
            **_unary_methods(
                workflow_service_pb2_grpc.WorkflowServiceStub(channel), workflow_service_pb2
            ),
            **_unary_methods(
                watchdog_service_pb2_grpc.WatchdogServiceStub(channel), watchdog_service_pb2
            ),
            **_unary_methods(admin_service_pb2_grpc.AdminServiceStub(channel), admin_service_pb2),
        }
        self.slots = asyncio.Semaphore(max_in_flight)

    def state(self) -> failover.TargetState:
        # try_to_connect: an idle channel (a new one, or one whose node went away) starts
        # connecting, so a node that is back is found without waiting for a call to it.
        return failover.state_of(self.channel.get_state(try_to_connect=True))


class Client:
    """Asyncio client of a Chronoshard cluster.

    ``target`` is ``host:port`` of a scheduler node, or several of them. ``api_key`` is sent
    as ``authorization: Bearer <key>`` on every call (use TLS outside a trusted network).
    ``tls`` is False (plaintext), True (TLS with the system's roots) or a
    :class:`TLSConfig`. ``timeout_s`` is the deadline of each call, ``max_in_flight`` the
    bound on concurrent calls per target. ``extra_channel_options`` overrides gRPC channel
    arguments (see :func:`channel_options`). ``max_quota_wait_s`` is how long in all a
    call may wait, as the node asks, before it is sent again after a refusal for quota
    (:class:`~chronoshard.errors.QuotaExceededError`); 0, the default, raises it at once.
    ``regions`` maps region names to targets, for following a tenant to its home region.

    Use as ``async with Client(...) as client:`` or call :meth:`close`.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        api_key: str | None = None,
        tls: bool | TLSConfig = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        extra_channel_options: Mapping[str, int | str] | None = None,
        max_quota_wait_s: float = 0.0,
        regions: Mapping[str, str | Sequence[str]] | None = None,
    ) -> None:
        targets = _targets(target)
        self._regions = {region: _targets(where) for region, where in (regions or {}).items()}
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if not max_quota_wait_s >= 0:
            raise ValueError(f"max_quota_wait_s must be >= 0, got {max_quota_wait_s}")
        self._max_quota_wait_s = float(max_quota_wait_s)
        self._targets = targets
        self._tls: TLSConfig | None = TLSConfig() if tls is True else (tls or None)
        self._timeout_s = float(timeout_s)
        self._max_in_flight = max_in_flight
        self._max_batch_bytes = max_batch_bytes
        self._options = channel_options(
            server_name=self._tls.server_name if self._tls else None,
            extra=extra_channel_options,
        )
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {api_key}"),) if api_key else ()
        )
        self._endpoints: builtins.list[_Endpoint] = []
        # Channels of the targets left when following a tenant to its home region: calls
        # may still run on them, so they close with the client.
        self._left: builtins.list[_Endpoint] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next = 0
        self._closed = False

    @property
    def targets(self) -> tuple[str, ...]:
        return self._targets

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self, grace_s: float | None = None) -> None:
        """Close every channel. Calls still running are cancelled (after ``grace_s``)."""
        self._closed = True
        endpoints, self._endpoints = self._endpoints + self._left, []
        self._left = []
        for endpoint in endpoints:
            await endpoint.channel.close(grace=grace_s)

    # --- calls ---------------------------------------------------------------------------

    async def submit(
        self,
        type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        at: datetime | None = None,
        delay_s: float | None = None,
        priority: Priority | str | None = None,
        queue: str = "",
        max_retries: int | None = None,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        strict_timing: bool = False,
        jitter: JitterMode | str | None = None,
        jitter_window_s: float | None = None,
        idempotent: bool = False,
        idempotency_key: str | None = None,
        job_id: str | None = None,
    ) -> SubmitResult:
        """Submit one task of handler ``type`` with a JSON-object ``payload``.

        ``at`` (a timezone-aware datetime) or ``delay_s`` says when; neither means now.
        ``timeout_s`` bounds each attempt of the handler. Unset options take the server's
        defaults; :class:`TaskSpec` documents each. With an ``idempotency_key``, repeating
        the same request returns the original task with ``created=False``.

        Raises ValueError/TypeError at once for arguments that cannot be right (a naive
        datetime, a payload that is not a JSON object), :class:`ChronoshardError`
        subclasses for what the server refused.
        """
        spec = TaskSpec(
            type=type,
            payload=payload,
            at=at,
            delay_s=delay_s,
            priority=None if priority is None else coerce_enum(Priority, priority, "priority"),
            queue=queue,
            max_retries=max_retries,
            retry=retry,
            timeout_s=timeout_s,
            strict_timing=strict_timing,
            jitter=None if jitter is None else coerce_enum(JitterMode, jitter, "jitter"),
            jitter_window_s=jitter_window_s,
            idempotent=idempotent,
            idempotency_key=idempotency_key,
            job_id=job_id,
        )
        response = await self._call("SubmitTask", convert.submit_request(spec))
        return convert.submit_result_from_pb(response)

    @contextlib.asynccontextmanager
    async def submit_stream(self) -> AsyncIterator[SubmitStream]:
        """A stream for single submits to one connected node, for a producer that sends
        many tasks one at a time: ``async with client.submit_stream() as stream: await
        stream.submit(TaskSpec(...))``. Each submit is answered as :meth:`submit` would
        be, once its row committed; submits from several tasks share the stream, each
        answered in the order sent. Cheaper per task than a call each, but it does not fail
        over (:class:`~chronoshard.SubmitStream`). Leaving the block waits for the
        answers of what was sent.
        """
        loop = asyncio.get_running_loop()
        self._check_loop(loop)
        start = self._next
        self._next = (start + 1) % len(self._endpoints)
        index = await self._connected_target(loop, loop.time() + self._timeout_s, start, set())
        if index is None:
            raise self._none_ready("SubmitStream")
        endpoint = self._endpoints[index]
        stream = SubmitStream(
            endpoint.methods["SubmitStream"](metadata=self._metadata),
            endpoint.target,
            timeout_s=self._timeout_s,
            tracer=TRACER,
            span_of=lambda request: _submit_span("SubmitTask", request),
        )
        async with stream:
            yield stream

    async def submit_batch(
        self, specs: Iterable[TaskSpec]
    ) -> builtins.list[SubmitResult | ChronoshardError]:
        """Submit many tasks; one outcome per spec, in order.

        Each item succeeds (a :class:`SubmitResult`) or fails on its own (a
        :class:`ChronoshardError`, returned, not raised). Specs are sent in chunks of at
        most 1,000 items and ~3.5 MiB, one call at a time. If a whole call fails, each of
        its items gets that error, and the chunks after it are not sent
        (:class:`NotSentError`): the caller can resubmit exactly the items whose outcome is
        a retryable error (with idempotency keys, even those of a call that timed out).
        Every request is built before the first call, so a spec that cannot be encoded
        raises TypeError/ValueError (naming its index) before anything is sent.
        """
        requests = []
        for index, spec in enumerate(specs):
            if not isinstance(spec, TaskSpec):
                raise TypeError(f"specs[{index}] must be a TaskSpec, got {type(spec).__name__}")
            try:
                requests.append(convert.submit_request(spec))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"specs[{index}]: {exc}") from exc
        chunks = convert.chunk_requests(
            requests, max_items=MAX_BATCH_ITEMS, max_bytes=self._max_batch_bytes
        )
        results: builtins.list[SubmitResult | ChronoshardError] = []
        failure: ChronoshardError | None = None
        for chunk in chunks:
            if failure is not None:
                skipped = NotSentError(
                    f"not sent: an earlier chunk of this batch failed ({failure})",
                    code=grpc.StatusCode.CANCELLED,
                    reason="NOT_SENT",
                )
                results.extend([skipped] * len(chunk))
                continue
            try:
                response = await self._call(
                    "SubmitBatch", task_service_pb2.SubmitBatchRequest(tasks=chunk)
                )
                results.extend(convert.batch_results_from_pb(response, len(chunk)))
            except ChronoshardError as exc:
                failure = exc
                results.extend([exc] * len(chunk))
        return results

    async def get(self, task_id: str | uuid.UUID, *, attempts: bool = False) -> Task:
        """Read one task; with ``attempts=True`` its attempt history fills ``.attempts``.

        Raises :class:`NotFoundError` for an unknown id (or another tenant's task).
        """
        response = await self._call(
            "GetTask", task_service_pb2.GetTaskRequest(id=str(task_id), include_attempts=attempts)
        )
        return convert.task_from_pb(response.task, response.attempts)

    async def list(
        self,
        *,
        statuses: TaskStatus | str | Iterable[TaskStatus | str] | None = None,
        type: str | None = None,
        queue: str | None = None,
        job_id: str | None = None,
        scheduled_from: datetime | None = None,
        scheduled_before: datetime | None = None,
        due_from: datetime | None = None,
        due_before: datetime | None = None,
        page_size: int = 0,
        page_token: str | None = None,
        include_payloads: bool = False,
    ) -> TaskPage:
        """One page of the tenant's tasks matching every given filter, ordered by
        ``(scheduled_at, id)``. Time ranges are half-open: ``[from, before)``.

        ``page_size`` 0 lets the server choose (100; it caps at 1,000). Pass the page's
        ``next_page_token`` with the same filters for the next page; it is None on the last.
        Without ``include_payloads`` the tasks' ``payload``, ``result`` and ``checkpoint``
        are None, to keep pages small.
        """
        request = convert.list_request(
            statuses=statuses,
            type=type,
            queue=queue,
            job_id=job_id,
            scheduled_from=scheduled_from,
            scheduled_before=scheduled_before,
            due_from=due_from,
            due_before=due_before,
            page_size=page_size,
            page_token=page_token,
            include_payloads=include_payloads,
        )
        return convert.page_from_pb(await self._call("ListTasks", request))

    async def iter_tasks(
        self,
        *,
        statuses: TaskStatus | str | Iterable[TaskStatus | str] | None = None,
        type: str | None = None,
        queue: str | None = None,
        job_id: str | None = None,
        scheduled_from: datetime | None = None,
        scheduled_before: datetime | None = None,
        due_from: datetime | None = None,
        due_before: datetime | None = None,
        page_size: int = 0,
        include_payloads: bool = False,
    ) -> AsyncIterator[Task]:
        """Every matching task, following page tokens; one call per page, each with its
        own deadline."""
        if statuses is not None and not isinstance(statuses, str):
            statuses = builtins.list(statuses)  # read once per page: a generator would run dry
        token: str | None = None
        while True:
            page = await self.list(
                statuses=statuses,
                type=type,
                queue=queue,
                job_id=job_id,
                scheduled_from=scheduled_from,
                scheduled_before=scheduled_before,
                due_from=due_from,
                due_before=due_before,
                page_size=page_size,
                page_token=token,
                include_payloads=include_payloads,
            )
            for task in page.tasks:
                yield task
            if page.next_page_token is None:
                return
            token = page.next_page_token

    async def cancel(self, task_id: str | uuid.UUID, reason: str = "") -> Task:
        """Cancel a task that is not terminal. A running task is asked to stop and comes
        back still RUNNING until its worker confirms. Cancelling a CANCELLED task returns
        it unchanged; another terminal state raises :class:`FailedPreconditionError`."""
        response = await self._call(
            "CancelTask", task_service_pb2.CancelTaskRequest(id=str(task_id), reason=reason)
        )
        return convert.task_from_pb(response.task)

    async def retry(self, task_id: str | uuid.UUID, delay_s: float = 0) -> Task:
        """Send a DEAD_LETTER task back to SCHEDULED for a new attempt after ``delay_s``.
        Any other state raises :class:`FailedPreconditionError`."""
        request = task_service_pb2.RetryTaskRequest(id=str(task_id))
        if delay_s:
            request.delay.CopyFrom(convert.duration(delay_s, "delay_s"))
        response = await self._call("RetryTask", request)
        return convert.task_from_pb(response.task)

    async def resolve(
        self, task_id: str | uuid.UUID, resolution: Resolution | str, reason: str = ""
    ) -> Task:
        """Resolve an OUTCOME_UNKNOWN task: ``Resolution.RETRY`` runs it again under a new
        fencing token, ``Resolution.MARK_FAILED`` dead-letters it with ``reason``. A repeat
        of a resolution already applied returns the task as it is now; any other state
        raises :class:`FailedPreconditionError` (reason ``NOTHING_TO_RESOLVE``)."""
        request = task_service_pb2.ResolveTaskRequest(
            id=str(task_id), resolution=convert.resolution_to_pb(resolution), reason=reason
        )
        response = await self._call("ResolveTask", request)
        return convert.task_from_pb(response.task)

    # --- schedules -----------------------------------------------------------------------
    #
    # Wherever a schedule is named, its id or its name is accepted (the server resolves
    # either in the caller's tenant); another tenant's schedule is NotFoundError.

    async def create_schedule(self, spec: ScheduleSpec) -> Schedule:
        """Create a schedule; its first occurrence is the rule's first after
        ``spec.start_at`` (or now). A name the tenant already uses raises
        :class:`AlreadyExistsError`; a field the server refuses, InvalidArgumentError
        naming it (``spec.cron``, ``spec.timezone``, ...)."""
        request = schedule_service_pb2.CreateScheduleRequest(spec=_spec_pb(spec))
        response = await self._call("CreateSchedule", request)
        return convert.schedule_from_pb(response.schedule)

    async def get_schedule(
        self, schedule: str | uuid.UUID, *, next_count: int = 0, runs_count: int = 0
    ) -> ScheduleDetails:
        """Read one schedule with its next ``next_count`` occurrences (0: 5; at most 100)
        and its latest ``runs_count`` runs (0: 10; at most 100)."""
        for argument, count in (("next_count", next_count), ("runs_count", runs_count)):
            if count < 0:
                raise ValueError(f"{argument} must be >= 0 (0: the server default), got {count}")
        request = schedule_service_pb2.GetScheduleRequest(
            id=str(schedule), next_count=next_count, runs_count=runs_count
        )
        return convert.schedule_details_from_pb(await self._call("GetSchedule", request))

    async def list_schedules(
        self, *, page_size: int = 0, page_token: str | None = None
    ) -> SchedulePage:
        """One page of the tenant's schedules, ordered by name. ``page_size`` 0 lets the
        server choose (100); pass the page's ``next_page_token`` for the next page (None
        on the last)."""
        if page_size < 0:
            raise ValueError(f"page_size must be >= 0 (0: the server default), got {page_size}")
        request = schedule_service_pb2.ListSchedulesRequest(
            page_size=page_size, page_token=page_token or ""
        )
        return convert.schedule_page_from_pb(await self._call("ListSchedules", request))

    async def iter_schedules(self, *, page_size: int = 0) -> AsyncIterator[Schedule]:
        """Every schedule of the tenant, following page tokens; one call per page."""
        token: str | None = None
        while True:
            page = await self.list_schedules(page_size=page_size, page_token=token)
            for schedule in page.schedules:
                yield schedule
            if page.next_page_token is None:
                return
            token = page.next_page_token

    async def update_schedule(self, schedule: str | uuid.UUID, spec: ScheduleSpec) -> Schedule:
        """Replace a schedule's whole spec (a new name renames it; the id stays). It takes
        effect from the next occurrence: occurrences created ahead under the old spec that
        have not started are withdrawn and created again under the new one. To change one
        field, read the spec and replace it: ``dataclasses.replace(details.schedule.spec,
        cron="0 4 * * *")``."""
        request = schedule_service_pb2.UpdateScheduleRequest(id=str(schedule), spec=_spec_pb(spec))
        response = await self._call("UpdateSchedule", request)
        return convert.schedule_from_pb(response.schedule)

    async def pause_schedule(self, schedule: str | uuid.UUID) -> Schedule:
        """Stop creating occurrences and withdraw those created ahead that have not
        started; a paused schedule is not alerted on. Pausing a paused one changes
        nothing."""
        request = schedule_service_pb2.PauseScheduleRequest(id=str(schedule))
        return convert.schedule_from_pb((await self._call("PauseSchedule", request)).schedule)

    async def resume_schedule(self, schedule: str | uuid.UUID) -> Schedule:
        """Resume from now: occurrences that fell in the pause are not caught up."""
        request = schedule_service_pb2.ResumeScheduleRequest(id=str(schedule))
        return convert.schedule_from_pb((await self._call("ResumeSchedule", request)).schedule)

    async def delete_schedule(self, schedule: str | uuid.UUID) -> int:
        """Delete a schedule and its occurrence history; the number of occurrences
        withdrawn (created ahead, not started). Tasks that ran or run stay."""
        request = schedule_service_pb2.DeleteScheduleRequest(id=str(schedule))
        response = await self._call("DeleteSchedule", request)
        withdrawn: int = response.withdrawn
        return withdrawn

    async def trigger_schedule(self, schedule: str | uuid.UUID) -> ScheduleRun:
        """Run one occurrence now (its logical date: now), whatever the rule, a pause or
        the schedule's end; the overlap policy does not apply."""
        request = schedule_service_pb2.TriggerScheduleRequest(id=str(schedule))
        return convert.schedule_run_from_pb((await self._call("TriggerSchedule", request)).run)

    async def backfill_schedule(
        self, schedule: str | uuid.UUID, start: datetime, end: datetime
    ) -> BackfillResult:
        """Run now every occurrence of the rule with ``start <= logical date <= end``
        (aware datetimes) that has no run yet, each with its own logical date; at most
        1,000 occurrences per call. The overlap policy does not apply."""
        request = convert.backfill_request(str(schedule), start, end)
        return convert.backfill_result_from_pb(await self._call("BackfillSchedule", request))

    # --- workflows -----------------------------------------------------------------------
    #
    # A workflow is named by its id; another tenant's workflow is NotFoundError.

    async def create_workflow(
        self,
        name: str,
        tasks: Iterable[WorkflowTask],
        edges: Iterable[WorkflowEdge | tuple[str, str]] = (),
        *,
        at: datetime | None = None,
        delay_s: float | None = None,
        idempotency_key: str | None = None,
        job_id: str | None = None,
    ) -> WorkflowCreateResult:
        """Create a workflow: ``tasks`` named by their refs and ``edges`` parent -> child
        between refs (:class:`WorkflowEdge` or ``(parent, child)`` pairs), all in one
        transaction or nothing. ``at`` (aware) or ``delay_s`` says when the tasks without
        parents are due (each after its own jitter); neither means now. With an
        ``idempotency_key``, repeating the same request returns the original workflow
        with ``created=False`` (a different request under the key: AlreadyExistsError).
        ``job_id`` names the watchdog's job the run completes when it SUCCEEDS: one
        completion per run, whatever its tasks' own job ids.

        Raises TypeError/ValueError naming the item (``tasks[3]: ...``) before any call
        for what cannot be encoded; InvalidArgumentError for what the server refuses,
        naming the request field (``tasks[3].ref``, ``edges[7].child``, ``edges`` for a
        cycle, whose message names one).
        """
        request = convert.create_workflow_request(
            name,
            tasks,
            edges,
            at=at,
            delay_s=delay_s,
            idempotency_key=idempotency_key,
            job_id=job_id,
        )
        response = await self._call("CreateWorkflow", request)
        return convert.workflow_create_result_from_pb(response)

    async def get_workflow(self, workflow_id: str | uuid.UUID) -> WorkflowDetail:
        """Read one workflow: the run, its tasks as they are now (parents before
        children) and its edges."""
        request = workflow_service_pb2.GetWorkflowRequest(id=str(workflow_id))
        return convert.workflow_detail_from_pb(await self._call("GetWorkflow", request))

    async def list_workflows(
        self,
        *,
        state: WorkflowState | str | None = None,
        page_size: int = 0,
        page_token: str | None = None,
    ) -> WorkflowPage:
        """One page of the tenant's workflows, newest first; ``state`` keeps only runs in
        that state. ``page_size`` 0 lets the server choose (100); pass the page's
        ``next_page_token`` for the next page (None on the last)."""
        request = convert.list_workflows_request(state, page_size, page_token)
        return convert.workflow_page_from_pb(await self._call("ListWorkflows", request))

    async def iter_workflows(
        self, *, state: WorkflowState | str | None = None, page_size: int = 0
    ) -> AsyncIterator[Workflow]:
        """Every workflow of the tenant (in ``state``), newest first, following page
        tokens; one call per page."""
        token: str | None = None
        while True:
            page = await self.list_workflows(state=state, page_size=page_size, page_token=token)
            for workflow in page.workflows:
                yield workflow
            if page.next_page_token is None:
                return
            token = page.next_page_token

    async def cancel_workflow(
        self, workflow_id: str | uuid.UUID, reason: str = ""
    ) -> WorkflowCancelResult:
        """Cancel every task of the run that is not terminal: waiting ones at once
        (CANCELLED), running ones cooperatively (their workers are asked to stop).
        ``reason`` is each cancelled task's last error (empty: "workflow cancelled").
        Cancelling a finished workflow changes nothing and returns it."""
        request = workflow_service_pb2.CancelWorkflowRequest(id=str(workflow_id), reason=reason)
        return convert.workflow_cancel_result_from_pb(await self._call("CancelWorkflow", request))

    async def retry_workflow(self, workflow_id: str | uuid.UUID) -> WorkflowRetryResult:
        """Retry a finished run from its failures on: every task that did not complete
        goes back to SCHEDULED; what completed is kept, not run again. A SUCCEEDED run
        comes back unchanged; a RUNNING one raises :class:`FailedPreconditionError`."""
        request = workflow_service_pb2.RetryWorkflowRequest(id=str(workflow_id))
        return convert.workflow_retry_result_from_pb(await self._call("RetryWorkflow", request))

    # --- the watchdog's incidents ---------------------------------------------------------

    async def list_incidents(
        self, *, include_resolved: bool = False, limit: int = 0, all_tenants: bool = False
    ) -> builtins.list[Incident]:
        """The watchdog's incidents about the tenant's jobs, newest first: the open ones,
        and with ``include_resolved`` those resolved in the last day too; at most
        ``limit`` (0: the server's default, 100; it caps it at 1,000). With
        ``all_tenants`` (an operator key only, else :class:`PermissionDeniedError`)
        every tenant's incidents and the cluster's own, each naming its tenant."""
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        request = watchdog_service_pb2.ListIncidentsRequest(
            include_resolved=include_resolved, page_size=limit, all_tenants=all_tenants
        )
        response = await self._call("ListIncidents", request)
        return [convert.incident_from_pb(i) for i in response.incidents]

    # --- the cluster's worker sessions -----------------------------------------------------

    async def list_worker_sessions(
        self,
        *,
        worker_id: str | None = None,
        node_id: str | None = None,
        page_size: int = 0,
        page_token: str | None = None,
    ) -> WorkerSessionPage:
        """One page of the cluster's live worker sessions (one per worker and node it has
        a stream with), ordered by worker id then node id: the sessions the tenant's own
        workers opened (with its key), or every session for an operator's key
        (``restricted`` says which). ``worker_id`` and ``node_id`` narrow it to one
        worker, one node; ``page_size`` 0 is the server's default (100; it caps it at
        1,000)."""
        if page_size < 0:
            raise ValueError(f"page_size must be >= 0, got {page_size}")
        request = admin_service_pb2.ListWorkerSessionsRequest(
            worker_id=worker_id or "",
            node_id=node_id or "",
            page_size=page_size,
            page_token=page_token or "",
        )
        response = await self._call("ListWorkerSessions", request)
        return convert.worker_session_page_from_pb(response)

    async def iter_worker_sessions(
        self, *, worker_id: str | None = None, node_id: str | None = None, page_size: int = 0
    ) -> AsyncIterator[WorkerSession]:
        """Every session :meth:`list_worker_sessions` lists, following page tokens; one
        call per page."""
        token: str | None = None
        while True:
            page = await self.list_worker_sessions(
                worker_id=worker_id, node_id=node_id, page_size=page_size, page_token=token
            )
            for session in page.sessions:
                yield session
            if page.next_page_token is None:
                return
            token = page.next_page_token

    # --- plumbing ------------------------------------------------------------------------

    async def _call(self, method: str, request: Any) -> Any:
        """One unary call under the client's deadline, failed over between targets as
        :mod:`chronoshard._failover` decides. A submit is traced when tracing is on: one
        span over every attempt, each sending its context."""
        if method in _SUBMITS and tracing.enabled():
            name, attributes = _submit_span(method, request)
            with tracing.producer_span(TRACER, name, attributes) as span:
                response = await self._send(method, request, tracing.inject(self._metadata))
                for key, value in _submitted_attributes(method, response).items():
                    span.set_attribute(key, value)
                return response
        return await self._send(method, request, self._metadata)

    async def _send(self, method: str, request: Any, metadata: tuple[tuple[str, str], ...]) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        self._check_loop(loop)
        repeatable = failover.repeatable(method, keyed=_keyed(method, request))
        start = self._next
        self._next = (start + 1) % len(self._endpoints)
        tried: set[int] = set()
        failure: ChronoshardError | None = None
        quota_waited_s = 0.0
        followed = False
        while True:
            index = await self._connected_target(loop, deadline, start, tried)
            if self._closed:
                raise ChronoshardError(
                    f"the client was closed while {method} waited for a node; it was not sent",
                    code=grpc.StatusCode.CANCELLED,
                    reason="CLIENT_CLOSED",
                )
            if index is None:
                raise failure or self._none_ready(method)
            tried.add(index)
            try:
                endpoint = self._endpoints[index]
                return await self._attempt(endpoint, method, request, metadata, deadline)
            except QuotaExceededError as exc:
                wait_s = exc.retry_after_s
                if (
                    wait_s is None
                    or quota_waited_s + wait_s > self._max_quota_wait_s
                    or loop.time() + wait_s >= deadline
                ):
                    raise
                # Nothing was written: the same call goes again, to the next node.
                quota_waited_s += wait_s
                await asyncio.sleep(wait_s)
                tried.discard(index)
                start = (index + 1) % len(self._endpoints)
            except WrongRegionError as exc:
                home = self._regions.get(exc.home_region or "")
                if followed or home is None:
                    raise
                # Nothing was done: the tenant's own region takes this call and the next.
                followed = True
                self._move_to(home, loop)
                tried.clear()
                start = 0
            except ChronoshardError as exc:
                if not failover.may_try_another(exc.code, repeatable=repeatable):
                    raise
                failure = exc

    async def _connected_target(
        self, loop: asyncio.AbstractEventLoop, deadline: float, start: int, tried: set[int]
    ) -> int | None:
        """The target to send to next, waiting (within the deadline) while none is
        connected but one is connecting; None when there is none."""
        pause = READY_POLL_INITIAL_S
        while not self._closed:
            choice = failover.choose([e.state() for e in self._endpoints], start, tried)
            if isinstance(choice, failover.Send):
                return choice.index
            left = deadline - loop.time()
            if choice is failover.Hold.GIVE_UP or left <= 0:
                return None
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, READY_POLL_MAX_S)
        return None

    def _none_ready(self, method: str) -> UnavailableError:
        states = ", ".join(f"{e.target} {e.state().value}" for e in self._endpoints)
        return UnavailableError(
            f"no node could take {method} ({states}); the call was not sent",
            code=grpc.StatusCode.UNAVAILABLE,
            reason="NO_TARGET_READY",
        )

    async def _attempt(
        self,
        endpoint: _Endpoint,
        method: str,
        request: Any,
        metadata: tuple[tuple[str, str], ...],
        deadline: float,
    ) -> Any:
        """One attempt on one target, under the chosen channel's semaphore."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                await endpoint.slots.acquire()
        except TimeoutError:
            raise DeadlineExceededError(
                f"no free call slot on {endpoint.target} within {self._timeout_s} s "
                f"(max_in_flight={self._max_in_flight}); the call was not sent",
                code=grpc.StatusCode.DEADLINE_EXCEEDED,
                reason="CLIENT_QUEUE_TIMEOUT",
            ) from None
        try:
            # grpc wants a relative timeout; what is left of the deadline, never zero.
            remaining = max(deadline - loop.time(), 0.001)
            rpc = endpoint.methods[method]
            return await rpc(request, timeout=remaining, metadata=metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        except asyncio.CancelledError:
            # close() cancels the calls in flight on its channels. That is not a
            # cancellation of the caller's task, and must not look like one to it.
            task = asyncio.current_task()
            if self._closed and task is not None and not task.cancelling():
                raise ChronoshardError(
                    f"the client was closed while {method} was in flight; "
                    "it may or may not have been applied",
                    code=grpc.StatusCode.CANCELLED,
                    reason="CLIENT_CLOSED",
                ) from None
            raise
        finally:
            endpoint.slots.release()

    def _check_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._closed:
            raise RuntimeError("the Chronoshard client is closed")
        if self._loop is None:
            self._open(loop)
        elif loop is not self._loop:
            raise RuntimeError(
                "this Client belongs to another event loop (gRPC channels cannot move "
                "between loops): create one Client per loop, or use SyncClient"
            )

    def _move_to(self, targets: tuple[str, ...], loop: asyncio.AbstractEventLoop) -> None:
        if targets == self._targets:
            return
        self._left.extend(self._endpoints)
        self._endpoints = []
        self._targets = targets
        self._next = 0
        self._open(loop)

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        credentials = self._tls.credentials() if self._tls else None
        for target in self._targets:
            if credentials is None:
                channel = grpc.aio.insecure_channel(target, options=self._options)
            else:
                channel = grpc.aio.secure_channel(target, credentials, options=self._options)
            self._endpoints.append(_Endpoint(target, channel, self._max_in_flight))
        self._loop = loop


def _targets(target: str | Sequence[str]) -> tuple[str, ...]:
    targets = (target,) if isinstance(target, str) else tuple(target)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"target must be 'host:port' or a non-empty list of them: {target!r}")
    return targets


def _spec_pb(spec: ScheduleSpec) -> schedule_service_pb2.ScheduleSpec:
    if not isinstance(spec, ScheduleSpec):
        raise TypeError(f"spec must be a ScheduleSpec, got {type(spec).__name__}")
    return convert.schedule_spec_to_pb(spec)


def _unary_methods(stub: Any, module: Any) -> dict[str, Any]:
    """The stub's callables by RPC name, for every method of the module's one service."""
    [service] = module.DESCRIPTOR.services_by_name.values()
    return {method.name: getattr(stub, method.name) for method in service.methods}


TRACER = "chronoshard.client"
"""The instrumentation scope of the client's spans."""

# The calls that send tasks: each is a PRODUCER span (messaging semantic conventions).
_SUBMITS = frozenset({"SubmitTask", "SubmitBatch", "CreateWorkflow"})


def _submit_span(method: str, request: Any) -> tuple[str, tracing.Attributes]:
    """The name and attributes of a submit call's span (built only when tracing is on).
    The operation is ``send`` for all three; a batch or a workflow also says how many
    tasks it carries, and names their type or queue when all of them share it. Names stay
    of low cardinality: a task type, never a workflow's name (which may carry a date)."""
    attributes: dict[str, str | bool | int | float] = {
        "messaging.system": tracing.MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
    }
    if method == "SubmitTask":
        attributes["messaging.operation.name"] = "submit"
        attributes["messaging.destination.name"] = request.queue or DEFAULT_QUEUE
        attributes["chronoshard.task.type"] = request.type
        return f"submit {request.type}", attributes
    if method == "SubmitBatch":
        operation, tasks = "submit_batch", list(request.tasks)
    else:
        operation, tasks = "create_workflow", [item.task for item in request.tasks]
        attributes["chronoshard.workflow.name"] = request.name
    attributes["messaging.operation.name"] = operation
    attributes["messaging.batch.message_count"] = len(tasks)
    queues = {task.queue or DEFAULT_QUEUE for task in tasks}
    if len(queues) == 1:
        attributes["messaging.destination.name"] = queues.pop()
    types = {task.type for task in tasks}
    if len(types) == 1:
        attributes["chronoshard.task.type"] = task_type = types.pop()
        if method == "SubmitBatch":
            return f"{operation} {task_type}", attributes
    return operation, attributes


def _submitted_attributes(method: str, response: Any) -> dict[str, str]:
    """What the answer tells of a submit: the task (or workflow) id and its tenant."""
    if method == "SubmitTask":
        return {
            "messaging.message.id": response.task.id,
            "chronoshard.tenant": response.task.tenant_id,
        }
    if method == "CreateWorkflow":
        return {
            "chronoshard.workflow.id": response.workflow.id,
            "chronoshard.tenant": response.workflow.tenant_id,
        }
    return {}


def _keyed(method: str, request: Any) -> bool:
    """Whether every task a submit request carries has an idempotency key (a workflow's
    key covers all of its tasks)."""
    if method in ("SubmitTask", "CreateWorkflow"):
        return bool(request.idempotency_key)
    if method == "SubmitBatch":
        return all(task.idempotency_key for task in request.tasks)
    return False

"""The blocking client: :class:`SyncClient`, the methods of :class:`~chronoshard.client.Client`
as plain calls.

A SyncClient runs one private event loop (uvloop when installed) in a daemon thread and
hands each call to it with ``run_coroutine_threadsafe``, then waits. We chose this over
grpc's blocking API because the same implementation then serves both APIs — identical
deadlines, concurrency bound, batching and error mapping, tested once — and because it is
safe everywhere a blocking call is: any number of threads can share one SyncClient, and it
works in a thread that already runs an event loop (a notebook cell, sync code called from
an async framework), where ``asyncio.run`` would refuse. grpc's blocking API would have
meant a second implementation of all of that.

Shutdown is written out because threads make it easy to hang: ``close()`` (also run by a
finalizer when the object is collected or at exit) closes the channels on their loop, stops
the loop, cancels what is left on it, and joins the thread. A caller still waiting then gets
an error (``CLIENT_CLOSED``) rather than waiting forever.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import threading
import uuid
import weakref
from collections.abc import Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from chronoshard.client import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_TIMEOUT_S,
    Client,
    TLSConfig,
)
from chronoshard.errors import ChronoshardError
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
)

__all__ = ["SyncClient"]

T = TypeVar("T")

# How often a waiting caller checks that the loop thread is still alive.
_WAIT_POLL_S = 1.0


class SyncClient:
    """Blocking client with the methods of :class:`Client` (see there for each).

    Runs a private event loop in a daemon thread; every method submits the async call to it
    and waits. Safe to share between threads and to use from plain scripts. Use as
    ``with SyncClient(...) as client:`` or call :meth:`close`; a forgotten client is closed
    when it is garbage collected or at interpreter exit.
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
    ) -> None:
        self._client = Client(
            target,
            api_key=api_key,
            tls=tls,
            timeout_s=timeout_s,
            max_in_flight=max_in_flight,
            max_batch_bytes=max_batch_bytes,
            extra_channel_options=extra_channel_options,
            max_quota_wait_s=max_quota_wait_s,
        )
        self._loop = _new_event_loop()
        running = threading.Event()
        self._thread = threading.Thread(
            target=_run_loop,
            args=(self._loop, running),
            name="chronoshard-client",
            daemon=True,
        )
        self._thread.start()
        # Only a running loop can be stopped: a close() right after construction must not
        # race the thread's start.
        running.wait()
        # Holds no reference to self, so it can run when self is collected.
        self._finalizer = weakref.finalize(self, _shutdown, self._client, self._loop, self._thread)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channels and stop the background loop. Idempotent."""
        self._finalizer()

    def submit(
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
        """Blocking :meth:`Client.submit`."""
        return self._wait(
            self._client.submit(
                type,
                payload,
                at=at,
                delay_s=delay_s,
                priority=priority,
                queue=queue,
                max_retries=max_retries,
                retry=retry,
                timeout_s=timeout_s,
                strict_timing=strict_timing,
                jitter=jitter,
                jitter_window_s=jitter_window_s,
                idempotent=idempotent,
                idempotency_key=idempotency_key,
                job_id=job_id,
            )
        )

    def submit_batch(
        self, specs: Iterable[TaskSpec]
    ) -> builtins.list[SubmitResult | ChronoshardError]:
        """Blocking :meth:`Client.submit_batch`."""
        # Materialised here: a lazy iterable would be consumed on the loop's thread.
        return self._wait(self._client.submit_batch(builtins.list(specs)))

    def get(self, task_id: str | uuid.UUID, *, attempts: bool = False) -> Task:
        """Blocking :meth:`Client.get`."""
        return self._wait(self._client.get(task_id, attempts=attempts))

    def list(
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
        """Blocking :meth:`Client.list`."""
        return self._wait(
            self._client.list(
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
        )

    def iter_tasks(
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
    ) -> Iterator[Task]:
        """Blocking :meth:`Client.iter_tasks`: fetches one page per step of the iteration."""
        if statuses is not None and not isinstance(statuses, str):
            statuses = builtins.list(statuses)  # read once per page: a generator would run dry
        token: str | None = None
        while True:
            page = self.list(
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
            yield from page.tasks
            if page.next_page_token is None:
                return
            token = page.next_page_token

    def cancel(self, task_id: str | uuid.UUID, reason: str = "") -> Task:
        """Blocking :meth:`Client.cancel`."""
        return self._wait(self._client.cancel(task_id, reason))

    def retry(self, task_id: str | uuid.UUID, delay_s: float = 0) -> Task:
        """Blocking :meth:`Client.retry`."""
        return self._wait(self._client.retry(task_id, delay_s))

    def resolve(
        self, task_id: str | uuid.UUID, resolution: Resolution | str, reason: str = ""
    ) -> Task:
        """Blocking :meth:`Client.resolve`."""
        return self._wait(self._client.resolve(task_id, resolution, reason))

    def create_schedule(self, spec: ScheduleSpec) -> Schedule:
        """Blocking :meth:`Client.create_schedule`."""
        return self._wait(self._client.create_schedule(spec))

    def get_schedule(
        self, schedule: str | uuid.UUID, *, next_count: int = 0, runs_count: int = 0
    ) -> ScheduleDetails:
        """Blocking :meth:`Client.get_schedule`."""
        return self._wait(
            self._client.get_schedule(schedule, next_count=next_count, runs_count=runs_count)
        )

    def list_schedules(self, *, page_size: int = 0, page_token: str | None = None) -> SchedulePage:
        """Blocking :meth:`Client.list_schedules`."""
        return self._wait(self._client.list_schedules(page_size=page_size, page_token=page_token))

    def iter_schedules(self, *, page_size: int = 0) -> Iterator[Schedule]:
        """Blocking :meth:`Client.iter_schedules`: fetches one page per step."""
        token: str | None = None
        while True:
            page = self.list_schedules(page_size=page_size, page_token=token)
            yield from page.schedules
            if page.next_page_token is None:
                return
            token = page.next_page_token

    def update_schedule(self, schedule: str | uuid.UUID, spec: ScheduleSpec) -> Schedule:
        """Blocking :meth:`Client.update_schedule`."""
        return self._wait(self._client.update_schedule(schedule, spec))

    def pause_schedule(self, schedule: str | uuid.UUID) -> Schedule:
        """Blocking :meth:`Client.pause_schedule`."""
        return self._wait(self._client.pause_schedule(schedule))

    def resume_schedule(self, schedule: str | uuid.UUID) -> Schedule:
        """Blocking :meth:`Client.resume_schedule`."""
        return self._wait(self._client.resume_schedule(schedule))

    def delete_schedule(self, schedule: str | uuid.UUID) -> int:
        """Blocking :meth:`Client.delete_schedule`."""
        return self._wait(self._client.delete_schedule(schedule))

    def trigger_schedule(self, schedule: str | uuid.UUID) -> ScheduleRun:
        """Blocking :meth:`Client.trigger_schedule`."""
        return self._wait(self._client.trigger_schedule(schedule))

    def backfill_schedule(
        self, schedule: str | uuid.UUID, start: datetime, end: datetime
    ) -> BackfillResult:
        """Blocking :meth:`Client.backfill_schedule`."""
        return self._wait(self._client.backfill_schedule(schedule, start, end))

    def create_workflow(
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
        """Blocking :meth:`Client.create_workflow`."""
        # Materialised here: lazy iterables would be consumed on the loop's thread.
        return self._wait(
            self._client.create_workflow(
                name,
                builtins.list(tasks),
                builtins.list(edges),
                at=at,
                delay_s=delay_s,
                idempotency_key=idempotency_key,
                job_id=job_id,
            )
        )

    def get_workflow(self, workflow_id: str | uuid.UUID) -> WorkflowDetail:
        """Blocking :meth:`Client.get_workflow`."""
        return self._wait(self._client.get_workflow(workflow_id))

    def list_workflows(
        self,
        *,
        state: WorkflowState | str | None = None,
        page_size: int = 0,
        page_token: str | None = None,
    ) -> WorkflowPage:
        """Blocking :meth:`Client.list_workflows`."""
        return self._wait(
            self._client.list_workflows(state=state, page_size=page_size, page_token=page_token)
        )

    def iter_workflows(
        self, *, state: WorkflowState | str | None = None, page_size: int = 0
    ) -> Iterator[Workflow]:
        """Blocking :meth:`Client.iter_workflows`: fetches one page per step."""
        token: str | None = None
        while True:
            page = self.list_workflows(state=state, page_size=page_size, page_token=token)
            yield from page.workflows
            if page.next_page_token is None:
                return
            token = page.next_page_token

    def cancel_workflow(
        self, workflow_id: str | uuid.UUID, reason: str = ""
    ) -> WorkflowCancelResult:
        """Blocking :meth:`Client.cancel_workflow`."""
        return self._wait(self._client.cancel_workflow(workflow_id, reason))

    def retry_workflow(self, workflow_id: str | uuid.UUID) -> WorkflowRetryResult:
        """Blocking :meth:`Client.retry_workflow`."""
        return self._wait(self._client.retry_workflow(workflow_id))

    def list_incidents(
        self, *, include_resolved: bool = False, limit: int = 0, all_tenants: bool = False
    ) -> builtins.list[Incident]:
        """Blocking :meth:`Client.list_incidents`."""
        return self._wait(
            self._client.list_incidents(
                include_resolved=include_resolved, limit=limit, all_tenants=all_tenants
            )
        )

    def list_worker_sessions(
        self,
        *,
        worker_id: str | None = None,
        node_id: str | None = None,
        page_size: int = 0,
        page_token: str | None = None,
    ) -> WorkerSessionPage:
        """Blocking :meth:`Client.list_worker_sessions`."""
        return self._wait(
            self._client.list_worker_sessions(
                worker_id=worker_id, node_id=node_id, page_size=page_size, page_token=page_token
            )
        )

    def iter_worker_sessions(
        self, *, worker_id: str | None = None, node_id: str | None = None, page_size: int = 0
    ) -> Iterator[WorkerSession]:
        """Blocking :meth:`Client.iter_worker_sessions`: fetches one page per step."""
        token: str | None = None
        while True:
            page = self.list_worker_sessions(
                worker_id=worker_id, node_id=node_id, page_size=page_size, page_token=token
            )
            yield from page.sessions
            if page.next_page_token is None:
                return
            token = page.next_page_token

    def _wait(self, call: Coroutine[Any, Any, T]) -> T:
        if not self._finalizer.alive:
            call.close()
            raise RuntimeError("the Chronoshard client is closed")
        if threading.current_thread() is self._thread:
            call.close()
            raise RuntimeError("SyncClient called from its own loop thread would deadlock")
        try:
            future = asyncio.run_coroutine_threadsafe(call, self._loop)
        except RuntimeError:  # the loop closed after the check above (a concurrent close)
            call.close()
            raise RuntimeError("the Chronoshard client is closed") from None
        try:
            while True:
                try:
                    return future.result(timeout=_WAIT_POLL_S)
                except TimeoutError:
                    if future.done():
                        raise  # the call's own outcome, not the poll's
                    # Every call has a deadline, so this only matters when another thread
                    # closed the client and the loop stopped before running this call.
                    if not self._thread.is_alive():
                        raise RuntimeError("the Chronoshard client was closed") from None
        except BaseException:
            # KeyboardInterrupt (or any interruption of the waiting thread) must not leave
            # the call running unseen in the background. No-op when the call already ended.
            future.cancel()
            raise


def _new_event_loop() -> asyncio.AbstractEventLoop:
    # The loop Chronoshard runs on in production (docs/architecture.md#d12: grpc.aio on uvloop,
    # checked).
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def _run_loop(loop: asyncio.AbstractEventLoop, running: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(running.set)
    try:
        loop.run_forever()
    finally:
        # What asyncio.run does on the way out: cancel what is left (callers then see
        # CancelledError instead of waiting forever), finish async generators, close.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _shutdown(client: Client, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Close the channels on their own loop, then stop the loop and wait for its thread."""
    if loop.is_closed():
        return
    future = asyncio.run_coroutine_threadsafe(client.close(), loop)
    # Best effort: the channels die with the loop anyway.
    with contextlib.suppress(Exception):  # includes the result() timeout
        future.result(timeout=5.0)
    with contextlib.suppress(RuntimeError):  # closed meanwhile
        loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():
        thread.join(timeout=5.0)

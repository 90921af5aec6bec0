"""Unit-test a task handler without a cluster.

``run_task(handler, payload)`` runs one attempt through the same execution code the
worker uses (due time, timeout, cancellation, JSON encoding of the result, the outcome
table of ``_execution.py``) and returns a :class:`TaskOutcome`: what the worker would
have settled, the value or exception, and every ``ctx.heartbeat`` call recorded.

::

    async def test_resumes_from_checkpoint():
        outcome = await run_task(resize, {"image": "a.png"}, checkpoint={"done": 3})
        assert outcome.status == "completed"
        assert outcome.checkpoints[-1] == {"done": 10}

For cancellation, drive a :class:`TaskEnvironment`: ``env.cancel()``, ``env.drain()``
(the end of a drain's grace), ``env.revoke()`` or ``env.lose_lease()`` (the worker fenced
itself: no node renewed the lease), from another task, from ``on_heartbeat`` (called on
every ``ctx.heartbeat``) or before ``run`` (the attempt then never starts)::

    env = TaskEnvironment({"n": 100}, on_heartbeat=lambda rec, env: env.cancel())
    outcome = await env.run(count)
    assert outcome.status == "cancelled"

``lease_s`` gives the attempt a lease that no heartbeat renews: it lapses ``lease_s`` after
the start on the environment's clock, as a worker's would behind a partition.

A workflow task's upstream is ``parents=``, by ref: a plain value is a COMPLETED parent
that returned it, a :class:`ParentResult` says more (another status, ``omitted``)::

    outcome = await run_task(merge, parents={"left": [1, 2], "right": [3]})
    assert outcome.result == [1, 2, 3]
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chronoshard.clock import Clock, SystemClock
from chronoshard.worker._context import (
    UNSET,
    BadAttempt,
    HeartbeatRecord,
    ParentResult,
    StopReason,
    build_context,
    decode_json,
    encode_json,
)
from chronoshard.worker._execution import (
    DRAIN_STOP_S,
    Abandoned,
    Completed,
    Execution,
    Failed,
    Handler,
    Outcome,
    Released,
    handler_spec,
)
from chronoshard.worker._lease import RunLease
from chronoshard.worker._models import AssignedParent, Assignment, TaskRef

__all__ = ["HeartbeatRecord", "ParentResult", "TaskEnvironment", "TaskOutcome", "run_task"]


@dataclass(frozen=True)
class TaskOutcome:
    """How the attempt ended, as the worker would have settled it.

    ``status`` is one of ``"completed"`` (Complete), ``"failed"``, ``"timed_out"``,
    ``"cancelled"`` (Fail with those flags), ``"released"`` (Release DRAINING, or CANNOT_RUN
    for a lease lost before the start), ``"revoked"`` or ``"lease_lost"`` (nothing
    settled).
    """

    status: str
    result: Any = None  # the returned value after a JSON round trip (completed only)
    result_json: bytes | None = None
    error: BaseException | None = None  # the exception the handler raised, if any
    error_message: str | None = None
    error_type: str | None = None
    retryable: bool | None = None
    released_checkpoint: Any = None  # decoded checkpoint a Release would carry
    heartbeats: tuple[HeartbeatRecord, ...] = ()

    @property
    def checkpoints(self) -> tuple[Any, ...]:
        """Every checkpoint the handler recorded, in order."""
        return tuple(h.checkpoint for h in self.heartbeats if h.checkpoint is not UNSET)

    @property
    def last_checkpoint(self) -> Any:
        checkpoints = self.checkpoints
        return checkpoints[-1] if checkpoints else None

    @property
    def progress(self) -> tuple[Any, ...]:
        return tuple(h.progress for h in self.heartbeats if h.progress is not None)


def _outcome(result: Outcome, heartbeats: tuple[HeartbeatRecord, ...]) -> TaskOutcome:
    match result:
        case Completed():
            return TaskOutcome(
                "completed",
                result=decode_json(result.result_json, empty=None),
                result_json=result.result_json,
                heartbeats=heartbeats,
            )
        case Failed():
            status = (
                "timed_out" if result.timed_out else "cancelled" if result.cancelled else "failed"
            )
            return TaskOutcome(
                status,
                error=result.exception,
                error_message=result.error_message,
                error_type=result.error_type,
                retryable=result.retryable,
                heartbeats=heartbeats,
            )
        case Released():
            checkpoint = (
                None if result.checkpoint is None else decode_json(result.checkpoint, empty=None)
            )
            return TaskOutcome("released", released_checkpoint=checkpoint, heartbeats=heartbeats)
        case Abandoned():
            status = "lease_lost" if result.lease_lost else "revoked"
            return TaskOutcome(status, heartbeats=heartbeats)


def _assigned_parents(parents: Mapping[str, Any] | None) -> tuple[AssignedParent, ...]:
    """``parents=`` as a node would send them: each result JSON-encoded, so the handler
    sees it after the same round trip (and decoding) as on a worker."""
    out: list[AssignedParent] = []
    for ref, value in (parents or {}).items():
        if not ref:
            raise ValueError("parents: a ref must not be empty")
        if isinstance(value, ParentResult):
            if value.ref != ref:
                raise ValueError(f"parents[{ref!r}] is the ParentResult of {value.ref!r}")
            out.append(
                AssignedParent(
                    ref=ref,
                    task_id=str(value.task_id),
                    status=value.status,
                    result_json=b"" if value.omitted else encode_json(value.result),
                    omitted=value.omitted,
                )
            )
        else:
            out.append(
                AssignedParent(
                    ref=ref,
                    task_id=str(uuid.uuid4()),
                    status="COMPLETED",
                    result_json=encode_json(value),
                )
            )
    return tuple(out)


class TaskEnvironment:
    """One attempt's settings, and the controls the scheduler would have over it.

    ``parents`` (by ref: a value a COMPLETED parent returned, or a :class:`ParentResult`)
    makes the attempt a workflow task; ``workflow_id`` is then a fresh id unless given.
    """

    def __init__(
        self,
        payload: Any = None,
        *,
        task_type: str = "test",
        attempt: int = 1,
        max_retries: int = 0,
        checkpoint: Any = None,
        timeout_s: float | None = None,
        queue: str = "default",
        task_id: uuid.UUID | None = None,
        fencing_token: int = 1,
        scheduled_at: datetime | None = None,
        due_at: datetime | None = None,
        trace_context: Mapping[str, str] | None = None,
        worker_id: str = "test-worker",
        clock: Clock | None = None,
        drain_stop_s: float = DRAIN_STOP_S,
        on_heartbeat: Callable[[HeartbeatRecord, TaskEnvironment], None] | None = None,
        lease_s: float | None = None,
        idempotent: bool = False,
        logical_date: datetime | None = None,
        schedule_id: uuid.UUID | None = None,
        parents: Mapping[str, Any] | None = None,
        workflow_id: uuid.UUID | None = None,
        workflow_ref: str | None = None,
    ) -> None:
        self._clock = clock or SystemClock()
        assigned_parents = _assigned_parents(parents)
        # A task with parents (or a ref) is a workflow's: as on a cluster, it has an id.
        if workflow_id is None and (assigned_parents or workflow_ref is not None):
            workflow_id = uuid.uuid4()
        self._lease_s = lease_s
        now = self._clock.now()
        self._assignment = Assignment(
            task=TaskRef(str(task_id or uuid.uuid4()), scheduled_at or now),
            type=task_type,
            payload_json=encode_json({} if payload is None else payload),
            fencing_token=fencing_token,
            attempt=attempt,
            max_retries=max_retries,
            due_at=due_at or scheduled_at or now,
            lease_expires_at=None,
            timeout_s=timeout_s,
            checkpoint=b"" if checkpoint is None else encode_json(checkpoint),
            trace_context=dict(trace_context or {}),
            queue=queue,
            idempotent=idempotent,
            logical_date=logical_date,
            schedule_id=None if schedule_id is None else str(schedule_id),
            workflow_id=None if workflow_id is None else str(workflow_id),
            workflow_ref=workflow_ref,
            parent_results=assigned_parents,
        )
        self._timeout_s = timeout_s
        self._worker_id = worker_id
        self._drain_stop_s = drain_stop_s
        self._on_heartbeat = on_heartbeat
        self._heartbeats: list[HeartbeatRecord] = []
        self._pending_stop: StopReason | None = None
        self._execution: Execution | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None

    @property
    def heartbeats(self) -> tuple[HeartbeatRecord, ...]:
        """Heartbeats recorded so far (also while the handler runs)."""
        return tuple(self._heartbeats)

    def cancel(self) -> None:
        """Deliver a Cancel (cooperative: ``ctx.cancelled`` turns True)."""
        self._stop(StopReason.CANCELLED)

    def drain(self) -> None:
        """The worker's drain grace ran out: ask the handler to stop and release."""
        self._stop(StopReason.DRAINING)

    def revoke(self) -> None:
        """The token was revoked: the handler is stopped and nothing is settled."""
        self._stop(StopReason.REVOKED)

    def lose_lease(self) -> None:
        """No node renewed the lease in time: the worker fences itself (the handler is
        stopped, ``ctx.check_lease()`` and the commit helpers refuse, nothing is
        settled)."""
        self._stop(StopReason.LEASE_LOST)

    def _stop(self, reason: StopReason) -> None:
        # Thread-safe: a sync handler's on_heartbeat callback runs in its thread.
        loop = self._loop
        if loop is not None and self._loop_thread != threading.get_ident():
            loop.call_soon_threadsafe(self._stop_now, reason)
        else:
            self._stop_now(reason)

    def _stop_now(self, reason: StopReason) -> None:
        if self._execution is None:
            self._pending_stop = reason
        else:
            self._execution.request_stop(reason)

    def _record(self, record: HeartbeatRecord) -> None:
        self._heartbeats.append(record)
        if self._on_heartbeat is not None:
            self._on_heartbeat(record, self)

    async def run(self, handler: Handler) -> TaskOutcome:
        """Run ``handler`` once and report how the attempt ended."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        spec = handler_spec(self._assignment.type, handler)
        monotonic = self._clock.monotonic
        lease = (
            RunLease.unbounded(monotonic)
            if self._lease_s is None
            else RunLease(deadline=monotonic() + self._lease_s, margin_s=0.0, monotonic=monotonic)
        )
        try:
            ctx = build_context(
                self._assignment,
                worker_id=self._worker_id,
                timeout_s=self._timeout_s,
                now=self._clock.now,
                on_heartbeat=self._record,
                lease=lease,
            )
        except BadAttempt as exc:  # cannot happen with values encoded above
            raise AssertionError(str(exc)) from exc
        executor = None if spec.is_async else ThreadPoolExecutor(1, thread_name_prefix="task")
        try:
            self._execution = Execution(
                spec,
                ctx,
                now=self._clock.now,
                timeout_s=self._timeout_s,
                executor=executor,
                drain_stop_s=self._drain_stop_s,
            )
            if self._pending_stop is not None:
                self._execution.request_stop(self._pending_stop)
            # As the worker's per-run timer does: the lapse stops the handler.
            lapse = (
                None
                if self._lease_s is None
                else self._loop.call_later(self._lease_s, self.lose_lease)
            )
            try:
                result = await self._execution.run()
            finally:
                if lapse is not None:
                    lapse.cancel()
            # Like the worker, wait for the handler to really end (a sync handler that
            # ignores ctx.cancelled keeps running in its thread until it returns).
            await self._execution.handler_stopped()
        finally:
            if executor is not None:
                executor.shutdown(wait=False)
        return _outcome(result, tuple(self._heartbeats))


async def run_task(
    handler: Handler,
    payload: Any = None,
    *,
    attempt: int = 1,
    max_retries: int = 0,
    checkpoint: Any = None,
    timeout_s: float | None = None,
    cancel_after_s: float | None = None,
    task_type: str = "test",
    clock: Clock | None = None,
    parents: Mapping[str, Any] | None = None,
) -> TaskOutcome:
    """Run ``handler`` once on ``payload``; ``cancel_after_s`` delivers a Cancel then;
    ``parents`` as :class:`TaskEnvironment` takes them."""
    env = TaskEnvironment(
        payload,
        task_type=task_type,
        attempt=attempt,
        max_retries=max_retries,
        checkpoint=checkpoint,
        timeout_s=timeout_s,
        clock=clock,
        parents=parents,
    )
    timer = (
        asyncio.get_running_loop().call_later(cancel_after_s, env.cancel)
        if cancel_after_s is not None
        else None
    )
    try:
        return await env.run(handler)
    finally:
        if timer is not None:
            timer.cancel()

"""One attempt of one handler: wait for ``due_at``, run, enforce the timeout, honour stops.

:class:`Execution` is shared by the worker and by ``chronoshard.worker.testing``, so a
handler behaves the same under test as in production. It answers one question, *how did
this attempt end?*, as an :data:`Outcome`:

==============================  =============================================
what happened                   outcome (and the settlement the worker sends)
==============================  =============================================
handler returned a value        ``Completed`` (Complete), even after a Cancel
                                or a drain request: the work was done
return value not JSON           ``Failed`` non-retryable (Fail), error type
                                ``ResultNotSerializable``
return value JSON the           ``Failed`` non-retryable (Fail), error type
scheduler would not store       ``ResultRefused``: NUL or lone surrogate,
                                nesting over 100, a number over 1000 digits
handler raised                  ``Failed``; retryable unless the exception says
                                ``retryable = False`` (NonRetryableError)
raised after a Cancel           ``Failed(cancelled=True)``: the task ends CANCELLED
ran past its timeout            ``Failed(timed_out=True, retryable=True)`` at once
raised or stuck after the       ``Released`` with the attempt's last checkpoint
drain grace                     (Release DRAINING): resumes on another worker
token revoked                   ``Abandoned``: nothing is settled, ever
lease lost (self-fenced)        ``Abandoned``: nothing is settled, whatever the
                                handler returns; the node decides after lease +
                                margin (re-run, or outcome unknown)
lease lost before the start     ``Released`` (Release CANNOT_RUN): it never ran
==============================  =============================================

The outcome is decided as early as it is known (a timeout does not wait for a stuck
handler), while :meth:`Execution.handler_stopped` tells when the handler really ended:
an async handler is cancelled, but a thread cannot be killed, so a sync handler that
ignores ``ctx.cancelled`` keeps its slot (and its thread) until it returns. Once the
outcome is decided the attempt's lease is fenced (``ctx.check_lease()`` and the helpers
of ``chronoshard.worker.commit`` refuse), so a handler that runs on cannot write.

With OpenTelemetry configured (:mod:`chronoshard.tracing`, docs/tracing.md), a handler
runs under a CONSUMER span, ``process <type>``, current for the handler so that its own
spans nest under it, from its start until the outcome is decided. The span is linked to
the submit's (``ctx.trace_context``), not its child: the run may come days later. A
failure records its exception and sets the status to ERROR.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import traceback
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from chronoshard import json_documents, tracing
from chronoshard.worker._context import FINAL_STOPS, StopReason, TaskContext, encode_json
from chronoshard.worker._errors import RESULT_REFUSED
from chronoshard.worker._slots import HandlerSlots

if TYPE_CHECKING:
    from opentelemetry.trace import Span

Handler = Callable[[TaskContext], Any]
"""``async def handler(ctx) -> json`` or ``def handler(ctx) -> json`` (runs in a thread)."""

MAX_ERROR_CHARS = 8192
"""Error text sent with a Fail is cut to this length (head and tail kept)."""
DRAIN_STOP_S = 5.0
"""After the drain grace, how long a handler asked to stop may take before it is released."""
_CANCEL_CLEANUP_S = 1.0
"""How long a cancelled async handler may run its cleanup (e.g. save a checkpoint)."""
TRACER = "chronoshard.worker"
"""The instrumentation scope of the runs' spans."""


@dataclass(frozen=True)
class HandlerSpec:
    task_type: str
    fn: Handler
    is_async: bool
    timeout_s: float | None = None


def handler_spec(task_type: str, fn: Handler, timeout_s: float | None = None) -> HandlerSpec:
    """Describe a handler; async when it is a coroutine function (or has an async
    ``__call__``), sync otherwise."""
    if timeout_s is not None and timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an async __call__ on an instance
    )
    return HandlerSpec(task_type, fn, is_async, timeout_s)


def effective_timeout(*timeouts_s: float | None) -> float | None:
    """The tightest of the given timeouts (handler's registration, task's own)."""
    given = [t for t in timeouts_s if t is not None and t > 0]
    return min(given) if given else None


# ---- outcomes ------------------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    result_json: bytes


@dataclass(frozen=True)
class Failed:
    error_message: str
    error_type: str
    retryable: bool
    timed_out: bool = False
    cancelled: bool = False
    exception: BaseException | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Released:
    checkpoint: bytes | None
    detail: str = "worker draining"
    never_started: bool = False
    """The handler was never called (Release CANNOT_RUN: the attempt is not counted)."""


@dataclass(frozen=True)
class Abandoned:
    reason: str
    lease_lost: bool = False
    """The worker fenced itself (no renewal in time), as opposed to a revoked token."""


LEASE_LOST = Abandoned("lease lost: no node renewed it in time", lease_lost=True)


Outcome = Completed | Failed | Released | Abandoned


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _bounded(text: str) -> str:
    if len(text) <= MAX_ERROR_CHARS:
        return text
    half = MAX_ERROR_CHARS // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


def failure(
    exc: BaseException,
    *,
    timed_out: bool = False,
    cancelled: bool = False,
) -> Failed:
    """A Failed outcome for ``exc``: ``str(exc)`` first, then the traceback."""
    summary = str(exc) or _type_name(exc)
    trace = "".join(traceback.format_exception(exc)).rstrip()
    if cancelled:
        retryable = False  # the task ends CANCELLED whatever this says
    elif timed_out:
        retryable = True
    else:
        retryable = getattr(exc, "retryable", True) is not False
    return Failed(
        error_message=_bounded(f"{summary}\n\n{trace}" if trace else summary),
        error_type=_type_name(exc),
        retryable=retryable,
        timed_out=timed_out,
        cancelled=cancelled,
        exception=exc,
    )


def _sdk_failure(
    message: str,
    error_type: str,
    *,
    retryable: bool,
    timed_out: bool = False,
    cancelled: bool = False,
) -> Failed:
    """A failure the SDK itself diagnosed (no handler exception to describe)."""
    return Failed(message, f"chronoshard.worker.{error_type}", retryable, timed_out, cancelled)


def result_outcome(value: Any, task_type: str) -> Completed | Failed:
    """Encode a handler's return value; a value JSON cannot hold fails the attempt."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited on purpose: do not let it warn at GC
        return _sdk_failure(
            f"handler for {task_type!r} returned an awaitable: register an `async def` "
            "handler instead of a function that returns a coroutine",
            "ResultNotSerializable",
            retryable=False,
        )
    try:
        # The rules the node checks the result by (all but its size limit, which the
        # worker does not know): a result it would refuse fails here, at once, instead of
        # a Complete the node drops (the task would stay DISPATCHED until its lease ran
        # out). A deterministic bug of the handler: never retried.
        json_documents.check(value)
    except json_documents.DocumentRefused as exc:
        return result_refused(
            f"handler for {task_type!r} returned a result the scheduler does not store "
            f"({exc.rule} rule): result: {exc.problem}"
        )
    try:
        return Completed(encode_json(value))
    except (TypeError, ValueError) as exc:
        return _sdk_failure(
            f"handler for {task_type!r} returned a value that is not JSON-serialisable "
            f"({type(value).__name__}): {exc}",
            "ResultNotSerializable",
            retryable=False,
        )


MAX_REFUSAL_CHARS = 1024
"""A ResultRefused message is cut to this: it names a rule and a place, not the result."""


def result_refused(message: str) -> Failed:
    """The outcome of a result the scheduler does not store; ``message`` says which
    rule it breaks and where (cut to :data:`MAX_REFUSAL_CHARS`). Non-retryable: the same
    handler returns the same result."""
    if len(message) > MAX_REFUSAL_CHARS:
        message = message[: MAX_REFUSAL_CHARS - 3] + "..."
    return Failed(message, RESULT_REFUSED, retryable=False)


def decide(
    reason: StopReason | None,
    *,
    value: Any = None,
    exc: BaseException | None = None,
    checkpoint: bytes | None = None,
    task_type: str = "",
) -> Outcome:
    """How an attempt whose handler ended ends, given why (if at all) it was asked to stop."""
    if reason is StopReason.REVOKED:
        return Abandoned("fencing token revoked")
    if reason is StopReason.LEASE_LOST:
        # Never settled as a success: a handler that swallowed the helpers' LeaseLost and
        # returned would be recorded COMPLETED with its effect refused.
        return LEASE_LOST
    if exc is None:
        return result_outcome(value, task_type)
    if reason is StopReason.CANCELLED:
        return failure(exc, cancelled=True)
    if reason is StopReason.DRAINING:
        return Released(checkpoint)
    if reason is StopReason.TIMED_OUT:
        return failure(exc, timed_out=True)
    return failure(exc)


def not_started(reason: StopReason) -> Outcome:
    """The outcome of an attempt stopped while it waited for ``due_at``."""
    if reason is StopReason.REVOKED:
        return Abandoned("fencing token revoked")
    if reason is StopReason.LEASE_LOST:
        # The handler never ran: giving the task back is safe even for a non-idempotent
        # one (the node accepts it only while this token is current).
        return Released(None, "lease lost before the handler started", never_started=True)
    if reason is StopReason.DRAINING:
        return Released(None, "worker draining before the task started")
    return _sdk_failure(
        "cancelled before the handler started",
        "TaskCancelled",
        retryable=False,
        cancelled=reason is StopReason.CANCELLED,
        timed_out=reason is StopReason.TIMED_OUT,
    )


def _ended(outcome: Outcome | None) -> str:
    """Why a fencing helper refuses a write after the attempt's outcome was decided."""
    match outcome:
        case Completed():
            return "the attempt already completed"
        case Failed(timed_out=True):
            return "the attempt timed out"
        case Failed():
            return "the attempt already failed"
        case Released():
            return "the attempt was released"
        case Abandoned(reason=reason):
            return f"the attempt was given up ({reason})"
    return "the attempt was stopped"


# ---- running -------------------------------------------------------------------------


def _consume_result(fut: asyncio.Future[Any]) -> None:
    # Read the exception so asyncio never logs "exception was never retrieved" for a
    # handler whose outcome was decided before it ended (timeout, revoke).
    if not fut.cancelled():
        fut.exception()


class Execution:
    """Runs one attempt; :meth:`run` returns its outcome, :meth:`request_stop` stops it."""

    def __init__(
        self,
        spec: HandlerSpec,
        ctx: TaskContext,
        *,
        now: Callable[[], datetime],
        timeout_s: float | None,
        executor: Executor | None,
        drain_stop_s: float = DRAIN_STOP_S,
        slots: HandlerSlots | None = None,
        tenant_id: str = "",
    ) -> None:
        if not spec.is_async and executor is None:
            raise ValueError("a sync handler needs an executor")
        self.spec = spec
        self.ctx = ctx
        self._now = now
        self._timeout_s = timeout_s
        self._executor = executor
        self._drain_stop_s = drain_stop_s
        self._handler: asyncio.Future[Any] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        # A worker with prefetch shares its handler slots (._slots); None: every run has
        # its own. ``_holds_slot``: this run was given one and has not given it back.
        self._slots = slots
        self._holds_slot = False
        # The task's tenant, for the run's span (the context does not carry it).
        self._tenant_id = tenant_id
        self._span: Span | None = None

    @property
    def started(self) -> bool:
        return self._handler is not None

    @property
    def handler_running(self) -> bool:
        return self._handler is not None and not self._handler.done()

    def request_stop(self, reason: StopReason) -> None:
        """Ask the handler to stop (event loop thread only)."""
        self.ctx._request_stop(reason)
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    async def handler_stopped(self) -> None:
        """Return once the handler's coroutine or thread has really ended."""
        # Mostly it has by the time a run settles: no set, no callbacks for nothing.
        if self._handler is not None and not self._handler.done():
            await asyncio.wait({self._handler})

    def give_slot_back(self) -> None:
        """The handler has really ended (or never started): its handler slot, if it held
        one, goes to the next run waiting for it."""
        if self._holds_slot:
            self._holds_slot = False
            assert self._slots is not None
            self._slots.leave()

    async def _wait(
        self, timeout_s: float | None, also: asyncio.Future[None] | None = None
    ) -> None:
        """Sleep until a stop request, the handler's end, ``also``, or ``timeout_s``.

        One future, woken by whichever comes first (a done callback on the others, a
        timer for the timeout): what ``asyncio.wait(FIRST_COMPLETED)`` does, without the
        set, the checks and the second callback list it builds each time. Runs wait here
        twice each, and that was a tenth of a no-op worker's CPU (issue 14)."""
        loop = asyncio.get_running_loop()
        wakeup: asyncio.Future[None] = loop.create_future()
        self._wakeup = wakeup

        def wake(_: object = None) -> None:
            if not wakeup.done():
                wakeup.set_result(None)

        watched = [f for f in (self._handler, also) if f is not None]
        for future in watched:
            future.add_done_callback(wake)
        timer = None if timeout_s is None else loop.call_later(timeout_s, wake)
        try:
            await wakeup
        finally:
            wakeup.cancel()
            for future in watched:
                future.remove_done_callback(wake)
            if timer is not None:
                timer.cancel()

    async def _wait_until_due(self) -> bool:
        """Sleep until ``due_at`` on the injected clock; False if asked to stop first."""
        while self.ctx.cancel_reason is None:
            remaining = (self.ctx.due_at - self._now()).total_seconds()
            if remaining <= 0:
                return True
            # A timer may fire a hair early; the loop re-reads the clock, so the handler
            # never starts before due_at.
            await self._wait(remaining)
        return False

    async def _wait_for_slot(self) -> bool:
        """Wait for a handler slot when the worker holds more runs than it has (its
        prefetch); False if asked to stop first (the turn is given up)."""
        if self._slots is None:
            return True
        turn = self._slots.enter()
        try:
            while self.ctx.cancel_reason is None:
                if turn.cancelled():  # the worker is draining: start nothing more
                    self.request_stop(StopReason.DRAINING)
                elif turn.done():
                    self._holds_slot = True
                    return True
                else:
                    await self._wait(None, also=turn)
        finally:
            if not self._holds_slot:
                self._slots.withdraw(turn)
        return False

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        # The handler's own copy of the context: with tracing on, the run's span is
        # current in it (and nowhere else).
        context = contextvars.copy_context()
        if tracing.enabled():
            self._span = self._start_span()
            context.run(tracing.enter_span, self._span)
        if self.spec.is_async:
            fn, ctx = self.spec.fn, self.ctx

            async def invoke() -> Any:
                return await fn(ctx)

            self._handler = loop.create_task(
                invoke(),
                name=f"chronoshard-handler {self.spec.task_type} {ctx.task_id}",
                context=context,
            )
        else:
            self._handler = loop.run_in_executor(
                self._executor, context.run, self.spec.fn, self.ctx
            )
        self._handler.add_done_callback(_consume_result)

    def _start_span(self) -> Span:
        """The run's CONSUMER span (messaging semantic conventions), linked to the
        submit's span when the task carries a trace context."""
        ctx = self.ctx
        attributes: dict[str, str | bool | int | float] = {
            "messaging.system": tracing.MESSAGING_SYSTEM,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": ctx.queue,
            "messaging.message.id": str(ctx.task_id),
            "chronoshard.task.type": ctx.task_type,
            "chronoshard.task.attempt": ctx.attempt,
            "chronoshard.fencing_token": ctx.fencing_token,
            "chronoshard.worker.id": ctx.worker_id,
        }
        if self._tenant_id:
            attributes["chronoshard.tenant"] = self._tenant_id
        return tracing.start_span(
            TRACER,
            f"process {ctx.task_type}",
            tracing.CONSUMER,
            attributes,
            ctx.trace_context,
        )

    def _end_span(self, outcome: Outcome | None) -> None:
        """End the run's span (if any) with how the attempt ended."""
        span, self._span = self._span, None
        if span is None:
            return
        match outcome:
            case Completed():
                tracing.end_span(span, "completed")
            case Failed(cancelled=True):
                tracing.end_span(span, "cancelled")
            case Failed(error_type=error_type, error_message=message, exception=exc):
                first_line = message.split("\n", 1)[0]
                tracing.end_span(
                    span, "failed", error_type=error_type, message=first_line, exception=exc
                )
            case Released():
                tracing.end_span(span, "released")
            case Abandoned():
                tracing.end_span(span, "abandoned")
            case None:  # the run itself was cancelled (the worker stopping at once)
                tracing.end_span(span, "interrupted")

    def _hard_stop(self) -> None:
        # Only an async handler can be interrupted; a thread runs on until it returns.
        if self.spec.is_async and self._handler is not None:
            self._handler.cancel()

    def _finished(self, handler: asyncio.Future[Any]) -> Outcome:
        exc: BaseException | None
        if handler.cancelled():
            exc, value = asyncio.CancelledError("handler was cancelled"), None
        else:
            exc = handler.exception()
            value = None if exc is not None else handler.result()
        return decide(
            self.ctx.cancel_reason,
            value=value,
            exc=exc,
            checkpoint=self.ctx._latest_checkpoint(),
            task_type=self.spec.task_type,
        )

    async def run(self) -> Outcome:
        """Run the attempt; cancelling this coroutine cancels an async handler too."""
        outcome: Outcome | None = None
        try:
            outcome = await self._run()
            return outcome
        except asyncio.CancelledError:
            self._hard_stop()
            raise
        finally:
            # From here on nothing of this attempt may write, even a thread that runs on.
            self.ctx._end_attempt(_ended(outcome))
            self._end_span(outcome)

    async def _run(self) -> Outcome:
        if not (await self._wait_until_due() and await self._wait_for_slot()):
            assert self.ctx.cancel_reason is not None
            return not_started(self.ctx.cancel_reason)
        self._start()
        assert self._handler is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s if self._timeout_s is not None else None
        drain_deadline: float | None = None
        while True:
            limits = [d for d in (deadline, drain_deadline) if d is not None]
            await self._wait(max(0.0, min(limits) - loop.time()) if limits else None)
            if self._handler.done():
                return self._finished(self._handler)
            reason, now = self.ctx.cancel_reason, loop.time()
            if reason in FINAL_STOPS:
                self._hard_stop()
                return (
                    Abandoned("fencing token revoked")
                    if reason is StopReason.REVOKED
                    else LEASE_LOST
                )
            if deadline is not None and now >= deadline:
                return await self._timed_out(reason)
            if reason is StopReason.DRAINING:
                if drain_deadline is None:
                    drain_deadline = now + self._drain_stop_s
                elif now >= drain_deadline:
                    self._hard_stop()
                    # Let a cancelled async handler save its checkpoint on the way out.
                    await asyncio.wait({self._handler}, timeout=_CANCEL_CLEANUP_S)
                    return Released(self.ctx._latest_checkpoint(), "stopped after drain grace")
            # CANCELLED is cooperative: keep waiting for the handler (or its timeout).

    async def _timed_out(self, reason: StopReason | None) -> Outcome:
        if reason is StopReason.CANCELLED:
            # Asked to cancel and still running at the timeout: the cancel is the story.
            self._hard_stop()
            return _sdk_failure(
                "cancelled; the handler did not stop before its timeout",
                "TaskCancelled",
                retryable=False,
                cancelled=True,
            )
        self.request_stop(StopReason.TIMED_OUT)
        self._hard_stop()
        return _sdk_failure(
            f"handler for {self.spec.task_type!r} ran longer than its timeout of "
            f"{self._timeout_s} s",
            "TaskTimedOut",
            retryable=True,
            timed_out=True,
        )

"""Single submits on one open stream to one node (``TaskService.SubmitStream``).

A unary call per submit costs both ends of the hop more than the submit itself: on one
machine the node spent .39 CPU ms per unary ``SubmitTask`` with nothing behind it, and
.20 per message on an open stream (a third with 64 callers: bench/README.md, "A submit
on a stream"). :class:`SubmitStream` keeps one stream open and sends each submit on it;
submits from many tasks of one event loop share it, and each is answered in the order it
was sent, once its row committed, exactly as ``Client.submit`` would be.

What it does not do is fail over: the stream is to one node. A refusal (a bad field, a
reused key, the submit rate) fails that submit alone with the exception
``Client.submit`` would raise. When the stream itself breaks (the node stops or goes
away), every submit waiting on it fails with :class:`~chronoshard.errors.UnavailableError`
(retryable); one that had been written may or may not have been applied, so resubmit with
an idempotency key where that matters, or open a new stream (``Client.submit_stream``
picks a connected node).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any

import grpc

from chronoshard import _convert as convert
from chronoshard import tracing
from chronoshard.errors import (
    ChronoshardError,
    DeadlineExceededError,
    UnavailableError,
    error_for,
    from_rpc_error,
)
from chronoshard.types import SubmitResult, TaskSpec
from chronoshard.v1 import task_service_pb2

Reply = task_service_pb2.SubmitStreamReply
SpanOf = Callable[[task_service_pb2.SubmitTaskRequest], tuple[str, tracing.Attributes]]


class SubmitStream:
    """An open ``SubmitStream`` call; from :meth:`chronoshard.Client.submit_stream`, used as
    ``async with client.submit_stream() as stream: await stream.submit(spec)``."""

    def __init__(
        self, call: Any, target: str, *, timeout_s: float, tracer: str, span_of: SpanOf
    ) -> None:
        self._call = call
        self._target = target
        self._timeout_s = timeout_s
        # A submit's PRODUCER span is named and described as the client's unary one.
        self._tracer = tracer
        self._span_of = span_of
        # The futures of the submits written and not yet answered, in the order written:
        # the node answers in that order, so each reply is the oldest one's.
        self._waiting: collections.deque[asyncio.Future[Reply]] = collections.deque()
        self._writing = asyncio.Lock()
        self._broken: ChronoshardError | None = None
        self._reader = asyncio.create_task(self._read(), name=f"SubmitStream to {target}")

    async def submit(self, spec: TaskSpec) -> SubmitResult:
        """Submit one task on the stream; its outcome once its row committed.

        Raises TypeError/ValueError for a spec that cannot be encoded (nothing sent), the
        :class:`~chronoshard.errors.ChronoshardError` the node refused it with, or
        ``UnavailableError`` when the stream broke before its answer came.
        """
        if not isinstance(spec, TaskSpec):
            raise TypeError(f"spec must be a TaskSpec, got {type(spec).__name__}")
        request = task_service_pb2.SubmitStreamRequest(task=convert.submit_request(spec))
        if not tracing.enabled():
            return await self._send(request)
        with tracing.producer_span(self._tracer, *self._span_of(request.task)) as span:
            request.trace_context.update(dict(tracing.inject(())))
            result = await self._send(request)
            span.set_attribute("messaging.message.id", str(result.task.id))
            span.set_attribute("chronoshard.tenant", str(result.task.tenant_id))
            return result

    async def close(self) -> None:
        """Stop sending, wait for the answers of what was sent, and end the call."""
        async with self._writing:
            if self._broken is None:
                # A failure here is the stream's: the reader reports why it ended.
                with contextlib.suppress(grpc.RpcError, grpc.aio.UsageError):
                    await self._call.done_writing()
        await asyncio.gather(self._reader, return_exceptions=True)

    async def __aenter__(self) -> SubmitStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close()
        else:
            self._reader.cancel()
            self._call.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _send(self, request: task_service_pb2.SubmitStreamRequest) -> SubmitResult:
        answer: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        async with self._writing:
            if self._broken is not None:
                raise self._unsent()
            self._waiting.append(answer)
            # A failed write is the stream's failure: the reader fails every waiting
            # submit, this one included.
            with contextlib.suppress(grpc.RpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                await self._call.write(request)
        try:
            async with asyncio.timeout(self._timeout_s):
                # Shielded: a timed-out submit keeps its place in line, or the next
                # reply would answer the wrong submit.
                reply = await asyncio.shield(answer)
        except TimeoutError:
            # The class Client.submit raises for a call past its deadline.
            raise DeadlineExceededError(
                f"no answer on the stream to {self._target} within {self._timeout_s} s; "
                "the submit may or may not have been applied",
                code=grpc.StatusCode.DEADLINE_EXCEEDED,
                retryable=True,
            ) from None
        if reply.WhichOneof("outcome") == "error":
            raise convert.error_from_info(reply.error, retry_after_s=reply.retry_after_s or None)
        return convert.submit_result_from_pb(reply.submitted)

    async def _read(self) -> None:
        try:
            async for reply in self._call:
                if self._waiting:
                    answer = self._waiting.popleft()
                    if not answer.done():
                        answer.set_result(reply)
            failure: ChronoshardError = UnavailableError(
                f"the stream to {self._target} ended",
                code=grpc.StatusCode.UNAVAILABLE,
                reason="STREAM_ENDED",
                retryable=True,
            )
        except grpc.RpcError as exc:
            failure = from_rpc_error(exc)
        except asyncio.CancelledError:
            failure = UnavailableError(
                f"the stream to {self._target} was closed",
                code=grpc.StatusCode.CANCELLED,
                reason="STREAM_CLOSED",
                retryable=True,
            )
        self._broken = failure
        while self._waiting:
            answer = self._waiting.popleft()
            if not answer.done():
                answer.set_exception(self._broken_while_waiting())

    def _unsent(self) -> ChronoshardError:
        return self._as_broken("the submit was not sent")

    def _broken_while_waiting(self) -> ChronoshardError:
        return self._as_broken("the submit may or may not have been applied")

    def _as_broken(self, outcome: str) -> ChronoshardError:
        """The error a submit gets from a broken stream: the call's own refusal when the
        node refused the stream (a bad key: nothing of it was applied), else retryable."""
        broken = self._broken
        assert broken is not None
        if broken.retryable is False:
            return error_for(broken.code, str(broken), reason=broken.reason, retryable=False)
        return UnavailableError(
            f"the stream to {self._target} broke ({broken}); {outcome}",
            code=broken.code,
            reason=broken.reason,
            retryable=True,
        )

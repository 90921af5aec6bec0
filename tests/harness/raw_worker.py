"""A worker that speaks ``WorkerService.Connect`` by hand, for tests of the node's side of
the protocol.

The worker SDK hides what such a test asserts (the Welcome, credit returns, receipts,
batches, a Reject); this sends exactly the messages a test names and hands it every
message the node sends back, unbatched or not, as it came. It decides nothing: a test
that acknowledges or completes an assignment says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import grpc

from chronoshard.v1 import worker_service_pb2, worker_service_pb2_grpc

Metadata: TypeAlias = tuple[tuple[str, str], ...]
WorkerMessage: TypeAlias = worker_service_pb2.WorkerMessage


def bearer(api_key: str) -> Metadata:
    """Call metadata carrying ``api_key`` the way the SDK and the client send it."""
    return (("authorization", f"Bearer {api_key}"),)


def hello(
    worker_id: str, task_types: Sequence[str], *, slots: int, accepts_batches: bool = False
) -> WorkerMessage:
    return WorkerMessage(
        hello=worker_service_pb2.Hello(
            worker_id=worker_id,
            task_types=list(task_types),
            slots=slots,
            accepts_batches=accepts_batches,
        )
    )


def grant(credits: int) -> WorkerMessage:
    return WorkerMessage(credit_grant=worker_service_pb2.CreditGrant(credits=credits))


def recall(credits: int) -> WorkerMessage:
    return WorkerMessage(credit_recall=worker_service_pb2.CreditRecall(credits=credits))


def ack(assignment: worker_service_pb2.Assignment) -> WorkerMessage:
    return WorkerMessage(
        ack=worker_service_pb2.Ack(task=assignment.task, fencing_token=assignment.fencing_token)
    )


def heartbeat(*assignments: worker_service_pb2.Assignment, seq: int = 1) -> WorkerMessage:
    """A heartbeat numbered ``seq`` for the attempts of ``assignments``."""
    running = [
        worker_service_pb2.RunningTask(task=a.task, fencing_token=a.fencing_token)
        for a in assignments
    ]
    return WorkerMessage(heartbeat=worker_service_pb2.Heartbeat(seq=seq, running=running))


def complete(
    assignment: worker_service_pb2.Assignment, result_json: bytes = b"{}"
) -> WorkerMessage:
    return WorkerMessage(
        complete=worker_service_pb2.Complete(
            task=assignment.task, fencing_token=assignment.fencing_token, result_json=result_json
        )
    )


class RawWorker:
    """One ``Connect`` stream: messages queued with :meth:`send` go out in order, the
    node's come back through ``async for`` or :meth:`read` (one or the other on a stream,
    as gRPC allows)."""

    def __init__(self, call: Any, outgoing: asyncio.Queue[WorkerMessage]) -> None:
        self._call = call
        self._outgoing = outgoing

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, channel: grpc.aio.Channel, metadata: Metadata, *first: WorkerMessage
    ) -> AsyncIterator[RawWorker]:
        """Open the stream on ``channel`` with ``first`` queued (a Hello, usually) and
        cancel it on the way out (what a worker that goes away does)."""
        outgoing: asyncio.Queue[WorkerMessage] = asyncio.Queue()
        for message in first:
            outgoing.put_nowait(message)

        async def requests() -> AsyncIterator[WorkerMessage]:
            while True:
                yield await outgoing.get()

        call = worker_service_pb2_grpc.WorkerServiceStub(channel).Connect(
            requests(), metadata=metadata
        )
        worker = cls(call, outgoing)
        try:
            yield worker
        finally:
            worker.close()

    def send(self, *messages: WorkerMessage) -> None:
        """Queue ``messages``; the stream sends them in order."""
        for message in messages:
            self._outgoing.put_nowait(message)

    async def read(self) -> Any:
        """The node's next message (``grpc.aio.EOF`` once the stream ended)."""
        return await self._call.read()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._call.__aiter__()  # type: ignore[no-any-return]

    def close(self) -> None:
        """Cancel the call, as a worker process that goes away would (idempotent)."""
        self._call.cancel()

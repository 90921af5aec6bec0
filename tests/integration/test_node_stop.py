"""A settlement that reaches a node while it stops, against real PostgreSQL, etcd and gRPC.

Once a node's stop began, its group commits take no more requests: before, a settlement
that arrived then was queued where no flusher would ever take it, and its worker waited
for a Receipt that never came (a unary call, for a status that never came). Now it is
refused at once with the retryable ``NODE_STOPPING`` (the Receipt's error on the stream,
``UNAVAILABLE`` for a unary call), what was accepted before is still committed and
answered, the node ends the stream itself after that, and the worker's resend through
another node settles the refused one.

To hold the stop at that point without timing guesses, a test transaction locks the row
of the first task: its Complete's group commit waits on the lock, so the stop waits for
that flush (bounded at 10 s) while its committers already refuse.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime

import grpc
import psycopg
import pytest
from fixtures.nodes import node_config, running_node
from fixtures.stores import insert_tasks, new_tenant
from fixtures.waiting import eventually

from chronoshard.scheduler.core.api_keys import new_api_key
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.jitter import JitterMode
from chronoshard.scheduler.core.models import NewTask
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.services import EtcdProcess
from chronoshard.v1 import worker_service_pb2, worker_service_pb2_grpc
from chronoshard.wire import error_info_from_metadata

SHARDS = 4
W = worker_service_pb2


class RawWorker:
    """One ``Connect`` stream driven by the test; what the node sends is read into a queue."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        self._outgoing: asyncio.Queue[worker_service_pb2.WorkerMessage] = asyncio.Queue()
        self.received: asyncio.Queue[worker_service_pb2.SchedulerMessage | None] = asyncio.Queue()

        async def requests() -> AsyncIterator[worker_service_pb2.WorkerMessage]:
            while True:
                yield await self._outgoing.get()

        self.stream = worker_service_pb2_grpc.WorkerServiceStub(channel).Connect(
            requests(), metadata=metadata
        )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.stream:
            await self.received.put(message)
        await self.received.put(None)  # the node ended the stream

    def send(self, message: worker_service_pb2.WorkerMessage) -> None:
        self._outgoing.put_nowait(message)

    async def next(self, kind: str) -> worker_service_pb2.SchedulerMessage:
        """The next message of ``kind`` (others are skipped); fails if the stream ends."""
        async with asyncio.timeout(20):
            while True:
                message = await self.received.get()
                assert message is not None, f"the stream ended before a {kind}"
                if message.WhichOneof("message") == kind:
                    return message

    async def end(self) -> grpc.StatusCode:
        """Wait for the node to end the stream (nothing but receipts may come first)."""
        async with asyncio.timeout(20):
            while (message := await self.received.get()) is not None:
                assert message.WhichOneof("message") in ("backlog", "drain"), message
        await self._reader
        return await self.stream.code()

    def close(self) -> None:
        self.stream.cancel()
        self._reader.cancel()


def _complete(a: worker_service_pb2.Assignment) -> W.Complete:
    return W.Complete(task=a.task, fencing_token=a.fencing_token, result_json=b'{"ok": true}')


async def test_a_settlement_reaching_a_stopping_node_is_refused_retryably_then_settled_elsewhere(
    fresh_db_dsn: str, etcd: EtcdProcess
) -> None:
    config_a = node_config(fresh_db_dsn, etcd.endpoint, shard_count=SHARDS)
    node_a = SchedulerNode(config_a)
    await node_a.start()
    stopping: asyncio.Task[None] | None = None
    worker: RawWorker | None = None
    try:
        await eventually(
            lambda: len(node_a.shards.epochs()) == SHARDS, timeout_s=10, what="shards claimed"
        )
        key = new_api_key()
        tenant = await new_tenant(
            node_a.store, api_key=key, rate_limit_rps=1000.0, max_concurrent_workers=100
        )
        auth = (("authorization", f"Bearer {key}"),)
        now = datetime.now(UTC)
        ids = [new_task_id() for _ in range(2)]
        await insert_tasks(
            node_a.store,
            tenant.id,
            [
                NewTask(
                    id=task_id,
                    type="t",
                    scheduled_at=now,
                    due_at=now,
                    shard=shard_of(task_id, SHARDS),
                    payload={},
                    jitter_mode=JitterMode.NONE,
                )
                for task_id in ids
            ],
        )
        node_a.preloader.wake()

        assert node_a.addresses is not None
        channel_a = grpc.aio.insecure_channel(node_a.addresses.grpc)
        worker = RawWorker(channel_a, auth)
        worker.send(W.WorkerMessage(hello=W.Hello(worker_id="raw-stop", task_types=["t"], slots=2)))
        worker.send(W.WorkerMessage(credit_grant=W.CreditGrant(credits=2)))
        assignments = {}
        for _ in ids:
            a = (await worker.next("assignment")).assignment
            assignments[a.task.id] = a
            worker.send(W.WorkerMessage(ack=W.Ack(task=a.task, fencing_token=a.fencing_token)))
        for _ in ids:
            assert not (await worker.next("receipt")).receipt.HasField("error")
        first, second = (assignments[str(task_id)] for task_id in ids)

        # A second node of the cluster: it takes the shards over and any settlement.
        config_b = replace(config_a, node_id=f"{config_a.node_id}-b")
        async with running_node(config_b) as node_b:
            # The worker has a stream to every node (B warms up for it before it takes
            # shards over).
            assert node_b.addresses is not None
            channel_b = grpc.aio.insecure_channel(node_b.addresses.grpc)
            on_b = RawWorker(channel_b, auth)
            on_b.send(
                W.WorkerMessage(hello=W.Hello(worker_id="raw-stop", task_types=["t"], slots=2))
            )
            await on_b.next("welcome")
            async with await psycopg.AsyncConnection.connect(fresh_db_dsn) as lock:
                await lock.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (ids[0],))
                worker.send(W.WorkerMessage(complete=_complete(first)))
                async with await psycopg.AsyncConnection.connect(
                    fresh_db_dsn, autocommit=True
                ) as watch:

                    async def complete_waits_on_the_lock() -> bool:
                        cur = await watch.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type ="
                            " 'Lock' AND datname = current_database() AND query LIKE '%%UPDATE%%'"
                        )
                        row = await cur.fetchone()
                        return row is not None and row[0] >= 1

                    await eventually(
                        complete_waits_on_the_lock, timeout_s=10, what="the Complete's flush"
                    )

                stopping = asyncio.create_task(node_a.stop())
                drain = (await worker.next("drain")).drain
                assert drain.shutting_down
                await eventually(
                    lambda: not node_a.settlements.accepting,
                    timeout_s=10,
                    what="node A's group commits refusing",
                )
                assert not stopping.done()  # held by the first Complete's flush

                # A unary settlement is answered at once: UNAVAILABLE, retryable.
                stub_a = worker_service_pb2_grpc.WorkerServiceStub(channel_a)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub_a.Complete(
                        W.CompleteRequest(worker_id="raw-stop", complete=_complete(second)),
                        timeout=5,
                        metadata=auth,
                    )
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                info = error_info_from_metadata(refused.value.trailing_metadata())
                assert info is not None and info.reason == "NODE_STOPPING" and info.retryable

                # So is one on the stream: its Receipt carries the retryable error.
                worker.send(W.WorkerMessage(complete=_complete(second)))
                receipt = (await worker.next("receipt")).receipt
                assert receipt.task.id == str(ids[1])
                assert receipt.kind == W.SETTLEMENT_KIND_COMPLETE
                assert (receipt.error.code, receipt.error.reason) == (
                    "UNAVAILABLE",
                    "NODE_STOPPING",
                )
                assert receipt.error.retryable
                await lock.rollback()  # the first Complete's flush goes on

            # The Complete accepted before the stop is committed and confirmed, and only
            # then does the node end the stream (OK): nothing left for the server's grace.
            receipt = (await worker.next("receipt")).receipt
            assert receipt.task.id == str(ids[0]) and not receipt.HasField("error")
            assert await worker.end() == grpc.StatusCode.OK
            async with asyncio.timeout(15):
                await stopping
            stopping = None

            # The worker's resend through the other node settles the refused Complete.
            await worker_service_pb2_grpc.WorkerServiceStub(channel_b).Complete(
                W.CompleteRequest(worker_id="raw-stop", complete=_complete(second)),
                timeout=5,
                metadata=auth,
            )
            for task_id in ids:
                task = await node_b.store.get_task(tenant.id, task_id)
                assert task is not None and task.status.value == "COMPLETED", task
                assert task.fencing_token == 1
            on_b.close()
            await channel_b.close()
        await channel_a.close()
    finally:
        if worker is not None:
            worker.close()
        if stopping is not None:
            await stopping
        elif not node_a.stopped.is_set():
            await node_a.stop()

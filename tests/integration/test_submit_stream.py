"""``Client.submit_stream`` against a real node (its whole gRPC stack: interceptors,
decoding, the group commit) and a real PostgreSQL: each submit on the stream is answered
as ``Client.submit`` would answer it, and a broken stream fails what waits on it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.etcd import EtcdProcess
from fixtures.nodes import node_config, running_node
from fixtures.stores import tenant_with_key
from google.protobuf import duration_pb2

from chronoshard import (
    AlreadyExistsError,
    Client,
    DeadlineExceededError,
    InvalidArgumentError,
    SubmitResult,
    TaskSpec,
    UnauthenticatedError,
    UnavailableError,
)
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.v1 import task_service_pb2
from chronoshard.wire import error_info_from_metadata

LATER = timedelta(hours=2)


@pytest.fixture
async def node(fresh_db_dsn: str, etcd: EtcdProcess) -> AsyncIterator[SchedulerNode]:
    async with running_node(node_config(fresh_db_dsn, etcd.endpoint, shard_count=4)) as n:
        yield n


@pytest.fixture
async def key(node: SchedulerNode) -> str:
    """The API key of a new tenant whose submit rate no test reaches."""
    _, api_key = await tenant_with_key(node.store, rate_limit_rps=10_000.0)
    return api_key


def _address(node: SchedulerNode) -> str:
    assert node.addresses is not None
    return node.addresses.grpc


def _stored(dsn: str) -> dict[str, tuple[str, object]]:
    """Every task row: its type and payload by id (as the client's Task.id spells it)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, type, payload FROM tasks").fetchall()
    return {str(row[0]): (row[1], row[2]) for row in rows}


async def test_submits_sharing_a_stream_are_each_answered_and_stored_once(
    node: SchedulerNode, fresh_db_dsn: str, key: str
) -> None:
    at = datetime.now(UTC) + LATER
    async with Client(_address(node), api_key=key) as client:
        async with client.submit_stream() as stream:
            specs = [TaskSpec("streamed", {"i": i, "x": 0.1}, at=at) for i in range(40)]
            results = await asyncio.gather(*(stream.submit(spec) for spec in specs))
            keyed = await stream.submit(TaskSpec("keyed", {}, at=at, idempotency_key="k"))
            again = await stream.submit(TaskSpec("keyed", {}, at=at, idempotency_key="k"))
            with pytest.raises(AlreadyExistsError) as clash:
                await stream.submit(TaskSpec("other", {}, at=at, idempotency_key="k"))
            with pytest.raises(InvalidArgumentError) as bad:
                await stream.submit(TaskSpec("x" * 300, {}, at=at))
            # The refusals left the stream open.
            last = await stream.submit(TaskSpec("last", {}, at=at))
        unary = await client.get(keyed.task.id)

    assert all(isinstance(r, SubmitResult) and r.created for r in results)
    assert [r.task.payload for r in results] == [{"i": i, "x": 0.1} for i in range(40)]
    assert (keyed.created, again.created, again.task.id) == (True, False, keyed.task.id)
    assert clash.value.field == "task.idempotency_key"
    assert bad.value.field == "task.type"
    assert unary.id == keyed.task.id and unary.type == "keyed"
    stored = _stored(fresh_db_dsn)
    answered = [r.task.id for r in (*results, keyed, last)]
    assert sorted(stored) == sorted(answered)
    assert all(stored[r.task.id] == ("streamed", r.task.payload) for r in results)


async def test_a_stream_with_a_bad_key_fails_its_submits_as_unauthenticated(
    node: SchedulerNode, fresh_db_dsn: str
) -> None:
    async with Client(_address(node), api_key="cs_not_a_key") as client:
        with pytest.raises(UnauthenticatedError):
            async with client.submit_stream() as stream:
                await stream.submit(TaskSpec("t", {}))
    assert _stored(fresh_db_dsn) == {}


async def test_a_stream_whose_node_stops_fails_the_submits_after_it_as_unavailable(
    node: SchedulerNode, fresh_db_dsn: str, key: str
) -> None:
    at = datetime.now(UTC) + LATER
    async with Client(_address(node), api_key=key) as client:
        with pytest.raises(UnavailableError) as broken:
            async with client.submit_stream() as stream:
                first = await stream.submit(TaskSpec("before", {}, at=at))
                await node.stop()
                # Stopping answers or ends every call; what is sent after fails, retryable.
                for _ in range(3):
                    await stream.submit(TaskSpec("after", {}, at=at))
    assert broken.value.retryable
    assert list(_stored(fresh_db_dsn)) == [first.task.id]


async def test_a_message_that_does_not_decode_ends_the_stream_after_the_answers_before_it(
    node: SchedulerNode, fresh_db_dsn: str, key: str
) -> None:
    good = task_service_pb2.SubmitStreamRequest(
        task=task_service_pb2.SubmitTaskRequest(
            type="good", delay=duration_pb2.Duration(seconds=60)
        )
    )
    async with grpc.aio.insecure_channel(_address(node)) as channel:
        call = channel.stream_stream(
            "/chronoshard.v1.TaskService/SubmitStream",
            request_serializer=lambda raw: raw,
            response_deserializer=task_service_pb2.SubmitStreamReply.FromString,
        )(metadata=(("authorization", f"Bearer {key}"),), timeout=20)
        await call.write(good.SerializeToString())
        first = await call.read()
        await call.write(b"\xff\xff\xff")  # not a protobuf message
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
    assert first.WhichOneof("outcome") == "submitted"
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info_from_metadata(ended.value.trailing_metadata())
    assert info is not None and info.reason == "MALFORMED_REQUEST"
    assert list(_stored(fresh_db_dsn)) == [first.submitted.task.id]


async def test_a_submit_unanswered_within_the_clients_deadline_raises_deadline_exceeded() -> None:
    # A server that reads the stream and never answers: the submit must not wait for
    # ever, and says it may have been applied (retryable, as a unary call's deadline).
    async def silent(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for _ in requests:
            pass
        return
        yield  # a generator: it answers nothing

    handler = grpc.method_handlers_generic_handler(
        "chronoshard.v1.TaskService",
        {
            "SubmitStream": grpc.stream_stream_rpc_method_handler(
                silent,
                request_deserializer=task_service_pb2.SubmitStreamRequest.FromString,
                response_serializer=task_service_pb2.SubmitStreamReply.SerializeToString,
            )
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with Client(f"127.0.0.1:{port}", api_key="k", timeout_s=0.5) as client:
            with pytest.raises(DeadlineExceededError) as late:
                async with client.submit_stream() as stream:
                    await stream.submit(TaskSpec("t", {}))
    finally:
        await server.stop(grace=None)
    assert late.value.retryable
    assert "may or may not have been applied" in str(late.value)

"""API keys on WorkerService and AdminService (``chronoshard.scheduler.api.access``), against
one real node in-process: a bad key opens no session and writes nothing, a tenant key
reads the topology but cannot drain, an operator key can; health stays open."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from fixtures.nodes import node_config, running_node
from fixtures.stores import insert_tasks, new_task
from fixtures.waiting import eventually
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness.raw_worker import Metadata, RawWorker, bearer, grant, hello

from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.models import Tenant
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess
from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from chronoshard.wire import error_info_from_metadata

SHARDS = 4
BAD_KEYS: list[Metadata] = [
    (),
    (("authorization", "Bearer cs_not-a-key-anyone-has"),),
    (("authorization", "Basic dXNlcjpwYXNz"),),
]
BAD_KEY_IDS = ["missing", "unknown", "malformed"]


@pytest.fixture
async def node(fresh_db_dsn: str, etcd: EtcdProcess) -> AsyncIterator[SchedulerNode]:
    async with running_node(node_config(fresh_db_dsn, etcd.endpoint, shard_count=SHARDS)) as n:
        yield n


@pytest.fixture
async def channel(node: SchedulerNode) -> AsyncIterator[grpc.aio.Channel]:
    assert node.addresses is not None
    async with grpc.aio.insecure_channel(node.addresses.grpc) as opened:
        yield opened


async def _key(node: SchedulerNode, *, operator: bool = False) -> tuple[Tenant, Metadata]:
    """A new tenant made the way operators make them (``chronoshard tenants create``)."""
    made = await asyncio.to_thread(
        create_tenant, node.config.database.dsn, f"t-{uuid.uuid4().hex}", operator=operator
    )
    assert made.tenant.operator is operator
    return made.tenant, bearer(made.api_key)


async def _refused(call: object, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, info.value.details()
    error = error_info_from_metadata(info.value.trailing_metadata())
    assert error is not None and error.code == code.name
    return error.reason


@pytest.mark.parametrize("metadata", BAD_KEYS, ids=BAD_KEY_IDS)
async def test_a_worker_without_a_valid_key_opens_no_session(
    node: SchedulerNode, channel: grpc.aio.Channel, metadata: Metadata
) -> None:
    # As the SDK does: Hello, then nothing until Welcome.
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async with RawWorker.connect(
            channel, metadata, hello("intruder", ["anything"], slots=1)
        ) as worker:
            async for _ in worker:
                pass
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert node.sessions.live() == []


async def test_a_settlement_with_a_bad_key_writes_nothing(
    node: SchedulerNode, channel: grpc.aio.Channel
) -> None:
    await eventually(lambda: len(node.shards.epochs()) == SHARDS, timeout_s=10, what="shards")
    tenant, auth = await _key(node)
    task_id = new_task_id()
    [inserted] = await insert_tasks(
        node.store,
        tenant.id,
        [
            new_task(
                id=task_id,
                type="guarded",
                due_in_s=0.1,
                shard=shard_of(task_id, SHARDS),
                payload={},
            )
        ],
    )
    node.preloader.wake()
    async with RawWorker.connect(
        channel, auth, hello("w-good", ["guarded"], slots=1), grant(1)
    ) as worker:
        async with asyncio.timeout(20):
            async for message in worker:
                if message.WhichOneof("message") == "assignment":
                    assignment = message.assignment
                    break
        stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
        request = worker_service_pb2.CompleteRequest(
            worker_id="w-good",
            complete=worker_service_pb2.Complete(
                task=assignment.task,
                fencing_token=assignment.fencing_token,
                result_json=b'{"by": "intruder"}',
            ),
        )
        for bad in BAD_KEYS:
            reason = await _refused(
                stub.Complete(request, timeout=5, metadata=bad), grpc.StatusCode.UNAUTHENTICATED
            )
            assert reason == "UNAUTHENTICATED"
        task = await node.store.get_task(tenant.id, inserted.task.id)
        assert (
            task is not None and task.status.value == "DISPATCHED" and task.result_payload is None
        )

        # The same request with a valid key goes through: the refusal was the key alone.
        await stub.Complete(request, timeout=5, metadata=auth)
        task = await node.store.get_task(tenant.id, inserted.task.id)
        assert task is not None and task.status.value == "COMPLETED"


@pytest.mark.parametrize("metadata", BAD_KEYS, ids=BAD_KEY_IDS)
async def test_admin_calls_need_a_key(channel: grpc.aio.Channel, metadata: Metadata) -> None:
    stub = admin_service_pb2_grpc.AdminServiceStub(channel)
    for call in (
        stub.GetTopology(admin_service_pb2.GetTopologyRequest(), timeout=5, metadata=metadata),
        stub.ListShards(admin_service_pb2.ListShardsRequest(), timeout=5, metadata=metadata),
        stub.DrainNode(admin_service_pb2.DrainNodeRequest(), timeout=5, metadata=metadata),
    ):
        assert await _refused(call, grpc.StatusCode.UNAUTHENTICATED) == "UNAUTHENTICATED"


async def test_draining_needs_an_operator_key(
    node: SchedulerNode, channel: grpc.aio.Channel
) -> None:
    stub = admin_service_pb2_grpc.AdminServiceStub(channel)
    _, tenant_auth = await _key(node)
    topology = await stub.GetTopology(
        admin_service_pb2.GetTopologyRequest(), timeout=5, metadata=tenant_auth
    )
    assert [n.node_id for n in topology.nodes] == [node.config.node_id]

    reason = await _refused(
        stub.DrainNode(admin_service_pb2.DrainNodeRequest(), timeout=5, metadata=tenant_auth),
        grpc.StatusCode.PERMISSION_DENIED,
    )
    assert reason == "PERMISSION_DENIED"
    topology = await stub.GetTopology(
        admin_service_pb2.GetTopologyRequest(), timeout=5, metadata=tenant_auth
    )
    assert not topology.nodes[0].draining

    _, operator_auth = await _key(node, operator=True)
    drained = await stub.DrainNode(
        admin_service_pb2.DrainNodeRequest(), timeout=10, metadata=operator_auth
    )
    assert drained.node.draining


async def test_health_needs_no_key(channel: grpc.aio.Channel) -> None:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), timeout=5
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING

"""AdminService answers through the node's one error boundary, against one real node
in-process (real gRPC, PostgreSQL, etcd): a node id naming no live node is NOT_FOUND on
``node_id`` with a bounded message, etcd away is UNAVAILABLE and retryable, and a bug is
INTERNAL with a generic message and the traceback in the node's log, never grpc's
UNKNOWN with the exception's text. Bad input in general (raw bytes, drawn messages,
oversized fields) is fuzzed in ``test_api_fuzz.py``."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from fixtures.nodes import node_config, running_node

from chronoshard.scheduler.api.boundary import INTERNAL_MESSAGE
from chronoshard.scheduler.cluster.coordination import CoordinationError, EtcdCoordinator
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess
from chronoshard.v1 import admin_service_pb2, admin_service_pb2_grpc, common_pb2
from chronoshard.wire import error_info_from_metadata

Metadata = tuple[tuple[str, str], ...]


@pytest.fixture
async def node(fresh_db_dsn: str, etcd: EtcdProcess) -> AsyncIterator[SchedulerNode]:
    async with running_node(node_config(fresh_db_dsn, etcd.endpoint, shard_count=2)) as started:
        yield started


@pytest.fixture
async def admin(node: SchedulerNode) -> AsyncIterator[admin_service_pb2_grpc.AdminServiceStub]:
    assert node.addresses is not None
    async with grpc.aio.insecure_channel(node.addresses.grpc) as channel:
        yield admin_service_pb2_grpc.AdminServiceStub(channel)


async def _operator(node: SchedulerNode) -> Metadata:
    made = await asyncio.to_thread(
        create_tenant, node.config.database.dsn, f"op-{uuid.uuid4().hex}", operator=True
    )
    return (("authorization", f"Bearer {made.api_key}"),)


async def _refusal(call: object) -> tuple[grpc.StatusCode, str, common_pb2.ErrorInfo]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    info = error_info_from_metadata(raised.value.trailing_metadata())
    assert info is not None, raised.value.details()
    assert info.code == raised.value.code().name and info.message == raised.value.details()
    return raised.value.code(), raised.value.details() or "", info


async def test_a_node_id_naming_no_live_node_is_not_found_on_the_field(
    node: SchedulerNode, admin: admin_service_pb2_grpc.AdminServiceStub
) -> None:
    auth = await _operator(node)
    unknown = "x" * 100_000
    for call in (
        admin.DrainNode(admin_service_pb2.DrainNodeRequest(node_id=unknown), metadata=auth),
        admin.UndrainNode(admin_service_pb2.UndrainNodeRequest(node_id=unknown), metadata=auth),
    ):
        code, message, info = await _refusal(call)
        assert code is grpc.StatusCode.NOT_FOUND
        assert (info.reason, info.field, info.retryable) == ("NODE_NOT_FOUND", "node_id", False)
        assert message.startswith("no live node 'xxxx") and len(message) < 200
    topology = await admin.GetTopology(
        admin_service_pb2.GetTopologyRequest(), timeout=5, metadata=auth
    )
    assert not topology.nodes[0].draining  # nothing was done


async def test_etcd_away_is_unavailable_and_retryable(
    node: SchedulerNode,
    admin: admin_service_pb2_grpc.AdminServiceStub,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only AdminService reads the claims this way; the node's own loops watch them.
    async def unreachable(self: EtcdCoordinator) -> None:
        raise CoordinationError("etcd unreachable: connection refused")

    auth = await _operator(node)
    monkeypatch.setattr(EtcdCoordinator, "shard_claims", unreachable)
    for call in (
        admin.GetTopology(admin_service_pb2.GetTopologyRequest(), metadata=auth),
        admin.ListShards(admin_service_pb2.ListShardsRequest(), metadata=auth),
    ):
        code, message, info = await _refusal(call)
        assert code is grpc.StatusCode.UNAVAILABLE
        assert (info.reason, info.retryable) == ("COORDINATION_UNAVAILABLE", True)
        assert "etcd unreachable" in message


async def test_a_bug_is_internal_with_a_generic_message_never_unknown(
    node: SchedulerNode,
    admin: admin_service_pb2_grpc.AdminServiceStub,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(self: EtcdCoordinator) -> None:
        raise KeyError("secret internal detail")

    auth = await _operator(node)
    monkeypatch.setattr(EtcdCoordinator, "shard_claims", broken)
    with caplog.at_level(logging.ERROR, logger="chronoshard.scheduler.api.boundary"):
        for name, call in (
            (
                "GetTopology",
                admin.GetTopology(admin_service_pb2.GetTopologyRequest(), metadata=auth),
            ),
            ("ListShards", admin.ListShards(admin_service_pb2.ListShardsRequest(), metadata=auth)),
        ):
            code, message, info = await _refusal(call)
            assert code is grpc.StatusCode.INTERNAL, message
            assert message == INTERNAL_MESSAGE and "secret" not in message
            assert info.reason == "INTERNAL"
            logged = [r for r in caplog.records if r.getMessage() == f"AdminService.{name} failed"]
            assert logged and logged[-1].exc_info is not None

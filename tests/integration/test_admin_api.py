"""AdminService against real nodes in-process (real gRPC, PostgreSQL, etcd).

Its one error boundary: a node id naming no live node is NOT_FOUND on ``node_id`` with a
bounded message, etcd away is UNAVAILABLE and retryable, and a bug is INTERNAL with a
generic message and the traceback in the node's log, never grpc's UNKNOWN with the
exception's text. Who sees what: a tenant's key gets the nodes only from GetTopology
and PERMISSION_DENIED from ListShards; ListWorkerSessions lists, on two nodes with SDK
workers of two tenants, each tenant's own workers' sessions per node (every session for
an operator), the answering node's figures live, in pages, and refuses a bad filter or
token on its field. Bad input in general (raw bytes, drawn messages, oversized fields)
is fuzzed in ``test_api_fuzz.py``."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from fixtures.nodes import node_config, running_node
from fixtures.rows import session_report, sql
from fixtures.waiting import eventually

from chronoshard import Client
from chronoshard.scheduler.api.boundary import INTERNAL_MESSAGE
from chronoshard.scheduler.cluster.coordination import CoordinationError, EtcdCoordinator
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.scheduler.store.sessions import WorkerSessionStore
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess
from chronoshard.v1 import admin_service_pb2, admin_service_pb2_grpc, common_pb2
from chronoshard.wire import error_info_from_metadata
from chronoshard.worker import TaskContext, Worker

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


# --- the cluster views are an operator's -----------------------------------------------------


async def _tenant(node: SchedulerNode, prefix: str = "t") -> tuple[str, Metadata]:
    made = await asyncio.to_thread(
        create_tenant, node.config.database.dsn, f"{prefix}-{uuid.uuid4().hex[:8]}"
    )
    return made.api_key, (("authorization", f"Bearer {made.api_key}"),)


async def test_a_tenant_key_gets_the_nodes_only_and_an_operator_the_whole_topology(
    node: SchedulerNode, admin: admin_service_pb2_grpc.AdminServiceStub
) -> None:
    _, tenant = await _tenant(node)
    operator = await _operator(node)
    await eventually(lambda: len(node.shards.epochs()) == 2, timeout_s=10, what="shards claimed")
    full = await admin.GetTopology(admin_service_pb2.GetTopologyRequest(), metadata=operator)
    assert not full.restricted and full.shard_count == 2 and len(full.shards) == 2
    [whole] = full.nodes
    assert whole.metrics_address and sorted(whole.shards) == [0, 1]

    seen = await admin.GetTopology(admin_service_pb2.GetTopologyRequest(), metadata=tenant)
    assert seen.restricted and seen.node_id == node.config.node_id
    # What a worker needs to reach the node, nothing of the shard map or the metrics.
    [only] = seen.nodes
    assert (only.node_id, only.address) == (whole.node_id, whole.address)
    assert only.HasField("started_at") and not only.draining
    assert (only.metrics_address, list(only.shards), list(seen.shards), seen.shard_count) == (
        "",
        [],
        [],
        0,
    )

    code, message, info = await _refusal(
        admin.ListShards(admin_service_pb2.ListShardsRequest(), metadata=tenant)
    )
    assert code is grpc.StatusCode.PERMISSION_DENIED and info.reason == "PERMISSION_DENIED"
    assert message == (
        "ListShards needs an operator API key (chronoshard tenants create NAME --operator)"
    )
    shards = await admin.ListShards(admin_service_pb2.ListShardsRequest(), metadata=operator)
    assert len(shards.shards) == 2


# --- worker sessions ------------------------------------------------------------------------


@pytest.fixture
async def two_nodes(
    fresh_db_dsn: str, etcd: EtcdProcess
) -> AsyncIterator[tuple[SchedulerNode, SchedulerNode]]:
    """Two nodes of one cluster (same etcd prefix, same database)."""
    first = node_config(fresh_db_dsn, etcd.endpoint, shard_count=2)
    second = replace(first, node_id=f"{first.node_id}-b")
    async with running_node(first) as a, running_node(second) as b:
        yield a, b


def _worker(address: str, key: str, worker_id: str, queue: str) -> Worker:
    """An SDK worker given one node's address: it finds the others by GetTopology."""
    return Worker([address], api_key=key, worker_id=worker_id, slots=3, queues=[queue])


async def _sessions(
    admin: admin_service_pb2_grpc.AdminServiceStub, auth: Metadata, **fields: Any
) -> admin_service_pb2.ListWorkerSessionsResponse:
    request = admin_service_pb2.ListWorkerSessionsRequest(**fields)
    return await admin.ListWorkerSessions(request, metadata=auth, timeout=5)


async def test_worker_sessions_are_listed_per_node_and_each_tenant_sees_its_own_workers(
    two_nodes: tuple[SchedulerNode, SchedulerNode],
) -> None:
    a, b = two_nodes
    assert a.addresses is not None and b.addresses is not None
    key_a, auth_a = await _tenant(a, "a")
    key_b, auth_b = await _tenant(a, "b")
    operator = await _operator(a)
    release = asyncio.Event()
    worker_a = _worker(a.addresses.grpc, key_a, "wa", "qa")
    worker_b = _worker(a.addresses.grpc, key_b, "wb", "qb")

    @worker_a.task("sessions.a")
    async def held(ctx: TaskContext) -> None:
        await release.wait()

    @worker_b.task("sessions.b")
    async def never(ctx: TaskContext) -> None:
        raise AssertionError("no sessions.b task is submitted")

    running = [asyncio.create_task(w.run()) for w in (worker_a, worker_b)]
    try:
        async with grpc.aio.insecure_channel(a.addresses.grpc) as channel:
            admin = admin_service_pb2_grpc.AdminServiceStub(channel)

            async def both_workers_on_both_nodes() -> bool:
                listed = await _sessions(admin, operator)
                return len(listed.sessions) == 4

            # Each worker was given node a only and found node b through GetTopology,
            # though its key is a tenant's (restricted: the nodes, no shards).
            await eventually(both_workers_on_both_nodes, timeout_s=20, what="four sessions")
            every = await _sessions(admin, operator)
            assert not every.restricted and every.node_id == a.config.node_id
            assert [(s.worker_id, s.node_id) for s in every.sessions] == sorted(
                (w, n) for w in ("wa", "wb") for n in (a.config.node_id, b.config.node_id)
            )
            tenant_a_name = every.sessions[0].tenant_name
            assert tenant_a_name.startswith("a-") and every.sessions[2].tenant_name.startswith("b-")

            mine = await _sessions(admin, auth_a)
            assert mine.restricted
            assert [(s.worker_id, s.node_id) for s in mine.sessions] == [
                ("wa", a.config.node_id),
                ("wa", b.config.node_id),
            ]
            on_a, on_b = mine.sessions
            for session, node in ((on_a, a), (on_b, b)):
                assert session.session_id.startswith(node.config.node_id + "/")
                assert (session.tenant_name, list(session.queues), list(session.task_types)) == (
                    tenant_a_name,
                    ["qa"],
                    ["sessions.a"],
                )
                assert session.slots == 3 and session.running == 0 and not session.draining
                assert session.connected_at.ToDatetime() <= session.reported_at.ToDatetime()
            assert on_a.tenant_id == every.sessions[0].tenant_id
            theirs = await _sessions(admin, auth_b)
            assert [s.worker_id for s in theirs.sessions] == ["wb", "wb"]
            # Filters: another tenant's worker is not found by its id either.
            assert (await _sessions(admin, auth_a, worker_id="wb")).sessions == []
            only_b = await _sessions(admin, operator, node_id=b.config.node_id)
            assert {s.node_id for s in only_b.sessions} == {b.config.node_id}

            # One of wa's tasks runs; the answering node's figures are its live ones.
            async with Client(a.addresses.grpc, api_key=key_a) as client:
                await client.submit("sessions.a", queue="qa", strict_timing=True)

            async def one_running() -> int:
                listed = await _sessions(admin, auth_a)
                return sum(s.running for s in listed.sessions)

            await eventually(one_running, timeout_s=10, what="the task running")
            release.set()

            # Pages of one, in order, then no token.
            pages, token = [], ""
            while True:
                page = await _sessions(admin, operator, page_size=1, page_token=token)
                pages += [(s.worker_id, s.node_id) for s in page.sessions]
                token = page.next_page_token
                if not token:
                    break
            assert pages == [(s.worker_id, s.node_id) for s in every.sessions]

            # A worker that stops is listed no more (its streams closed).
            worker_b.stop()
            await asyncio.wait_for(running.pop(), timeout=10)

            async def only_wa_left() -> bool:
                listed = await _sessions(admin, operator)
                return {s.worker_id for s in listed.sessions} == {"wa"}

            await eventually(only_wa_left, timeout_s=10, what="wb's sessions closed")
            assert (await _sessions(admin, auth_b)).sessions == []
    finally:
        release.set()
        for worker in (worker_a, worker_b):
            worker.stop()
        await asyncio.wait_for(asyncio.gather(*running), timeout=10)


async def test_a_dead_nodes_records_are_not_listed_and_another_nodes_are_as_recorded(
    node: SchedulerNode, admin: admin_service_pb2_grpc.AdminServiceStub
) -> None:
    operator = await _operator(node)
    records = WorkerSessionStore(node.store)
    await records.touch_worker_sessions(
        "node-elsewhere", [session_report("w1", credits=2, running=1, slots=4)]
    )
    await records.touch_worker_sessions("node-dead", [session_report("w2")])
    await sql(
        node.config.database.dsn,
        "UPDATE worker_sessions SET last_seen_at = now() - make_interval(secs => %s)"
        " WHERE node_id = 'node-dead'",
        (node.config.workers.session_timeout_s + 1,),
    )
    listed = await _sessions(admin, operator)
    [elsewhere] = listed.sessions
    assert (elsewhere.worker_id, elsewhere.node_id) == ("w1", "node-elsewhere")
    # No tenant's key opened it (None recorded): an operator's listing shows it, no tenant's.
    assert (elsewhere.tenant_id, elsewhere.slots, elsewhere.credits, elsewhere.running) == (
        "",
        4,
        2,
        1,
    )
    _, tenant = await _tenant(node)
    assert (await _sessions(admin, tenant)).sessions == []


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"worker_id": "w" * 201}, "worker_id", "must be at most 200 characters"),
        ({"worker_id": "w\x07"}, "worker_id", "must not contain control characters"),
        ({"node_id": "n" * 100_000}, "node_id", "must be at most 200 characters"),
        ({"page_token": "!!"}, "page_token", "not a token this server issued"),
        ({"page_token": "bm90IGpzb24"}, "page_token", "not a token this server issued"),
        ({"page_token": "x" * 5000}, "page_token", "not a token this server issued"),
    ],
)
async def test_a_bad_worker_sessions_request_is_refused_on_its_field(
    node: SchedulerNode,
    admin: admin_service_pb2_grpc.AdminServiceStub,
    fields: dict[str, Any],
    field: str,
    says: str,
) -> None:
    _, tenant = await _tenant(node)
    code, message, info = await _refusal(_sessions(admin, tenant, **fields))
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.field) == ("INVALID_ARGUMENT", field)
    assert message == f"{field}: {says}"


async def test_worker_sessions_need_a_key(admin: admin_service_pb2_grpc.AdminServiceStub) -> None:
    code, _, info = await _refusal(_sessions(admin, ()))
    assert code is grpc.StatusCode.UNAUTHENTICATED and info.reason == "UNAUTHENTICATED"

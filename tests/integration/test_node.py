"""One scheduler node in-process against real PostgreSQL and etcd, driven by a worker
that speaks the raw protocol (so what is asserted is the node's side of the protocol)."""

from __future__ import annotations

import asyncio
import urllib.request
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.etcd import EtcdFactory
from fixtures.nodes import node_config, running_node
from fixtures.stores import insert_tasks, new_task, new_tenant, tenant_with_key
from fixtures.waiting import eventually
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness.raw_worker import Metadata, RawWorker, ack, bearer, complete, grant, hello, recall
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chronoshard.scheduler.api.server import CLOCK_HEALTH_SERVICE
from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.scheduler.store.database import Store
from chronoshard.services import EtcdProcess
from chronoshard.v1 import (
    admin_service_pb2,
    admin_service_pb2_grpc,
    common_pb2,
    worker_service_pb2,
    worker_service_pb2_grpc,
)

SHARDS = 8


@pytest.fixture
async def node(fresh_db_dsn: str, etcd: EtcdProcess) -> AsyncIterator[SchedulerNode]:
    async with running_node(node_config(fresh_db_dsn, etcd.endpoint, shard_count=SHARDS)) as n:
        yield n


async def _auth(store: Store) -> Metadata:
    """Call metadata with the API key of a new tenant: worker and admin calls need one."""
    _, key = await tenant_with_key(store, rate_limit_rps=1000.0, max_concurrent_workers=100)
    return bearer(key)


async def _wait_for_shards(node: SchedulerNode) -> None:
    await eventually(
        lambda: len(node.shards.epochs()) == SHARDS, timeout_s=10, what="all shards claimed"
    )


@asynccontextmanager
async def _connected(
    node: SchedulerNode, *first: worker_service_pb2.WorkerMessage
) -> AsyncIterator[RawWorker]:
    """A raw worker on a channel of its own to ``node``, with a new tenant's key."""
    assert node.addresses is not None
    auth = await _auth(node.store)
    async with (
        grpc.aio.insecure_channel(node.addresses.grpc) as channel,
        RawWorker.connect(channel, auth, *first) as worker,
    ):
        yield worker


async def test_tasks_fire_and_complete_through_a_raw_worker(node: SchedulerNode) -> None:
    await _wait_for_shards(node)
    tenant = await new_tenant(node.store, rate_limit_rps=1000.0, max_concurrent_workers=100)
    news = []
    for i in range(20):
        task_id = new_task_id()
        news.append(
            new_task(
                id=task_id,
                type="echo",
                due_in_s=0.2 + 0.02 * i,
                shard=shard_of(task_id, SHARDS),
                payload={"i": i},
                job_id="echo-job",
            )
        )
    await insert_tasks(node.store, tenant.id, news)
    node.preloader.wake()

    assert node.addresses is not None
    auth = await _auth(node.store)
    async with grpc.aio.insecure_channel(node.addresses.grpc) as channel:
        topology = await admin_service_pb2_grpc.AdminServiceStub(channel).GetTopology(
            admin_service_pb2.GetTopologyRequest(), timeout=5, metadata=auth
        )
        assert [n.node_id for n in topology.nodes] == [node.config.node_id]
        # A tenant's key: the nodes a worker needs; the shard map is an operator's.
        assert topology.restricted and list(topology.shards) == []

        completed: set[str] = set()
        started_late: list[float] = []
        async with (
            RawWorker.connect(channel, auth, hello("raw-1", ["echo"], slots=4), grant(4)) as worker,
            asyncio.timeout(30),
        ):
            async for message in worker:
                kind = message.WhichOneof("message")
                if kind == "assignment":
                    a = message.assignment
                    started_late.append(
                        (datetime.now(UTC) - a.due_at.ToDatetime(tzinfo=UTC)).total_seconds()
                    )
                    # Stamped with the node's cluster clock: this host's, here, closely.
                    sent_s = (datetime.now(UTC) - a.sent_at.ToDatetime(tzinfo=UTC)).total_seconds()
                    assert a.HasField("sent_at") and 0 <= sent_s < 1, sent_s
                    worker.send(ack(a), complete(a, result_json=a.payload_json))
                elif (
                    kind == "receipt"
                    and message.receipt.kind == worker_service_pb2.SETTLEMENT_KIND_COMPLETE
                ):
                    assert not message.receipt.HasField("error")
                    completed.add(message.receipt.task.id)
                    worker.send(grant(1))
                    if len(completed) == len(news):
                        break
    assert completed == {str(n.id) for n in news}
    for new in news:
        task = await node.store.get_task(tenant.id, new.id)
        assert task is not None and task.status.value == "COMPLETED"
        assert task.attempt == 1 and task.fencing_token == 1
    # Lead dispatch sends at most lead_dispatch_s (plus the gathering window) early.
    scheduling = node.config.scheduling
    assert min(started_late) >= -scheduling.lead_dispatch_s - scheduling.dispatch_gather_s - 0.05
    # Every component's stats reach /metrics, and they counted this work.
    exported = await _scrape(node)
    assert exported["chronoshard_dispatcher_dispatched"] == ("counter", len(news))
    assert exported["chronoshard_wheel_expired"] == ("counter", len(news))
    # A task is selected for each round that carries it: once, unless a round gave it
    # back unwritten (its tenant's dispatch allowance ran short) to be selected again.
    # Either way every task pushed to the ready queues was selected and none waits.
    assert exported["chronoshard_ready_selected"] == exported["chronoshard_ready_pushed"]
    assert exported["chronoshard_ready_selected"][1] >= len(news)
    assert exported["chronoshard_ready_removed"] == ("counter", 0)
    assert exported["chronoshard_gateway_assignments_sent"] == ("counter", len(news))
    assert exported['chronoshard_group_commit_requests{committer="complete"}'] == (
        "counter",
        len(news),
    )
    assert exported["chronoshard_wheel_timers"] == ("gauge", 0)
    assert exported["chronoshard_shards_owned"] == ("gauge", SHARDS)


async def test_every_component_stat_is_exported_once_with_its_type(node: SchedulerNode) -> None:
    exported = await _scrape(node)
    for family in node._stats_families():
        labels = "".join(f'{{{k}="{v}"}}' for k, v in family.labels.items())
        for key in family.source.get_stats():
            kind = "gauge" if key in family.source.STATS_GAUGES else "counter"
            name = f"chronoshard_{family.name}_{key}{labels}"
            assert exported.get(name, ("missing",))[0] == kind, name


async def _scrape(node: SchedulerNode) -> dict[str, tuple[str, float]]:
    """``name{labels but node}`` -> (type, value) of the node's /metrics text, parsed by
    Prometheus's own parser (which refuses a name exported twice). Off the loop: the node
    answers the scrape on it."""
    assert node.addresses is not None
    url = f"http://{node.addresses.metrics}/metrics"

    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.read().decode()

    text = await asyncio.to_thread(fetch)
    exported: dict[str, tuple[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.type == "counter" and not sample.name.endswith("_total"):
                continue  # the _created sample
            labels = "".join(f'{{{k}="{v}"}}' for k, v in sample.labels.items() if k != "node")
            # A counter by its family's name; a histogram's samples by their own
            # (_bucket, _count, _sum share the family's labels).
            name = (family.name if family.type == "counter" else sample.name) + labels
            assert name not in exported, f"{name} exported twice"
            exported[name] = (family.type, sample.value)
    return exported


async def test_the_clock_is_measured_and_reported_in_bound(node: SchedulerNode) -> None:
    """PostgreSQL runs on this host: the measured offset is tiny, the node is trusted, its
    clock health service says SERVING, and the gauges are exported."""
    assert node.clock.get_stats()["samples"] >= 1
    assert not node.clock.skewed
    assert abs(node.clock.offset_s) < 0.05 and node.clock.error_s < 0.05
    assert abs((node.clock.now() - datetime.now(UTC)).total_seconds()) < 0.05
    assert node.addresses is not None
    async with grpc.aio.insecure_channel(node.addresses.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(
            health_pb2.HealthCheckRequest(service=CLOCK_HEALTH_SERVICE), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    scrape = generate_latest(node.metrics.registry).decode()
    for gauge in ("chronoshard_clock_offset_seconds", "chronoshard_clock_skewed"):
        assert f"{gauge}{{node=" in scrape, gauge
    assert f'chronoshard_clock_skewed{{node="{node.config.node_id}"}} 0.0' in scrape


async def test_stale_unary_completion_is_failed_precondition(node: SchedulerNode) -> None:
    assert node.addresses is not None
    auth = await _auth(node.store)
    async with grpc.aio.insecure_channel(node.addresses.grpc) as channel:
        stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
        ref = common_pb2.TaskRef(id=str(uuid.uuid4()))
        ref.scheduled_at.FromDatetime(datetime.now(UTC))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Complete(
                worker_service_pb2.CompleteRequest(
                    worker_id="w", complete=worker_service_pb2.Complete(task=ref, fencing_token=1)
                ),
                timeout=5,
                metadata=auth,
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_credit_recall_returns_exactly_the_unused_credits(node: SchedulerNode) -> None:
    assert node.addresses is not None
    auth = await _auth(node.store)
    returned: list[int] = []
    async with (
        grpc.aio.insecure_channel(node.addresses.grpc) as channel,
        RawWorker.connect(
            channel, auth, hello("raw-2", ["none"], slots=5), grant(5), recall(3), recall(9)
        ) as worker,
        asyncio.timeout(10),
    ):
        async for message in worker:
            if message.WhichOneof("message") == "credit_return":
                returned.append(message.credit_return.credits)
                if len(returned) == 2:
                    break
    # Nothing was assigned (no task of type "none"): 3 back, then the remaining 2.
    assert returned == [3, 2]


async def test_a_worker_batch_is_read_as_its_messages_in_order(node: SchedulerNode) -> None:
    greeting = hello("raw-3", ["none"], slots=5, accepts_batches=True)
    batch = worker_service_pb2.WorkerMessage(
        batch=worker_service_pb2.WorkerBatch(
            messages=[
                grant(5),
                greeting,  # never valid inside a batch: skipped, the rest still read
                recall(3),
                recall(9),
            ]
        )
    )
    returned: list[int] = []
    welcome: Any = None
    async with _connected(node, greeting, batch) as worker, asyncio.timeout(10):
        async for message in worker:
            kind = message.WhichOneof("message")
            inner = list(message.batch.messages) if kind == "batch" else [message]
            for item in inner:
                if item.WhichOneof("message") == "welcome":
                    welcome = item.welcome
                elif item.WhichOneof("message") == "credit_return":
                    returned.append(item.credit_return.credits)
            if len(returned) == 2:
                break
    assert welcome is not None and welcome.accepts_batches
    assert returned == [3, 2]


@pytest.mark.parametrize("slots", [0, 100_001])
async def test_a_hello_with_slots_out_of_range_is_rejected(node: SchedulerNode, slots: int) -> None:
    async with (
        _connected(node, hello("raw-4", ["none"], slots=slots)) as worker,
        asyncio.timeout(10),
    ):
        first = await worker.read()
    assert first.WhichOneof("message") == "reject"
    assert first.reject.error.field == "hello.slots"
    assert node.sessions.live() == []


async def test_a_worker_that_goes_away_leaves_no_task_of_its_session_behind(
    node: SchedulerNode,
) -> None:
    # The stream's handler waited on the session's outbox when the worker cancelled the
    # call; the outbox get it left pending was destroyed with the session later, and the
    # node logged "Task was destroyed but it is pending" (issue 12, item 10).
    async with _connected(node, hello("raw-5", ["none"], slots=1)) as worker, asyncio.timeout(10):
        first = await worker.read()
        assert first.WhichOneof("message") == "welcome"
        worker.close()
    await eventually(lambda: node.sessions.live() == [], timeout_s=10, what="session closed")

    def outbox_gets() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if "Queue.get" in repr(t.get_coro())]

    await eventually(lambda: not outbox_gets(), timeout_s=5, what="no outbox get left pending")


async def test_a_fresh_etcd_hands_out_epochs_above_every_recorded_one(
    fresh_db_dsn: str, etcd: EtcdProcess, etcd_factory: EtcdFactory
) -> None:
    """A new etcd (a disaster recovery, a lost etcd rebuilt) restarts its revisions at 1;
    the database still holds the old, higher epochs. Claims must rise above them instead
    of being refused as going backwards (which left every shard unowned)."""
    shared = node_config(fresh_db_dsn, etcd.endpoint, shard_count=SHARDS)
    async with running_node(shared) as before:
        await _wait_for_shards(before)
    # The old etcd served a long history: its epochs are far above the few revisions a
    # fresh one will have reached by its first claims.
    await _execute(fresh_db_dsn, "UPDATE shard_owners SET epoch = epoch + 100000")
    highest = max((await _recorded_epochs(fresh_db_dsn)).values())
    fresh = etcd_factory()
    config = replace(shared, etcd=replace(shared.etcd, endpoints=(fresh.endpoint,)))
    async with running_node(config) as after:
        await _wait_for_shards(after)
        epochs = dict(after.shards.epochs())
        assert min(epochs.values()) > highest, (epochs, highest)
        # And the rows moved forward: what the fence reads is the new owner's epoch.
        assert await _recorded_epochs(fresh_db_dsn) == epochs


async def _recorded_epochs(dsn: str) -> dict[int, int]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT shard, epoch FROM shard_owners")
        return {int(shard): int(epoch) for shard, epoch in await cur.fetchall()}


async def _execute(dsn: str, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(statement)

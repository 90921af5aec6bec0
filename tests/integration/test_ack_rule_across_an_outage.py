"""The reconciler's "never delivered" rule across a PostgreSQL restart, with a real node.

A DISPATCHED row untouched for ``workers.ack_timeout_s`` whose worker's session here does
not know the attempt is given back and dispatched again, even a non-idempotent one
(docs/architecture.md#d8): a worker that held it would have acknowledged or heartbeated
it by then. While PostgreSQL is down no ack or heartbeat lands, so that reasoning holds
only for time the database was steady. Here a raw worker gets a non-idempotent task,
PostgreSQL is stopped (immediate mode), the worker's ack fails, and its stream is
replaced by a new one (a reconnect: the new session does not know the attempt) that
stays open through an outage longer than the ack timeout. Before the rule counted only
the steady time, the first pass after PostgreSQL came back gave the attempt up and the
task would have run twice (the doubled effect of ``test_postgres_restart.py`` in CI).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from fixtures.nodes import node_config, running_node
from fixtures.stores import insert_tasks, new_task, tenant_with_key
from fixtures.waiting import eventually
from harness.outage import RestartablePostgres, migrated_postgres
from harness.raw_worker import RawWorker, ack, bearer, complete, grant, heartbeat, hello

from chronoshard.scheduler.core.ids import new_task_id
from chronoshard.scheduler.core.sharding import shard_of
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.services import EtcdProcess
from chronoshard.v1 import worker_service_pb2

SHARDS = 4
ACK_TIMEOUT_S = 4.0
# Longer than the ack timeout: the new stream is old enough to vouch ("never got it").
OUTAGE_S = ACK_TIMEOUT_S + 1.5
WORKER_ID = "raw-outage"


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[RestartablePostgres]:
    with migrated_postgres(tmp_path / "postgres-control.log") as server:
        yield server


@pytest.fixture
async def node(postgres: RestartablePostgres, etcd: EtcdProcess) -> AsyncIterator[SchedulerNode]:
    config = node_config(postgres.dsn_for("chronoshard"), etcd.endpoint, shard_count=SHARDS)
    config = replace(
        config,
        workers=replace(config.workers, ack_timeout_s=ACK_TIMEOUT_S),
        reconcile=replace(config.reconcile, interval_s=0.5),
    )
    async with running_node(config) as n:
        yield n


async def _next(worker: RawWorker, kind: str) -> worker_service_pb2.SchedulerMessage:
    async with asyncio.timeout(15):
        while True:
            message = await worker.read()
            assert message is not grpc.aio.EOF, f"the stream ended waiting for {kind}"
            if message.WhichOneof("message") == kind:
                return message


def _good_passes(node: SchedulerNode) -> int:
    """Reconcile passes that did not fail, at most one too many (a pass counts when it
    starts, its failure when it fails)."""
    stats = node.reconciler.get_stats()
    return stats["passes"] - stats["store_errors"]


async def test_an_attempt_whose_ack_was_lost_in_an_outage_is_not_given_back(
    node: SchedulerNode, postgres: RestartablePostgres
) -> None:
    await eventually(
        lambda: len(node.shards.epochs()) == SHARDS, timeout_s=15, what="all shards claimed"
    )
    tenant, key = await tenant_with_key(node.store)
    task_id = new_task_id()
    assert node.addresses is not None
    async with grpc.aio.insecure_channel(node.addresses.grpc) as channel:
        async with RawWorker.connect(
            channel, bearer(key), hello(WORKER_ID, ["t"], slots=1), grant(1)
        ) as first:
            await insert_tasks(
                node.store,
                tenant.id,
                [new_task(id=task_id, shard=shard_of(task_id, SHARDS), idempotent=False)],
            )
            node.preloader.wake()
            assignment = (await _next(first, "assignment")).assignment
            await asyncio.to_thread(postgres.stop)
            first.send(ack(assignment))
            receipt = (await _next(first, "receipt")).receipt
            assert receipt.HasField("error"), "the ack could not be recorded"
        # The worker reconnects (it still runs the attempt) and grants nothing more.
        async with RawWorker.connect(
            channel, bearer(key), hello(WORKER_ID, ["t"], slots=1)
        ) as again:
            await _next(again, "welcome")
            await asyncio.sleep(OUTAGE_S)  # the outage itself, longer than the ack timeout
            await asyncio.to_thread(postgres.start)
            before = _good_passes(node)
            await eventually(
                lambda: _good_passes(node) >= before + 2,
                timeout_s=ACK_TIMEOUT_S - 1,
                what="a reconcile pass with PostgreSQL back",
                interval_s=0.05,
            )
            assert node.reconciler.get_stats()["abandoned_unacknowledged"] == 0
            # What the worker SDK does next: it heartbeats the attempt and settles it.
            again.send(heartbeat(assignment), complete(assignment))
            receipt = (await _next(again, "receipt")).receipt
            assert not receipt.HasField("error"), receipt.error

    task = await node.store.get_task(tenant.id, task_id)
    assert task is not None and task.status.value == "COMPLETED"
    assert task.attempt == 1 and task.fencing_token == assignment.fencing_token
    assert node.reconciler.get_stats()["abandoned_unacknowledged"] == 0

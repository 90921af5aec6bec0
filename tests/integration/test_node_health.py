"""A node's gRPC health tells the truth, service by service, as its PostgreSQL goes down and
comes back and as its etcd stands still and resumes (docs/operations.md#health-and-probes).

A real node (in this process) against a PostgreSQL of the test's own, stopped in
immediate mode and started again (``harness.outage``), and an etcd of its own, paused
with SIGSTOP past the node's lease. The health service is asked over gRPC, as a
Kubernetes probe would, and the metrics endpoint is scraped as Prometheus would:

* database down: readiness (``""``), the API services and WorkerService turn NOT_SERVING
  within ``health.interval_s + health.database_timeout_s``; liveness and AdminService
  stay SERVING (a restart would not bring the database back); all SERVING again once it
  is back;
* etcd paused past the lease: the node self-fences, and only WorkerService turns
  NOT_SERVING (the API needs no lease); SERVING again once the node holds a lease.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from urllib.request import urlopen

import grpc
import pytest
from fixtures.etcd import EtcdFactory
from fixtures.nodes import node_config, running_node
from fixtures.waiting import eventually
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness.outage import RestartablePostgres, migrated_postgres

from chronoshard.scheduler.config import HealthConfig
from chronoshard.scheduler.core import health
from chronoshard.scheduler.node import SchedulerNode
from chronoshard.services import EtcdProcess

pytestmark = pytest.mark.timeout(120)

HEALTH = HealthConfig(interval_s=0.2, database_timeout_s=1.0)
DETECTION_BOUND_S = HEALTH.interval_s + HEALTH.database_timeout_s + 1.0
"""The documented bound plus 1 s for this busy 2-core machine's scheduling."""
RECOVERY_BOUND_S = 10.0
"""The pool's reconnect (its backoff starts at 1 s) plus a health interval, with margin."""

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
API_AND_DISPATCH = {health.READINESS, *health.API_SERVICES, health.WORKER_SERVICE}


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[RestartablePostgres]:
    with migrated_postgres(tmp_path / "postgres-control.log") as server:
        yield server


@pytest.fixture
def etcd_member(etcd_factory: EtcdFactory) -> EtcdProcess:
    return etcd_factory()


@pytest.fixture
async def node(
    postgres: RestartablePostgres, etcd_member: EtcdProcess
) -> AsyncIterator[SchedulerNode]:
    config = node_config(postgres.dsn_for("chronoshard"), etcd_member.endpoint, shard_count=4)
    async with running_node(replace(config, health=HEALTH)) as started:
        yield started


async def _statuses(address: str) -> dict[str, int]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return {
            name: (await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)).status
            for name in health.SERVICES
        }


def _not_serving(statuses: dict[str, int]) -> set[str]:
    return {name for name, status in statuses.items() if status != SERVING}


async def _scraped(node: SchedulerNode) -> str:
    """The node's /metrics over HTTP, from a thread: the node serves it on this loop."""
    assert node.addresses is not None
    url = f"http://{node.addresses.metrics}/metrics"

    def fetch() -> str:
        with urlopen(url, timeout=5) as reply:
            return str(reply.read().decode())

    return await asyncio.to_thread(fetch)


async def _wait_for(node: SchedulerNode, off: set[str], what: str, timeout_s: float) -> float:
    """Seconds until exactly ``off`` is NOT_SERVING (every other name SERVING)."""
    assert node.addresses is not None
    address = node.addresses.grpc
    started = time.monotonic()
    seen: dict[str, int] = {}

    async def reached() -> bool:
        seen.update(await _statuses(address))
        return _not_serving(seen) == off

    await eventually(reached, timeout_s=timeout_s, interval_s=0.05, what=what)
    return time.monotonic() - started


async def test_database_outage_turns_off_what_needs_it_and_nothing_else(
    node: SchedulerNode, postgres: RestartablePostgres
) -> None:
    assert node.addresses is not None
    assert _not_serving(await _statuses(node.addresses.grpc)) == set()
    node_label = f'node="{node.config.node_id}"'
    assert f"chronoshard_database_up{{{node_label}}} 1.0" in await _scraped(node)

    postgres.stop()
    detected_s = await _wait_for(node, API_AND_DISPATCH, "database down", DETECTION_BOUND_S)
    scrape = await _scraped(node)
    assert f"chronoshard_database_up{{{node_label}}} 0.0" in scrape
    assert f'chronoshard_health_serving{{{node_label},service=""}} 0.0' in scrape
    assert f'chronoshard_health_serving{{{node_label},service="{health.LIVENESS}"}} 1.0' in scrape

    postgres.start()
    recovered_s = await _wait_for(node, set(), "database back", RECOVERY_BOUND_S)
    assert f"chronoshard_database_up{{{node_label}}} 1.0" in await _scraped(node)
    print(f"database down detected in {detected_s:.2f} s, recovery seen in {recovered_s:.2f} s")


async def test_a_self_fenced_node_stops_serving_dispatch_only(
    node: SchedulerNode, etcd_member: EtcdProcess
) -> None:
    etcd = etcd_member
    ttl_s = node.config.etcd.lease_ttl_s
    etcd.pause()
    try:
        # Fenced once the lease is no longer surely alive: TTL − margin after the last
        # renewal, at most TTL after the pause began.
        fenced_s = await _wait_for(
            node, {health.WORKER_SERVICE}, "self-fenced", ttl_s + DETECTION_BOUND_S
        )
        assert node.coordinator.fenced or not node.coordinator.lease_valid(node.clock.monotonic())
    finally:
        etcd.resume()
    # The API kept serving all along; dispatch comes back once the node holds a lease.
    recovered_s = await _wait_for(node, set(), "lease back", 3 * ttl_s + RECOVERY_BOUND_S)
    print(f"self-fence seen in {fenced_s:.2f} s, dispatch health back in {recovered_s:.2f} s")

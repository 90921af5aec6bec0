"""The etcd coordinator against a real etcd: lease, membership, claims and epochs."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from fixtures.etcd import EtcdFactory
from fixtures.waiting import eventually

from chronoshard.clock import SystemClock
from chronoshard.scheduler.cluster.coordination import (
    CoordinationError,
    EtcdCoordinator,
    NodeInfo,
    ShardCountMismatch,
    reconnect_cap_s,
)
from chronoshard.scheduler.config import EtcdConfig
from chronoshard.services import EtcdProcess


def _config(etcd: EtcdProcess, cluster: str, ttl_s: float = 3.0) -> EtcdConfig:
    return EtcdConfig(
        endpoints=(etcd.endpoint,), cluster=cluster, lease_ttl_s=ttl_s, self_fence_margin_s=0.5
    )


def _info(node_id: str) -> NodeInfo:
    return NodeInfo(node_id, f"127.0.0.1:{len(node_id)}", "", "2026-01-01T00:00:00Z")


@pytest.fixture
def cluster() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


async def _started(etcd: EtcdProcess, cluster: str, node_id: str) -> EtcdCoordinator:
    coordinator = EtcdCoordinator(_config(etcd, cluster), node_id, SystemClock())
    await coordinator.connect()
    await coordinator.start_lease()
    return coordinator


async def test_claims_are_exclusive_and_epochs_grow(etcd: EtcdProcess, cluster: str) -> None:
    a = await _started(etcd, cluster, "node-a")
    b = await _started(etcd, cluster, "node-b")
    try:
        first = await a.claim_shard(7)
        assert first is not None and first.node_id == "node-a"
        assert await b.claim_shard(7) is None
        # A repeated claim by the holder (lost answer) returns the same epoch.
        again = await a.claim_shard(7)
        assert again == first
        assert await a.release_shard(7, first.epoch)
        second = await b.claim_shard(7)
        assert second is not None and second.epoch > first.epoch
        # A release under a superseded epoch deletes nothing.
        assert not await a.release_shard(7, first.epoch)
        claims = await a.shard_claims()
        assert claims[7].node_id == "node-b" and claims[7].epoch == second.epoch
    finally:
        await a.close()
        await b.close()


async def test_revoked_lease_frees_its_shards_and_registration(
    etcd: EtcdProcess, cluster: str
) -> None:
    a = await _started(etcd, cluster, "node-a")
    b = await _started(etcd, cluster, "node-b")
    try:
        await a.register_node(_info("node-a"))
        await b.register_node(_info("node-b"))
        assert await a.claim_shard(1) is not None
        nodes, _ = await b.live_nodes()
        assert set(nodes) == {"node-a", "node-b"}
        await a.close(revoke=True)
        nodes, _ = await b.live_nodes()
        assert set(nodes) == {"node-b"}
        assert await b.claim_shard(1) is not None
    finally:
        await b.close()


async def test_shard_count_is_fixed_at_creation(etcd: EtcdProcess, cluster: str) -> None:
    a = await _started(etcd, cluster, "node-a")
    try:
        assert await a.ensure_shard_count(16) == 16
        assert await a.ensure_shard_count(16) == 16
        with pytest.raises(ShardCountMismatch):
            await a.ensure_shard_count(32)
    finally:
        await a.close()


async def test_watch_sees_joins_and_leaves(etcd: EtcdProcess, cluster: str) -> None:
    a = await _started(etcd, cluster, "node-a")
    b = await _started(etcd, cluster, "node-b")
    try:
        await a.register_node(_info("node-a"))
        seen: list[set[str]] = []
        watch = a.watch_nodes()

        async def next_view() -> set[str]:
            view = set(await asyncio.wait_for(anext(watch), timeout=10))
            seen.append(view)
            return view

        assert await next_view() == {"node-a"}
        await b.register_node(_info("node-b"))
        assert await next_view() == {"node-a", "node-b"}
        await b.close(revoke=True)
        assert await next_view() == {"node-a"}
        await watch.aclose()
    finally:
        await a.close()


async def test_handoff_marks_are_watched_taken_back_and_cleared_by_the_claim(
    etcd: EtcdProcess, cluster: str
) -> None:
    old = await _started(etcd, cluster, "node-a")
    new = await _started(etcd, cluster, "node-b")
    try:
        held = await old.claim_shard(4)
        assert held is not None
        marks = old.watch_handoff_marks()
        claims = new.watch_claims()
        assert await asyncio.wait_for(anext(marks), 10) == {}
        assert set(await asyncio.wait_for(anext(claims), 10)) == {4}

        await new.mark_handoff_ready(4)
        assert await asyncio.wait_for(anext(marks), 10) == {4: "node-b"}
        await old.clear_handoff_mark(4)  # not old's mark: left alone
        assert (await old._handoff_marks_at())[0] == {4: "node-b"}
        await new.clear_handoff_mark(4)
        assert await asyncio.wait_for(anext(marks), 10) == {}

        await new.mark_handoff_ready(4)
        assert await asyncio.wait_for(anext(marks), 10) == {4: "node-b"}
        assert await old.release_shard(4, held.epoch)
        assert await asyncio.wait_for(anext(claims), 10) == {}
        taken = await new.claim_shard(4)
        assert taken is not None and taken.epoch > held.epoch
        # The claim deleted the mark in the same transaction.
        assert await asyncio.wait_for(anext(marks), 10) == {}
        assert (await asyncio.wait_for(anext(claims), 10))[4].node_id == "node-b"
        await marks.aclose()
        await claims.aclose()
    finally:
        await old.close()
        await new.close()


async def test_lease_renews_while_etcd_is_up(etcd: EtcdProcess, cluster: str) -> None:
    a = EtcdCoordinator(_config(etcd, cluster, ttl_s=2.0), "node-a", SystemClock())
    await a.connect()
    await a.start_lease()
    try:
        first_deadline = a.lease_deadline()
        # Renewals come every TTL/3: after two TTLs the deadline must have moved on, and
        # the lease would long be gone without them.
        await asyncio.sleep(2 * a.ttl_s)
        assert a.lease_deadline() > first_deadline + a.ttl_s
        assert a.lease_valid(SystemClock().monotonic())
        assert not a.lease_lost.is_set()
    finally:
        await a.close()


async def test_unreachable_etcd_is_a_coordination_error(cluster: str) -> None:
    config = EtcdConfig(endpoints=("127.0.0.1:1",), cluster=cluster, call_timeout_s=0.5)
    coordinator = EtcdCoordinator(config, "node-a", SystemClock())
    await coordinator.connect()
    try:
        with pytest.raises(CoordinationError):
            await coordinator.start_lease()
    finally:
        await coordinator.close(revoke=False)


async def test_a_lease_rides_out_an_etcd_outage_shorter_than_its_ttl(
    etcd_factory: EtcdFactory, cluster: str
) -> None:
    """etcd gives every lease a full TTL when it comes back, so a node that reconnects
    quickly keeps its lease, its registration and its shards. After a 20 s outage gRPC's
    default reconnect backoff (1 s growing 1.6x, ±20 %) next tries 4-8 s after etcd is
    back, past a 5 s lease; the coordinator's capped backoff renews within the bound."""
    member = etcd_factory()
    config = EtcdConfig(
        endpoints=(member.endpoint,), cluster=cluster, lease_ttl_s=5, self_fence_margin_s=1
    )
    clock = SystemClock()
    a = EtcdCoordinator(config, "node-a", clock)
    await a.connect()
    lease_id = await a.start_lease()
    await a.register_node(_info("node-a"))
    try:
        await asyncio.to_thread(member.stop)
        stopped_at = clock.monotonic()
        await eventually(
            lambda: not a.lease_valid(clock.monotonic()),
            timeout_s=config.lease_ttl_s + 1,
            what="the node to fence itself while etcd is down",
        )
        # The outage itself (not a wait for a result): long enough to grow gRPC's backoff.
        await asyncio.sleep(max(0.0, stopped_at + 20.0 - clock.monotonic()))
        await asyncio.to_thread(member.start)
        # One reconnect attempt (at most the cap), one keep-alive retry, and slack for it.
        bound_s = reconnect_cap_s(config.lease_ttl_s) + min(1.0, config.lease_ttl_s / 6) + 1.0
        await eventually(
            lambda: a.lease_alive(clock.monotonic()),
            timeout_s=bound_s,
            what=f"the lease renewed within {bound_s:.1f} s of etcd coming back",
        )
        assert not a.lease_lost.is_set() and a.lease_id == lease_id
        # Renewed, but no dispatch until the shard manager gave its shards back.
        assert a.fenced and not a.lease_valid(clock.monotonic())
        a.lift_fence()
        assert a.lease_valid(clock.monotonic())
        nodes, _ = await a.live_nodes()
        assert set(nodes) == {"node-a"}
    finally:
        await a.close()

"""Scale-out: three scheduler processes share the shards; a node dies, pauses, or etcd
restarts mid-run and every task still completes exactly once. Real etcd, PostgreSQL,
processes.

A join, a SIGKILL and a graceful leave under load, with their lateness bounds, are
``test_handoff.py`` (one cluster for all three). The issue's failover run, 20,000 tasks
over 60 s killed at seeded points, runs here: two seeds in every suite, three more
with ``-m slow``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from fixtures.etcd import EtcdFactory
from fixtures.waiting import eventually
from harness.cluster import Cluster, running_cluster
from harness.cluster import epochs as _epochs
from harness.cluster import owners as _owners
from harness.cluster import spread as _spread
from harness.cluster import submit as _submit
from harness.cluster import wait_all_done as _wait_all_done
from harness.history import History, check, epoch_regressions, first_dispatch_after

from chronoshard import Client
from chronoshard.services import EtcdProcess

SHARDS = 32
LEASE_TTL_S = 5.0
# Tasks due on a dead node's shards resume within lease TTL + this (issue: TTL + 2 s).
FAILOVER_SLACK_S = 2.0


ENV = {
    "CHRONOSHARD_ETCD__LEASE_TTL_S": str(LEASE_TTL_S),
    "CHRONOSHARD_ETCD__SELF_FENCE_MARGIN_S": "1",
    "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
    "CHRONOSHARD_WORKERS__TASK_LEASE_S": "6",
    "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": "3",
}


def _running_cluster(dsn: str, etcd_endpoint: str, log_dir: Path) -> ContextManager[Cluster]:
    return running_cluster(
        dsn, etcd_endpoint, log_dir, shard_count=SHARDS, nodes=3, scheduler_env=ENV
    )


@pytest.fixture
def cluster(fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path) -> Iterator[Cluster]:
    with _running_cluster(fresh_db_dsn, etcd.endpoint, tmp_path) as running:
        yield running


# One round takes ~65 s on 2 cores: one runs in every suite (CI included), the other
# four with ``-m slow`` (the suite's ~20-minute budget has no room for a second).
FULL_SIZE_SEEDS = [3, *(pytest.param(seed, marks=pytest.mark.slow) for seed in range(4, 8))]


@pytest.mark.parametrize("seed", FULL_SIZE_SEEDS)
async def test_failover_at_full_size(cluster: Cluster, seed: int) -> None:
    """The issue's size: 20,000 tasks due over 60 s, killed at seeded points."""
    await _failover_round(cluster, 20_000, 60.0, seed)


async def _failover_round(cluster: Cluster, tasks: int, spread_s: float, seed: int) -> None:
    """Kill the biggest owner at a seeded point of the run (a fifth to a half in)."""
    kill_fraction = random.Random(seed).uniform(0.2, 0.5)
    by_node = await _spread(cluster)
    assert all(len(shards) >= SHARDS // 3 - 1 for shards in by_node.values()), by_node
    history = History()
    start = datetime.now(UTC) + timedelta(seconds=4)
    async with Client(cluster.targets(), api_key=cluster.api_key) as client:
        ids = await _submit(client, history, tasks, start, spread_s)
    await asyncio.sleep(
        max(0.0, (start - datetime.now(UTC)).total_seconds()) + spread_s * kill_fraction
    )
    by_node = await _spread(cluster)
    victim = max(by_node, key=lambda n: len(by_node[n]))
    orphaned = by_node[victim]
    killed_at = datetime.now(UTC)
    cluster.nodes[victim].process.kill()

    await _wait_all_done(cluster, ids, timeout_s=spread_s + 60)
    violations = check(cluster.dsn, history.acknowledged())
    assert not violations, violations.summary()
    assert epoch_regressions(cluster.dsn, history.acknowledged()) == []

    resumed = first_dispatch_after(cluster.dsn, orphaned, killed_at)
    assert resumed is not None
    gap_s = (resumed - killed_at).total_seconds()
    print(f"failover: first dispatch of an orphaned shard's task {gap_s:.2f}s after SIGKILL")
    assert gap_s <= LEASE_TTL_S + FAILOVER_SLACK_S
    owners = _owners(cluster.dsn)
    assert victim not in owners.values()


async def test_a_paused_owner_past_its_lease_dispatches_nothing_when_it_wakes(
    cluster: Cluster,
) -> None:
    by_node = await _spread(cluster)
    zombie = cluster.nodes["node-1"]
    lost = by_node["node-1"]
    zombie.process.pause()
    try:
        # Its lease expires; the others take its shards under new epochs.
        await eventually(
            lambda: not (set(_owners(cluster.dsn).items()) & {(s, "node-1") for s in lost}),
            timeout_s=LEASE_TTL_S * 3,
            what="the paused node's shards taken over",
        )
        history = History()
        async with Client(
            [n.address for name, n in cluster.nodes.items() if name != "node-1"],
            api_key=cluster.api_key,
        ) as client:
            ids = await _submit(client, history, 300, datetime.now(UTC), 3.0)
    finally:
        zombie.process.resume()
    await _wait_all_done(cluster, ids, timeout_s=60)
    violations = check(cluster.dsn, history.acknowledged())
    assert not violations, violations.summary()
    assert epoch_regressions(cluster.dsn, history.acknowledged()) == []
    # Woken up, the old owner learns its lease is gone and drops every shard before any
    # dispatch: none of these tasks was dispatched by node-1.
    with psycopg.connect(cluster.dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM task_attempts a JOIN tasks t ON t.id = a.task_id"
            " WHERE a.task_id = ANY(%s) AND t.shard = ANY(%s)",
            (ids, sorted(lost)),
        ).fetchone()
    assert row is not None and row[0] >= 1
    await eventually(
        lambda: (
            "etcd lease lost" in zombie.process.log() or "epoch superseded" in zombie.process.log()
        ),
        timeout_s=LEASE_TTL_S * 3,
        what="the zombie to notice it lost its shards",
    )
    await _spread(cluster)  # and it rejoins


async def test_an_etcd_restart_is_ridden_out(
    fresh_db_dsn: str, etcd_factory: EtcdFactory, tmp_path: Path
) -> None:
    """etcd down past the self-fence point, then back: every node fences, reconnects
    within its lease (the etcd channel's reconnect backoff is capped, see
    ``coordination.reconnect_cap_s``), gives its shards back and re-claims them under
    new epochs, and every task still completes exactly once."""
    etcd = etcd_factory()
    with _running_cluster(fresh_db_dsn, etcd.endpoint, tmp_path) as cluster:
        await _spread(cluster)
        history = History()
        start = datetime.now(UTC) + timedelta(seconds=2)
        spread_s = 12.0
        async with Client(cluster.targets(), api_key=cluster.api_key) as client:
            ids = await _submit(client, history, 1000, start, spread_s)
        await asyncio.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + 3)
        before = _epochs(cluster.dsn)
        etcd.stop()
        # Down past the self-fence point (TTL - margin): nodes stop dispatching on their own.
        await asyncio.sleep(LEASE_TTL_S)
        etcd.start()
        await _wait_all_done(cluster, ids, timeout_s=spread_s + 60)
        violations = check(cluster.dsn, history.acknowledged())
        assert not violations, violations.summary()
        assert epoch_regressions(cluster.dsn, history.acknowledged()) == []
        await _spread(cluster)
        after = _epochs(cluster.dsn)
        # No shard is written under the epoch it had before the fence.
        assert all(after[shard] > epoch for shard, epoch in before.items()), (before, after)
        for name, node in cluster.nodes.items():
            log = node.process.log()
            assert "self-fenced" in log, name
            # Back under the same lease, or (had the lease run out) under a new one.
            assert "self-fence lifted" in log or "etcd lease expired" in log, name
            assert "reason=self-fenced" in log or "etcd lease expired" in log, name

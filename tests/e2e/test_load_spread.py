"""Load spread across workers (issue 14), with real processes: scheduler nodes, two SDK
worker processes of 10 slots each, real etcd and PostgreSQL.

What broke: of a 2,000-task run on two workers of 10 slots, every task ran on one worker
while the other sat connected with free slots. A node gave each ready task to the first
session in its registry that held a credit, and a worker's credit comes back as soon as
its run ends; whenever the first worker's came back before the next task was due, it
took that one too. The node now gives each task to the session holding the most unused
credits, ties taking turns (``core/rounds.py``, ``Spread``).

Each test submits ``e2e.work`` tasks (each holds its slot ``WORK_S``) and reads who ran
them from the effects ledger (``effects.worker_id``); every task must complete once, with
one successful attempt and one winning effect (``harness.history.check``):

* a trickle one worker could take alone (``TRICKLE_RATE``/s: in flight about
  rate x (lead dispatch + ``WORK_S``), well under 10): each worker runs at least
  ``MIN_SHARE`` of it. Before the fix the first worker ran nearly all of it;
* ``BURST`` tasks due at one instant, more than both workers' slots: the same share;
* on two nodes, where each worker's credits are split between the nodes, the trickle
  again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from fixtures.waiting import eventually
from harness.cluster import Cluster, running_cluster, wait_all_done
from harness.cluster import spread as shards_spread
from harness.cluster import submit as submit_tasks
from harness.history import History, check

from chronoshard import Client
from chronoshard.services import EtcdProcess

WORKERS = ("spread-1", "spread-2")
SLOTS = 10
WORK_S = 0.02
MIN_SHARE = 0.25
TRICKLE_RATE = 40.0
TRICKLE_TASKS = 200
BURST = 400
# Submitted this long before the first is due, so all are preloaded by then.
LEAD_IN_S = 3.0
DONE_S = 60.0
CONNECTED_S = 30.0


def _cluster(
    db_dsn: str, etcd: EtcdProcess, tmp: pytest.TempPathFactory, nodes: int
) -> Iterator[Cluster]:
    with running_cluster(
        db_dsn,
        etcd.endpoint,
        tmp.mktemp(f"spread-{nodes}-logs"),
        nodes=nodes,
        workers=0,
        scheduler_env={},
    ) as cluster:
        for name in WORKERS:
            cluster.start_worker(name, E2E_DSN=db_dsn, E2E_WORKER_SLOTS=str(SLOTS))
        yield cluster


@pytest.fixture(scope="module")
def one_node(
    db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    yield from _cluster(db_dsn, etcd, tmp_path_factory, nodes=1)


@pytest.fixture
def two_nodes(
    fresh_db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    # A database of its own: shard ownership is per database, and one_node's cluster
    # (module-scoped) still owns every shard of the module's.
    yield from _cluster(fresh_db_dsn, etcd, tmp_path_factory, nodes=2)


async def _ready(cluster: Cluster) -> None:
    """Every shard owned, both workers streaming to every node."""
    await shards_spread(cluster)
    for handle in cluster.nodes.values():
        await eventually(
            lambda h=handle: (h.metric("chronoshard_worker_sessions") or 0) >= len(WORKERS),
            timeout_s=CONNECTED_S,
            what=f"both workers connected to {handle.process.name}",
            interval_s=0.1,
        )


def _runs_by_worker(dsn: str, ids: list[uuid.UUID]) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT worker_id, count(*) FROM effects WHERE task_id = ANY(%s) AND outcome = 'ok'"
            " GROUP BY worker_id",
            (ids,),
        ).fetchall()
    return {str(worker): int(n) for worker, n in rows}


async def _run_and_check(cluster: Cluster, count: int, spread_s: float) -> dict[str, int]:
    """Submit ``count`` e2e.work tasks due evenly over ``spread_s`` (0: one instant), wait
    until all completed; none lost or run twice. Runs per worker."""
    await _ready(cluster)
    history = History()
    start = datetime.now(UTC) + timedelta(seconds=LEAD_IN_S)
    async with Client(cluster.targets(), api_key=cluster.api_key) as client:
        ids = await submit_tasks(
            client,
            history,
            count,
            start,
            spread_s,
            task_type="e2e.work",
            payload={"seconds": WORK_S},
        )
    assert len(set(ids)) == count
    await wait_all_done(cluster, ids, timeout_s=LEAD_IN_S + spread_s + DONE_S)
    violations = check(cluster.dsn, history.acknowledged(), job_ledger=False)
    assert not violations, violations.summary()
    runs = _runs_by_worker(cluster.dsn, ids)
    assert sum(runs.values()) == count
    return runs


def _assert_spread(runs: dict[str, int], count: int) -> None:
    """Both workers (by the ids they recorded) ran at least ``MIN_SHARE`` each."""
    shares = sorted(n / count for n in runs.values())
    assert len(shares) == len(WORKERS) and shares[0] >= MIN_SHARE, (
        f"runs per worker {runs}: each of {len(WORKERS)} should run at least {MIN_SHARE:.0%}"
    )


async def test_a_trickle_one_worker_could_take_is_spread_over_both(one_node: Cluster) -> None:
    runs = await _run_and_check(one_node, TRICKLE_TASKS, TRICKLE_TASKS / TRICKLE_RATE)
    _assert_spread(runs, TRICKLE_TASKS)


async def test_a_burst_due_at_one_instant_is_spread_over_both(one_node: Cluster) -> None:
    runs = await _run_and_check(one_node, BURST, 0.0)
    _assert_spread(runs, BURST)


async def test_on_two_nodes_a_trickle_is_spread_over_both(two_nodes: Cluster) -> None:
    runs = await _run_and_check(two_nodes, TRICKLE_TASKS, TRICKLE_TASKS / TRICKLE_RATE)
    _assert_spread(runs, TRICKLE_TASKS)

"""Shard handoff lateness under load: a node joins, a node is SIGKILLed, a node leaves.

One cluster of real processes serves all three cases, one after the other, while tasks
fall due at the issue's density (10,000 over 60 s, ~167/s): two nodes and two workers;
``node-3`` joins; ``node-1`` is SIGKILLed; ``node-2`` stops gracefully (SIGTERM), leaving
``node-3`` alone. For each case the tasks of the shards that moved, due within
``WINDOW_S`` of the event, are measured: how late they started (PostgreSQL's clock,
``harness.history.lateness``). A planned move must keep p99 within 1 s; a crash within
the lease TTL + 2 s. Every case also checks I1-I3 (nothing lost or run twice, no write
under a superseded epoch).
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import uvloop
from harness.cluster import Cluster, owners, running_cluster, spread, submit, wait_all_done
from harness.history import (
    History,
    Lateness,
    Violations,
    check,
    epoch_regressions,
    first_dispatch_after,
    lateness,
)

from chronoshard import Client
from chronoshard.services import EtcdProcess

SHARDS = 32
# The defaults (docs/architecture.md#d12), so the crash case measures the bound as documented: the
# etcd lease, the ack timeout an undelivered intent waits out, the reconcile interval.
LEASE_TTL_S = 10.0
ENV = {"CHRONOSHARD_ETCD__LEASE_TTL_S": str(LEASE_TTL_S)}
TASKS_PER_S = 10_000 / 60
SPAN_S = 44.0
# Seconds after the first task is due: each event's window of tasks ends before the next.
JOIN_AT_S = 4.0
KILL_AT_S = 16.0
LEAVE_AT_S = 30.0
WINDOW_S = 10.0
PLANNED_P99_S = 1.0
CRASH_BOUND_S = LEASE_TTL_S + 2.0


@dataclass
class Case:
    name: str
    at: datetime
    moved: set[int]
    late: Lateness = field(default_factory=lambda: Lateness([], [], []))
    claimed_by_s: float | None = None  # last claim of a moved shard, after the event
    first_dispatch_s: float | None = None  # first intent on a moved shard, after the event

    def row(self) -> str:
        started, dispatched, settled = (
            sorted(self.late.started),
            sorted(self.late.dispatched),
            sorted(self.late.settled),
        )
        claimed = -1.0 if self.claimed_by_s is None else self.claimed_by_s
        return (
            f"{self.name:<6} shards={len(self.moved):>2} tasks={len(started):>4}"
            f" | started p50={_pct(started, 50):.3f} p99={_pct(started, 99):.3f}"
            f" max={_pct(started, 100):.3f} | intent max={_pct(dispatched, 100):.3f}"
            f" | settled max={_pct(settled, 100):.3f} | claimed by +{claimed:.2f}s"
            f" | first dispatch +{self.first_dispatch_s or -1:.2f}s"
            f" | redispatched {self.late.redispatched}"
        )


@dataclass
class Run:
    cases: dict[str, Case]
    violations: Violations
    regressions: list[tuple[int, int, int]]
    stop_s: float
    stop_code: int
    logs: dict[str, str]


def _pct(values: list[float], q: int) -> float:
    """The ``q``-th percentile of sorted ``values`` (100: the maximum)."""
    if not values:
        return float("nan")
    if q == 100 or len(values) == 1:
        return values[-1]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _claimed_by(dsn: str, shards: set[int], after: datetime) -> float | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT max(claimed_at) FROM shard_owners WHERE shard = ANY(%s)", (sorted(shards),)
        ).fetchone()
    return None if row is None or row[0] is None else (row[0] - after).total_seconds()


async def _at(start: datetime, offset_s: float) -> datetime:
    """Sleep until ``start + offset_s``; that instant."""
    when = start + timedelta(seconds=offset_s)
    await asyncio.sleep(max(0.0, (when - datetime.now(UTC)).total_seconds()))
    return datetime.now(UTC)


async def _scenario(cluster: Cluster) -> Run:
    await spread(cluster)
    history = History()
    start = datetime.now(UTC) + timedelta(seconds=4)
    count = int(TASKS_PER_S * SPAN_S)
    async with Client(cluster.targets(), api_key=cluster.api_key) as client:
        ids: list[uuid.UUID] = await submit(client, history, count, start, SPAN_S)

    cases: dict[str, Case] = {}
    joined_at = await _at(start, JOIN_AT_S)
    await asyncio.to_thread(cluster.start_node, "node-3")
    by_node = await spread(cluster)
    cases["join"] = Case("join", joined_at, by_node["node-3"])
    cases["join"].claimed_by_s = _claimed_by(cluster.dsn, by_node["node-3"], joined_at)

    killed_at = await _at(start, KILL_AT_S)
    cluster.nodes["node-1"].process.kill()
    cases["crash"] = Case("crash", killed_at, by_node["node-1"])
    by_node = await spread(cluster)
    cases["crash"].claimed_by_s = _claimed_by(cluster.dsn, cases["crash"].moved, killed_at)

    left_at = await _at(start, LEAVE_AT_S)
    cases["leave"] = Case("leave", left_at, by_node["node-2"])
    code = await asyncio.to_thread(cluster.nodes["node-2"].process.stop, 30)
    stop_s = (datetime.now(UTC) - left_at).total_seconds()
    await spread(cluster)
    cases["leave"].claimed_by_s = _claimed_by(cluster.dsn, cases["leave"].moved, left_at)

    await wait_all_done(cluster, ids, timeout_s=SPAN_S + 60)
    for case in cases.values():
        case.late = lateness(
            cluster.dsn, ids, case.moved, case.at, case.at + timedelta(seconds=WINDOW_S)
        )
        first = first_dispatch_after(cluster.dsn, case.moved, case.at)
        case.first_dispatch_s = None if first is None else (first - case.at).total_seconds()
    assert owners(cluster.dsn).keys() == set(range(SHARDS))
    return Run(
        cases,
        check(cluster.dsn, history.acknowledged()),
        epoch_regressions(cluster.dsn, history.acknowledged()),
        stop_s,
        code,
        {name: node.process.log(200_000) for name, node in cluster.nodes.items()},
    )


@pytest.fixture(scope="module")
def run(db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    log_dir: Path = tmp_path_factory.mktemp("handoff")
    with (
        running_cluster(
            db_dsn, etcd.endpoint, log_dir, shard_count=SHARDS, nodes=2, scheduler_env=ENV
        ) as cluster,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        try:
            result = runner.run(_scenario(cluster))
        except BaseException:
            print(cluster.group.logs())
            raise
    for case in result.cases.values():
        print(case.row())
    print(f"leave: SIGTERM to exit {result.stop_s:.2f}s, exit code {result.stop_code}")
    yield result


def test_no_task_lost_or_run_twice_and_no_stale_epoch_write(run: Run) -> None:
    assert not run.violations, run.violations.summary()
    assert run.regressions == []


def test_a_joining_node_takes_its_shards_warm(run: Run) -> None:
    case = run.cases["join"]
    assert case.late.started, "no task of a moved shard fell due in the window"
    assert _pct(sorted(case.late.started), 99) <= PLANNED_P99_S, case.row()
    assert "shard warm; ready to take it over" in run.logs["node-3"]


def test_a_graceful_leave_hands_its_shards_over_warm(run: Run) -> None:
    case = run.cases["leave"]
    assert run.stop_code == 0
    assert case.late.started, "no task of a moved shard fell due in the window"
    assert _pct(sorted(case.late.started), 99) <= PLANNED_P99_S, case.row()


def test_every_planned_move_was_warm(run: Run) -> None:
    """Join, leave, and the moves between survivors after the crash: each old owner let
    go once its successor said it was warm, none after waiting out handoff.wait_s."""
    for name, log in run.logs.items():
        assert "reason=rebalance" not in log, name
        assert "reason=shutdown" not in log, name
    assert run.logs["node-2"].count("reason=handoff") >= len(run.cases["leave"].moved)


def test_a_killed_nodes_shards_resume_within_the_lease_ttl_plus_2s(run: Run) -> None:
    case = run.cases["crash"]
    assert case.late.started, "no task of a moved shard fell due in the window"
    assert max(case.late.started) <= CRASH_BOUND_S, case.row()

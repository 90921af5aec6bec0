"""Weighted fair queuing under a flood (issue 18, item 2;
docs/operations.md#priority-classes-and-fair-queuing): one scheduler process, real etcd
and PostgreSQL, two SDK worker processes of 10 slots each (20 slots).

The node runs a non-default ``[fairness]`` policy given through
``CHRONOSHARD_FAIRNESS__*`` (bulk cap 0.4 of the slots, critical reserve 0.2), so the test
also shows the settings reach the selector. Every run is recorded by the worker that ran
it (``fairness_workers.py``: type, id, due, start, end). Three phases, one flood:

1. **Punctuality under a flood.** Tenant A floods ``FLOOD`` bulk tasks through
   ``SubmitBatch``, all due at once, while tenant B submits critical tasks at
   ``CRITICAL_RPS`` for as long as the flood is being submitted, each due
   ``CRITICAL_AHEAD_S`` after its submit (strict timing). Every critical task runs once
   and its lateness (handler start minus due) has p99 within ``CRITICAL_P99_BOUND_S``,
   though every slot is contended by bulk work the whole time.
2. **The cap while critical work waits.** Tenant C, whose own concurrency limit is 2,
   has ``WAITING_TASKS`` critical tasks of ``WAITING_RUN_S`` due at one instant: most of
   them wait, for seconds, behind their tenant's limit. While they wait, bulk may hold at
   most ``floor(0.4 * 20)`` slots: runs already going when the critical work came due are
   not preempted, so the check starts one bulk run's length after the due instant, and
   at every bulk start and every instant it samples the bulk runs in progress are within
   the cap (without the cap bulk would fill the 18 slots C leaves).
3. **Lent capacity.** Once C's work is done, no critical task waits, and bulk takes every
   slot again: at some instant all 20 slots run bulk, and on average well above the cap.

No task ran twice. The measurements print as the table in bench/README.md ("Fair
queuing under a flood"). ``FAIR_FLOOD_TASKS`` sets the flood's size: CI floods 30,000
(the suite's time budget); ``FAIR_FLOOD_TASKS=200000`` is the issue's size, run and
reported there.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import os
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fixtures.waiting import eventually
from harness.cluster import Cluster, running_cluster
from harness.cluster import spread as _spread

from chronoshard import Client, Priority, SubmitResult, TaskSpec
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess

E2E_DIR = Path(__file__).resolve().parent
SHARDS = 8
WORKERS = 2
SLOTS = 10
CAPACITY = WORKERS * SLOTS
BULK_CAP = 0.4
CRITICAL_RESERVE = 0.2
CAP_SLOTS = math.floor(BULK_CAP * CAPACITY)
RUN_S = 0.05

FLOOD = int(os.environ.get("FAIR_FLOOD_TASKS", "30000"))
FLOOD_CHUNK = 10_000
CRITICAL_RPS = 20.0
CRITICAL_TASKS = 200
CRITICAL_AHEAD_S = 1.0
# docs/operations.md#priority-classes-and-fair-queuing: on this 2-core machine, shared by
# the flood's producer, PostgreSQL, the node and both workers; p99 measured 155-185 ms
# (30,000 and 200,000 tasks; bench/README.md "Fair queuing under a flood").
CRITICAL_P99_BOUND_S = 0.35
WAITING_TASKS = 8
WAITING_CONCURRENCY = 2
WAITING_RUN_S = 1.0
LENT_PHASE_S = 3.0

ENV = {
    "CHRONOSHARD_FAIRNESS__BULK_CAP_FRACTION": str(BULK_CAP),
    "CHRONOSHARD_FAIRNESS__CRITICAL_RESERVE_FRACTION": str(CRITICAL_RESERVE),
    "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
}


@dataclass(frozen=True)
class Run:
    kind: str
    task_id: str
    due: float
    start: float
    end: float


@pytest.fixture(scope="module")
def cluster(
    db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, Path]]:
    records = tmp_path_factory.mktemp("fair-records")
    with running_cluster(
        db_dsn,
        etcd.endpoint,
        tmp_path_factory.mktemp("fair-logs"),
        nodes=1,
        workers=0,
        shard_count=SHARDS,
        scheduler_env=ENV,
    ) as running:
        for i in range(WORKERS):
            running.start_worker(
                f"fair-worker-{i + 1}",
                "fairness_workers:worker",
                pythonpath=E2E_DIR,
                FAIR_RECORDS=str(records / f"worker-{i + 1}.txt"),
                FAIR_WORKER_SLOTS=str(SLOTS),
                FAIR_RUN_S=str(RUN_S),
            )
        yield running, records


def _runs(records: Path) -> list[Run]:
    runs = []
    for path in sorted(records.glob("worker-*.txt")):
        for line in path.read_text().splitlines():
            kind, task_id, due, start, end = line.split()
            runs.append(Run(kind, task_id, float(due), float(start), float(end)))
    return runs


class Occupancy:
    """How many of some runs were in progress at an instant (started at or before it,
    not ended by then)."""

    def __init__(self, runs: list[Run]) -> None:
        self.starts = sorted(r.start for r in runs)
        self.ends = sorted(r.end for r in runs)

    def at(self, instant: float) -> int:
        return bisect.bisect_right(self.starts, instant) - bisect.bisect_right(self.ends, instant)

    def most(self, since: float, until: float, step_s: float = 0.005) -> int:
        """The most in progress at once in [since, until]: at every start inside it and
        on a grid of ``step_s``."""
        instants = [s for s in self.starts if since <= s <= until]
        instants += [since + k * step_s for k in range(int((until - since) / step_s) + 1)]
        return max((self.at(t) for t in instants), default=0)

    def mean(self, since: float, until: float, step_s: float = 0.005) -> float:
        grid = [since + k * step_s for k in range(int((until - since) / step_s) + 1)]
        return sum(self.at(t) for t in grid) / len(grid)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def _flood(cluster: Cluster, api_key: str) -> float:
    """Submit the bulk flood, due now; the seconds it took."""
    began = time.monotonic()
    async with Client(cluster.targets(), api_key=api_key, timeout_s=60) as client:
        for first in range(0, FLOOD, FLOOD_CHUNK):
            specs = [
                TaskSpec(type="fair.bulk", payload={"i": i}, priority=Priority.BULK)
                for i in range(first, min(FLOOD, first + FLOOD_CHUNK))
            ]
            results = await client.submit_batch(specs)
            assert all(isinstance(r, SubmitResult) for r in results), results[:3]
    return time.monotonic() - began


async def _critical_stream(cluster: Cluster, api_key: str, flood: asyncio.Task[float]) -> list[str]:
    """Critical tasks, one every 1/CRITICAL_RPS s, each due CRITICAL_AHEAD_S after its
    submit, for as long as the flood is being submitted and at least CRITICAL_TASKS;
    their ids."""
    ids: list[str] = []
    async with Client(cluster.targets(), api_key=api_key) as client:
        began = time.monotonic()
        for i in itertools.count():
            if i >= CRITICAL_TASKS and flood.done():
                break
            pause = began + i / CRITICAL_RPS - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            made = await client.submit(
                "fair.critical",
                {"i": i},
                at=datetime.now(UTC) + timedelta(seconds=CRITICAL_AHEAD_S),
                priority=Priority.CRITICAL,
                strict_timing=True,
            )
            ids.append(made.task.id)
    return ids


async def _waiting_critical(cluster: Cluster, api_key: str) -> tuple[float, list[str]]:
    """WAITING_TASKS critical tasks of WAITING_RUN_S due at one instant a second from
    now; that instant and their ids."""
    due = datetime.now(UTC) + timedelta(seconds=1)
    specs = [
        TaskSpec(
            type="fair.critical_long",
            payload={"seconds": WAITING_RUN_S, "i": i},
            at=due,
            priority=Priority.CRITICAL,
            strict_timing=True,
        )
        for i in range(WAITING_TASKS)
    ]
    async with Client(cluster.targets(), api_key=api_key) as client:
        results = await client.submit_batch(specs)
    assert all(isinstance(r, SubmitResult) for r in results), results
    return due.timestamp(), [r.task.id for r in results if isinstance(r, SubmitResult)]


async def test_critical_work_stays_punctual_and_bulk_keeps_to_its_cap_under_a_flood(
    cluster: tuple[Cluster, Path],
) -> None:
    running, records = cluster
    await _spread(running)
    for process in running.group.workers:
        await eventually(
            lambda p=process: "event=session_open" in p.log(tail_chars=1_000_000),
            timeout_s=30,
            what=f"{process.name} connected",
            interval_s=0.1,
        )
    flooder = create_tenant(running.dsn, f"flood-{uuid.uuid4().hex[:8]}")
    streaming = create_tenant(running.dsn, f"critical-{uuid.uuid4().hex[:8]}")
    limited = create_tenant(
        running.dsn,
        f"limited-{uuid.uuid4().hex[:8]}",
        max_concurrent_workers=WAITING_CONCURRENCY,
    )

    # 1. The flood, and critical work arriving all the while.
    flood_task = asyncio.create_task(_flood(running, flooder.api_key))
    await eventually(
        lambda: sum(1 for r in _runs(records) if r.kind == "bulk") >= CAPACITY,
        timeout_s=60,
        what="bulk work running",
        interval_s=0.1,
    )
    critical_ids = await _critical_stream(running, streaming.api_key, flood_task)
    flood_s = await flood_task

    # 2. Critical work that waits for seconds behind its tenant's own limit.
    waiting_due, waiting_ids = await _waiting_critical(running, limited.api_key)

    def lent_phase_seen() -> bool:
        runs = _runs(records)
        done = [r for r in runs if r.kind.startswith("critical")]
        if len(done) < len(critical_ids) + len(waiting_ids):
            return False
        last = max(r.end for r in done)
        return any(r.kind == "bulk" and r.start > last + LENT_PHASE_S for r in runs)

    await eventually(
        lent_phase_seen,
        timeout_s=120,
        what="every critical task ran, then bulk alone for a while",
        interval_s=0.2,
    )
    runs = _runs(records)
    stream = [r for r in runs if r.kind == "critical"]
    waiting = sorted((r for r in runs if r.kind == "critical_long"), key=lambda r: r.start)
    bulk = Occupancy([r for r in runs if r.kind == "bulk"])

    assert sorted(r.task_id for r in stream) == sorted(critical_ids)
    assert sorted(r.task_id for r in waiting) == sorted(waiting_ids)
    twice = [task for task, n in Counter(r.task_id for r in runs).items() if n > 1]
    assert not twice, twice[:5]

    lateness = [max(0.0, r.start - r.due) for r in stream]
    p50, p99 = statistics.median(lateness), _quantile(lateness, 0.99)

    # While C's critical work waits, bulk stays within its cap; C within its own limit.
    # From one bulk run after C's due instant (the bulk runs already going then finish;
    # they are not preempted) until the 4th-last of C's runs ended: with C's limit of 2,
    # its task k cannot leave the ready queue before k-1 of its runs ended, so until then
    # its last two tasks surely wait there (a concurrency probe takes one at a time).
    ends = sorted(r.end for r in waiting)
    cap_since, cap_until = waiting_due + RUN_S, ends[WAITING_TASKS - 4]
    assert cap_until - cap_since >= WAITING_RUN_S, (cap_since, cap_until)
    bulk_while_waiting = bulk.most(cap_since, cap_until)
    bulk_mean_waiting = bulk.mean(cap_since, cap_until)
    assert Occupancy(waiting).most(waiting_due, waiting[-1].end) <= WAITING_CONCURRENCY

    # Once no critical task waits, bulk takes every slot again.
    lent_since = max(r.end for r in waiting) + RUN_S
    lent_until = lent_since + LENT_PHASE_S
    bulk_lent = bulk.most(lent_since, lent_until)
    bulk_mean_lent = bulk.mean(lent_since, lent_until)

    print(
        "\nfair queuing under a flood (1 node, 2 workers x 10 slots, "
        f"{RUN_S * 1000:.0f} ms handlers, bulk cap {CAP_SLOTS} slots)\n"
        "| flood | submitted in | critical tasks | critical lateness p50 / p99 / max |"
        " bulk while critical waits: most / mean (cap) | bulk once none waits: most / mean |\n"
        f"| {FLOOD:,} bulk | {flood_s:.1f} s | {len(stream)} at {CRITICAL_RPS:g}/s |"
        f" {p50 * 1000:.1f} / {p99 * 1000:.1f} / {max(lateness) * 1000:.1f} ms |"
        f" {bulk_while_waiting} / {bulk_mean_waiting:.1f} ({CAP_SLOTS}) |"
        f" {bulk_lent} / {bulk_mean_lent:.1f} of {CAPACITY} |"
    )
    assert p99 <= CRITICAL_P99_BOUND_S, (p50, p99, max(lateness))
    assert bulk_while_waiting <= CAP_SLOTS, (bulk_while_waiting, CAP_SLOTS)
    # At the cap, not starved: the waiting critical work holds only its reserve back.
    assert bulk_while_waiting == CAP_SLOTS, bulk_while_waiting
    # Lent: every slot at some instant, and on average as many more as the cap held back
    # (each slot also spends a settlement's and a dispatch's round trip idle, in both).
    assert bulk_lent == CAPACITY, bulk_lent
    assert bulk_mean_lent >= 1.5 * bulk_mean_waiting, (bulk_mean_lent, bulk_mean_waiting)

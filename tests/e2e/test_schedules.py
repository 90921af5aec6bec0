"""Recurring schedules end to end (issue 15's "done when"): real PostgreSQL, etcd,
scheduler node processes, worker processes and a watchdog process.

* **Every second, exactly once, through a planned join and a SIGKILL**: one schedule,
  interval 1 s, strict timing, 60 occurrences (1 minute). ``node-3`` joins and takes
  the schedule's shard over (the schedule is chosen so that it does: its shard is one
  the rendezvous map gives the joining node); later ``node-3``, now the owner of the
  schedule's shard, is SIGKILLed. Every logical date runs exactly once (occurrence rows,
  tasks and the handler's own records), every occurrence is created ahead of its time,
  no attempt is written under a superseded epoch (``harness.history``) and every
  occurrence starts within its documented bound (docs/failure-model.md, promise 4):

  - an occurrence whose *task's* shard the killed node owned and that fell due from
    1 s before the kill to ``lease_ttl_s + 2 s`` after it: **lease TTL + 2 s** (a dead
    scheduler's shards resume within that; 1 s before the kill covers an intent the
    node committed ahead of ``due_at`` and never sent, given back at intent +
    ``workers.ack_timeout_s``, which is why ``ack_timeout_s`` ≤ TTL + 1.5 s here, as the
    document requires for the bound);
  - every other occurrence, the join's included: **1 s**, the bound of a planned move
    (the tightest one the document states; it gives no other for a strict task).

  The materialiser's own handoff costs nothing: occurrences are created
  ``schedules.lookahead_s`` (8 s here) ahead, longer than the shard takes to move after
  a crash (TTL 3 s + the claim), so the survivor goes on from the cursor before any
  occurrence is due that the dead node had not created.

* **Catchup with the whole cluster stopped**: three schedules (interval 5 s, misfire
  grace 1 s), catchup SKIP, LATEST and ALL. Every node and worker is SIGKILLed; the
  nodes are started again once three occurrences after the schedules' cursor (none of
  which any node created) are older than the grace, and before a fourth is. SKIP creates
  none of the three, LATEST the newest, ALL all three, each with origin CATCHUP and its
  own logical date (``ctx.logical_date`` in the handler), each run once; the next
  occurrence is on time (SCHEDULE) under every policy. Interval 5 s rather than 3 s: the
  restarted nodes' first materialiser pass must fall within one interval of the restart
  (it decides which occurrences are missed), and starting two nodes on 2 shared cores
  takes a few seconds.

* **The watchdog's derived expectation**: a schedule (interval 3 s, watch expected
  duration 1 s + tolerance 1 s) runs on a worker; the worker is stopped; a real
  ``chronoshard-watchdog`` (checking every second) alerts ``schedule_missed`` for the
  first occurrence that did not complete, not before its deadline (logical date +
  expected duration + tolerance) and within deadline + one check interval, exactly once
  while later occurrences miss too; a worker started again runs the waiting
  occurrences and the alert resolves, once, at the first check after one completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from e2e.watchdog_receiver import Received, Receiver, running_receiver
from fixtures.waiting import eventually
from harness.cluster import Cluster, owners, running_cluster, spread
from harness.history import check, epoch_regressions
from harness.processes import ManagedProcess

from chronoshard import CatchupPolicy, Client, ScheduleSpec, ScheduleWatch, TaskSpec
from chronoshard._dev.processes import free_ports
from chronoshard.scheduler.core import rendezvous
from chronoshard.services import EtcdProcess

SHARDS = 16
LEASE_TTL_S = 3.0
# docs/failure-model.md: the TTL + 2 s bound holds while ack_timeout_s <= TTL + 1.5 s.
ACK_TIMEOUT_S = LEASE_TTL_S + 1.0
LOOKAHEAD_S = 8.0
ENV = {
    "CHRONOSHARD_ETCD__LEASE_TTL_S": str(LEASE_TTL_S),
    "CHRONOSHARD_ETCD__SELF_FENCE_MARGIN_S": "1",
    "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
    "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": str(ACK_TIMEOUT_S),
    "CHRONOSHARD_SCHEDULES__LOOKAHEAD_S": str(LOOKAHEAD_S),
    "CHRONOSHARD_GRPC__KEEPALIVE_TIME_S": "1",
    "CHRONOSHARD_GRPC__KEEPALIVE_TIMEOUT_S": "1",
}
WORKER = "schedule_workers:worker"
TASK_TYPE = "sched.record"

# Every second, 1 minute: the join at 12 s and the kill at 32 s leave 28 s of the survivor.
OCCURRENCES = 60
JOIN_AT_S = 12.0  # after the first occurrence
KILL_AT_S = 32.0
CRASH_BOUND_S = LEASE_TTL_S + 2.0
PLANNED_BOUND_S = 1.0
CRASH_WINDOW_BEFORE_S = 1.0

# Catchup.
CATCHUP_EVERY_S = 5.0
GRACE_S = 1.0
MISSED = 3

# Watchdog.
WATCH_EVERY_S = 3.0
EXPECTED_S = 1.0
TOLERANCE_S = 1.0
CHECK_S = 1.0
# The documented bound is on when the noticing check runs: the first check at or after the
# deadline (or the completion) starts within one check interval of it (the loop runs at a
# fixed rate). That check's own statements and the webhook POST on the loopback take a few
# milliseconds after its start (measured 5 ms); this allows them 0.2 s.
CHECK_WORK_S = 0.2
# A worker started again connects, runs the waiting occurrences, and the next check sees
# a completion: a few seconds on this machine; the bound asserted is the check's.
RESOLVE_TIMEOUT_S = 30.0

MEASURED: dict[str, float] = {}

# What the handler (schedule_workers.py) records: one row per start, no unique constraint.
RUNS_DDL = """
CREATE TABLE IF NOT EXISTS schedule_runs (
    task_id uuid NOT NULL,
    schedule_id uuid,
    logical_date timestamptz,
    attempt integer NOT NULL,
    token bigint NOT NULL,
    worker_id text NOT NULL,
    started_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
)
"""


# --- helpers --------------------------------------------------------------------------------


@contextlib.contextmanager
def _cluster(
    dsn: str, etcd: EtcdProcess, log_dir: Path, *, nodes: int, workers: int
) -> Iterator[Cluster]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RUNS_DDL)
    with running_cluster(
        dsn, etcd.endpoint, log_dir, nodes=nodes, workers=0, shard_count=SHARDS, scheduler_env=ENV
    ) as cluster:
        for i in range(workers):
            _start_worker(cluster, f"worker-{i + 1}")
        try:
            yield cluster
        except BaseException:
            print(cluster.logs())
            raise


def _start_worker(cluster: Cluster, name: str) -> ManagedProcess:
    return cluster.start_worker(name, WORKER, E2E_DSN=cluster.dsn)


def _query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return list(conn.execute(sql, params).fetchall())


def _schedule_shard(dsn: str, schedule_id: str) -> int:
    [(shard,)] = _query(dsn, "SELECT shard FROM schedules WHERE id = %s", uuid.UUID(schedule_id))
    return int(shard)


@dataclass(frozen=True)
class Occurrence:
    logical_date: datetime
    origin: str
    created_at: datetime
    task_id: uuid.UUID | None
    status: str | None
    due_at: datetime | None
    task_shard: int | None


def _occurrences(dsn: str, schedule_id: str) -> dict[datetime, Occurrence]:
    rows = _query(
        dsn,
        "SELECT o.logical_date, o.origin, o.created_at, o.task_id, t.status, t.due_at, t.shard"
        " FROM schedule_occurrences o"
        " LEFT JOIN tasks t ON t.id = o.task_id AND t.scheduled_at = o.task_scheduled_at"
        " WHERE o.schedule_id = %s ORDER BY o.logical_date",
        uuid.UUID(schedule_id),
    )
    return {r[0]: Occurrence(*r) for r in rows}


def _schedule_tasks(dsn: str, schedule_id: str) -> list[tuple[uuid.UUID, datetime, str]]:
    """Every task the schedule created: (id, logical date, status)."""
    rows = _query(
        dsn,
        "SELECT id, logical_date, status FROM tasks WHERE schedule_id = %s ORDER BY logical_date",
        uuid.UUID(schedule_id),
    )
    return [(r[0], r[1], r[2]) for r in rows]


@dataclass(frozen=True)
class Run:
    task_id: uuid.UUID
    logical_date: datetime | None
    token: int
    recorded_at: datetime


def _runs(dsn: str, schedule_id: str) -> list[Run]:
    """What the handler recorded for the schedule's tasks, one row per start."""
    rows = _query(
        dsn,
        "SELECT r.task_id, r.logical_date, r.token, r.recorded_at FROM schedule_runs r"
        " JOIN tasks t ON t.id = r.task_id WHERE t.schedule_id = %s ORDER BY r.recorded_at",
        uuid.UUID(schedule_id),
    )
    return [Run(*r) for r in rows]


def _grid(first: datetime, every_s: float, count: int) -> list[datetime]:
    return [first + timedelta(seconds=every_s * i) for i in range(count)]


def _whole_second(at: datetime) -> datetime:
    return at.replace(microsecond=0) + timedelta(seconds=1)


async def _until(at: datetime) -> None:
    """Sleep until the wall clock reaches ``at`` (the scenario's own timeline)."""
    await asyncio.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()))


def _spec(name: str, every_s: float, first: datetime, **fields: Any) -> ScheduleSpec:
    return ScheduleSpec(
        name=name,
        task=TaskSpec(type=TASK_TYPE, strict_timing=True, idempotent=True),
        interval_s=every_s,
        start_at=first,
        **fields,
    )


# --- 1. every second, exactly once, through a join and a SIGKILL -----------------------------


async def test_every_second_runs_exactly_once_on_time_through_a_join_and_a_sigkill(
    fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path
) -> None:
    with _cluster(fresh_db_dsn, etcd, tmp_path, nodes=2, workers=2) as cluster:
        await _every_second(cluster)


async def _every_second(cluster: Cluster) -> None:
    dsn = cluster.dsn
    await spread(cluster)
    # The shards the join moves to node-3 (the nodes' own rendezvous map).
    after_join = rendezvous.assign(["node-1", "node-2", "node-3"], SHARDS)
    joining = rendezvous.shards_of(after_join, "node-3")
    assert owners(dsn) == rendezvous.assign(["node-1", "node-2"], SHARDS)

    first = _whole_second(datetime.now(UTC) + timedelta(seconds=4))
    last = first + timedelta(seconds=OCCURRENCES - 1)
    async with Client(cluster.targets(), api_key=cluster.api_key) as client:
        # Schedule ids are the server's: create until one lands on a shard the join moves,
        # deleting the others (before their first occurrence is due).
        for attempt in range(30):
            created = await client.create_schedule(
                _spec(f"every-second-{attempt}", 1.0, first, end_at=last)
            )
            shard = _schedule_shard(dsn, created.id)
            if shard in joining:
                break
            await client.delete_schedule(created.id)
        else:
            raise AssertionError("no schedule landed on a shard the join moves")
    schedule_id = created.id
    assert datetime.now(UTC) < first, "the schedule's first occurrence passed while choosing it"
    first_owner = owners(dsn)[shard]

    joined_at = first + timedelta(seconds=JOIN_AT_S)
    await _until(joined_at)
    await asyncio.to_thread(cluster.start_node, "node-3")
    by_node = await spread(cluster)
    assert shard in by_node["node-3"], (shard, by_node)

    # Kill half a second before an occurrence whose task's shard node-3 owns (its task
    # exists: created lookahead ahead), so the crash bound is exercised, not only the
    # materialiser's takeover.
    await _until(first + timedelta(seconds=KILL_AT_S))
    crashed_shards = rendezvous.shards_of(owners(dsn), "node-3")
    assert shard in crashed_shards
    victim = await eventually(
        lambda: _next_on(
            dsn, schedule_id, crashed_shards, datetime.now(UTC) + timedelta(seconds=1)
        ),
        timeout_s=30,
        what="an upcoming occurrence task on a shard of node-3",
        interval_s=0.2,
    )
    assert victim is not None
    await _until(victim - timedelta(seconds=0.5))
    cluster.nodes["node-3"].process.kill()
    killed_at = datetime.now(UTC)
    by_node = await spread(cluster)
    survivor = owners(dsn)[shard]
    print(
        f"schedule shard {shard}: {first_owner} -> node-3 (join) -> {survivor} (SIGKILL);"
        f" node-3 owned {sorted(crashed_shards)} at the kill"
    )

    expected = _grid(first, 1.0, OCCURRENCES)

    def all_ran() -> bool:
        occurrences = _occurrences(dsn, schedule_id)
        return len(occurrences) == OCCURRENCES and all(
            o.status == "COMPLETED" for o in occurrences.values()
        )

    await eventually(
        all_ran,
        timeout_s=(last - datetime.now(UTC)).total_seconds() + 30,
        what="every occurrence COMPLETED",
        interval_s=0.5,
    )

    occurrences = _occurrences(dsn, schedule_id)
    tasks = _schedule_tasks(dsn, schedule_id)
    runs = _runs(dsn, schedule_id)
    task_ids = [t[0] for t in tasks]

    # No gap, no duplicate: one occurrence row, one task and one handler start per date.
    assert sorted(occurrences) == expected
    assert {o.origin for o in occurrences.values()} == {"SCHEDULE"}
    assert sorted(t[1] for t in tasks) == expected, "a logical date with no task or two"
    assert {o.task_id for o in occurrences.values()} == set(task_ids)
    started = sorted(r.logical_date for r in runs if r.logical_date is not None)
    assert started == expected, _diff(expected, started)
    by_task = {o.task_id: o for o in occurrences.values()}
    for run in runs:
        assert by_task[run.task_id].logical_date == run.logical_date  # ctx.logical_date
    # Created ahead, each one: the materialiser's handoffs (warm at the join, from the
    # cursor after the crash) never let an occurrence fall due before it existed.
    late_created = [o.logical_date for o in occurrences.values() if o.created_at > o.logical_date]
    assert late_created == [], late_created
    # I1/I2 (one accepted completion, the winning token's effect once) and I3 (no attempt
    # under a superseded epoch).
    violations = check(dsn, task_ids)
    assert not violations, violations.summary()
    assert epoch_regressions(dsn, task_ids) == []

    # Timing, by PostgreSQL's clock: the handler's first write minus the logical date.
    crash_from = killed_at - timedelta(seconds=CRASH_WINDOW_BEFORE_S)
    crash_to = killed_at + timedelta(seconds=CRASH_BOUND_S)
    late: dict[str, list[tuple[float, datetime]]] = {"crash": [], "planned": []}
    for run in runs:
        occurrence = by_task[run.task_id]
        assert occurrence.due_at == occurrence.logical_date  # strict: no jitter
        lateness = (run.recorded_at - occurrence.logical_date).total_seconds()
        assert lateness >= 0, f"{occurrence.logical_date} started {-lateness:.3f} s early"
        crash = (
            occurrence.task_shard in crashed_shards
            and crash_from <= occurrence.logical_date <= crash_to
        )
        late["crash" if crash else "planned"].append((lateness, occurrence.logical_date))
    assert late["crash"], "no occurrence of the killed node's shards fell due in the window"
    worst = {k: max(v, default=(0.0, first)) for k, v in late.items()}
    MEASURED["every_second_crash_window_max_s"] = worst["crash"][0]
    MEASURED["every_second_other_max_s"] = worst["planned"][0]
    print(
        f"every second: {len(late['crash'])} occurrences in the crash window,"
        f" max {worst['crash'][0]:.3f} s (bound {CRASH_BOUND_S} s);"
        f" {len(late['planned'])} others, max {worst['planned'][0]:.3f} s at"
        f" {worst['planned'][1].isoformat()} (bound {PLANNED_BOUND_S} s)"
    )
    over = [(s, d.isoformat()) for s, d in late["crash"] if s > CRASH_BOUND_S]
    assert over == [], f"crash-window occurrences over {CRASH_BOUND_S} s: {over}"
    over = [(s, d.isoformat()) for s, d in late["planned"] if s > PLANNED_BOUND_S]
    assert over == [], f"occurrences over {PLANNED_BOUND_S} s: {over}"


def _next_on(dsn: str, schedule_id: str, shards: set[int], after: datetime) -> datetime | None:
    """The first logical date after ``after`` whose task the schedule has created on one of
    ``shards``."""
    [(at,)] = _query(
        dsn,
        "SELECT min(logical_date) FROM tasks WHERE schedule_id = %s AND logical_date > %s"
        " AND shard = ANY(%s)",
        uuid.UUID(schedule_id),
        after,
        sorted(shards),
    )
    return None if at is None else at


def _diff(expected: list[datetime], got: list[datetime]) -> str:
    missing = sorted(set(expected) - set(got))
    twice = sorted({d for d in got if got.count(d) > 1})
    extra = sorted(set(got) - set(expected))
    return f"missing {missing[:5]} ({len(missing)}), twice {twice[:5]}, extra {extra[:5]}"


# --- 2. catchup after the whole cluster stopped ----------------------------------------------


async def test_catchup_after_the_whole_cluster_stopped_skip_latest_all(
    fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path
) -> None:
    with _cluster(fresh_db_dsn, etcd, tmp_path, nodes=2, workers=1) as cluster:
        await _catchup(cluster)


async def _catchup(cluster: Cluster) -> None:
    dsn = cluster.dsn
    await spread(cluster)
    first = _whole_second(datetime.now(UTC) + timedelta(seconds=2))
    policies: dict[str, dict[str, Any]] = {
        "skip": dict(catchup=CatchupPolicy.SKIP),
        "latest": dict(catchup=CatchupPolicy.LATEST),
        "all": dict(catchup=CatchupPolicy.ALL, catchup_limit=10),
    }
    ids: dict[str, str] = {}
    async with Client(cluster.targets(), api_key=cluster.api_key) as client:
        for name, fields in policies.items():
            spec = _spec(
                f"catchup-{name}", CATCHUP_EVERY_S, first, misfire_grace_s=GRACE_S, **fields
            )
            ids[name] = (await client.create_schedule(spec)).id

    # Running: the first occurrence of each ran.
    await eventually(
        lambda: all(_runs(dsn, i) for i in ids.values()),
        timeout_s=30,
        what="each schedule's first occurrence ran",
    )

    # Stop everything at once.
    for name, handle in list(cluster.nodes.items()):
        handle.process.kill()
        del cluster.nodes[name]
    for process in cluster.group.workers:
        process.kill()
    stopped_at = datetime.now(UTC)

    # The first occurrence no node created (next_at: nothing materialises any more).
    next_at: dict[str, datetime] = {}
    for name, schedule_id in ids.items():
        [(at,)] = _query(dsn, "SELECT next_at FROM schedules WHERE id = %s", uuid.UUID(schedule_id))
        next_at[name] = at
    # One rule and one anchor, but each schedule is materialised at its own share of the
    # spread (core.schedules.lead), so at the kill one may have created an occurrence
    # more than another: each misses from its own next_at up to the same fourth.
    assert max(next_at.values()) - min(next_at.values()) <= timedelta(seconds=CATCHUP_EVERY_S)
    last_missed = max(next_at.values()) + timedelta(seconds=CATCHUP_EVERY_S * (MISSED - 1))
    fourth = last_missed + timedelta(seconds=CATCHUP_EVERY_S)
    missed_of = {
        name: [d for d in _grid(at, CATCHUP_EVERY_S, MISSED + 1) if d < fourth]
        for name, at in next_at.items()
    }
    missed = missed_of["skip"]
    # The restarted nodes decide at their first pass: the three must be older than the
    # grace by then, the fourth not.
    restart_at = last_missed + timedelta(seconds=GRACE_S + 0.2)
    await _until(restart_at)
    down_s = (datetime.now(UTC) - stopped_at).total_seconds()
    await asyncio.gather(
        asyncio.to_thread(cluster.start_node, "node-3"),
        asyncio.to_thread(cluster.start_node, "node-4"),
    )
    _start_worker(cluster, "worker-2")
    print(
        f"catchup: cluster down {down_s:.1f} s; missed {[d.isoformat() for d in missed]}"
        f" (skip; {len(missed_of['all'])} for all);"
        f" nodes serving {(datetime.now(UTC) - restart_at).total_seconds():.2f} s after"
        f" the restart (must decide within {CATCHUP_EVERY_S} s)"
    )

    def caught_up() -> bool:
        want = {
            "skip": [fourth],
            "latest": [last_missed, fourth],
            "all": [*missed_of["all"], fourth],
        }
        for name, dates in want.items():
            ran = {r.logical_date for r in _runs(dsn, ids[name])}
            if not set(dates) <= ran:
                return False
        return True

    await eventually(caught_up, timeout_s=40, what="catch-up runs and the next occurrence ran")

    for name, schedule_id in ids.items():
        missed = missed_of[name]
        occurrences = _occurrences(dsn, schedule_id)
        runs = _runs(dsn, schedule_id)
        in_missed = {d: o.origin for d, o in occurrences.items() if d in missed}
        if name == "skip":
            assert in_missed == {}, (name, in_missed)
        elif name == "latest":
            assert in_missed == {missed[-1]: "CATCHUP"}, (name, in_missed)
        else:
            assert in_missed == dict.fromkeys(missed, "CATCHUP"), (name, in_missed)
        # Before the stop and from the fourth on: on time, every date of the rule.
        others = {d: o.origin for d, o in occurrences.items() if d not in missed}
        assert set(others.values()) == {"SCHEDULE"}, (name, others)
        created_before = [d for d in others if d < missed[0]]
        assert created_before == _grid(first, CATCHUP_EVERY_S, len(created_before)), name
        assert fourth in others, (name, sorted(others))
        # Each one ran exactly once, as its own logical date.
        started = [r.logical_date for r in runs]
        assert len(started) == len(set(started)), (name, started)
        by_task = {o.task_id: d for d, o in occurrences.items()}
        for run in runs:
            assert by_task[run.task_id] == run.logical_date, (name, run)
        caught = [d for d, origin in in_missed.items() if origin == "CATCHUP"]
        assert set(caught) <= set(started), (name, caught, started)
        assert all(occurrences[d].status == "COMPLETED" for d in caught), name
        # The catch-up tasks are every task of a missed date: nothing else ran for them.
        tasks = [t for t in _schedule_tasks(dsn, schedule_id) if t[1] in missed]
        assert sorted(t[1] for t in tasks) == sorted(caught), (name, tasks)


# --- 3. the watchdog's derived expectation ---------------------------------------------------


@dataclass
class Watchdog:
    process: ManagedProcess
    http: str
    receiver: Receiver

    def metric(self, name: str) -> float:
        try:
            with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if series == name:
                return float(value)
        return 0.0

    def events(self, dedup_key: str) -> list[Received]:
        return [r for r in self.receiver.received() if r.dedup_key == dedup_key]


@contextlib.contextmanager
def _watchdog(dsn: str, log_dir: Path, receiver: Receiver) -> Iterator[Watchdog]:
    (port,) = free_ports(1)
    http = f"127.0.0.1:{port}"
    process = ManagedProcess(
        name="watchdog",
        argv=[sys.executable, "-m", "chronoshard.watchdog"],
        env={
            **os.environ,
            "CHRONOSHARD_NODE_ID": "watchdog",
            "CHRONOSHARD_HTTP_LISTEN": http,
            "CHRONOSHARD_DATABASE__DSN": dsn,
            "CHRONOSHARD_LOG_FORMAT": "text",
            "CHRONOSHARD_ELECTION__MECHANISM": "none",
            "CHRONOSHARD_CHECK_INTERVAL_S": str(CHECK_S),
            "CHRONOSHARD_RENOTIFY_INTERVAL_S": "0",
            "CHRONOSHARD_SINKS__WEBHOOK_URLS": receiver.url("/hook"),
        },
        log_path=log_dir / "watchdog.log",
    )
    process.start()
    try:
        yield Watchdog(process, http, receiver)
    except BaseException:
        print(f"==== watchdog\n{process.log(20_000)}")
        raise
    finally:
        if process.alive():
            process.stop(timeout_s=15)


def _wall(monotonic_at: float) -> datetime:
    """A ``time.monotonic()`` instant on the wall clock (the receiver stamps arrivals
    monotonically; PostgreSQL runs on this machine, so its clock is this one)."""
    return datetime.now(UTC) - timedelta(seconds=time.monotonic() - monotonic_at)


async def test_the_watchdog_alerts_a_missed_occurrence_once_and_resolves_it(
    fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path
) -> None:
    with (
        running_receiver() as receiver,
        _cluster(fresh_db_dsn, etcd, tmp_path, nodes=1, workers=1) as cluster,
        _watchdog(fresh_db_dsn, tmp_path, receiver) as watchdog,
    ):
        await _watched(cluster, watchdog)


async def _watched(cluster: Cluster, watchdog: Watchdog) -> None:
    dsn = cluster.dsn
    first = _whole_second(datetime.now(UTC) + timedelta(seconds=2))
    async with Client(cluster.targets(), api_key=cluster.api_key) as client:
        created = await client.create_schedule(
            _spec(
                "watched",
                WATCH_EVERY_S,
                first,
                watch=ScheduleWatch(expected_duration_s=EXPECTED_S, tolerance_s=TOLERANCE_S),
            )
        )
    schedule_id = created.id
    key = f"chronoshard/schedule/{schedule_id}"
    slack = timedelta(seconds=EXPECTED_S + TOLERANCE_S)

    # Healthy: two occurrences completed and the watchdog checked past their deadlines.
    await eventually(lambda: len(_runs(dsn, schedule_id)) >= 2, timeout_s=30, what="two runs")
    second_deadline = first + timedelta(seconds=WATCH_EVERY_S) + slack
    await _until(second_deadline)
    checks = watchdog.metric("chronoshard_watchdog_checks_total")
    await eventually(
        lambda: watchdog.metric("chronoshard_watchdog_checks_total") >= checks + 2,
        timeout_s=10,
        what="two watchdog checks after the second deadline",
    )
    assert watchdog.receiver.received() == [], "an alert while the schedule runs"

    # The schedule's only worker stops.
    [worker] = [w for w in cluster.group.workers if w.alive()]
    assert await asyncio.to_thread(worker.stop, 30) == 0
    stopped_at = datetime.now(UTC)

    await eventually(
        lambda: watchdog.events(key), timeout_s=WATCH_EVERY_S * 2 + 15, what="the trigger"
    )
    [trigger] = watchdog.events(key)
    arrived = _wall(trigger.at)
    alert = trigger.body["alert"]
    assert trigger.event == "trigger" and alert["kind"] == "schedule_missed", trigger.body
    # The occurrence it names: the first whose task never completed.
    occurrences = _occurrences(dsn, schedule_id)
    not_done = [d for d, o in occurrences.items() if o.status != "COMPLETED"]
    missed = min(not_done)
    assert missed > stopped_at - timedelta(seconds=WATCH_EVERY_S), (missed, stopped_at)
    details = alert["details"]
    assert datetime.fromisoformat(details["logical_date"]) == missed, details
    deadline = missed + slack
    assert datetime.fromisoformat(details["deadline"]) == deadline, details
    [(opened_at,)] = _query(dsn, "SELECT opened_at FROM alerts WHERE id = %s", alert["id"])
    MEASURED["watchdog_alert_after_deadline_s"] = (arrived - deadline).total_seconds()
    MEASURED["watchdog_opened_after_deadline_s"] = (opened_at - deadline).total_seconds()
    # Noticed (recorded, by the database's clock) and delivered not before the deadline
    # and by the first check after it.
    bound = deadline + timedelta(seconds=CHECK_S + CHECK_WORK_S)
    assert deadline <= opened_at <= bound, (opened_at, deadline)
    assert deadline <= arrived <= bound, (arrived, deadline)

    # Later occurrences miss too; the one incident stays one alert.
    two_more = deadline + timedelta(seconds=2 * WATCH_EVERY_S + CHECK_S)
    await _until(two_more)
    checks = watchdog.metric("chronoshard_watchdog_checks_total")
    await eventually(
        lambda: watchdog.metric("chronoshard_watchdog_checks_total") >= checks + 1,
        timeout_s=10,
        what="a watchdog check after two more missed deadlines",
    )
    assert [e.event for e in watchdog.events(key)] == ["trigger"]

    # A worker again: the waiting occurrences run, and the alert resolves, once.
    restarted_at = datetime.now(UTC)
    _start_worker(cluster, "worker-2")
    await eventually(
        lambda: [e for e in watchdog.events(key) if e.event == "resolve"],
        timeout_s=RESOLVE_TIMEOUT_S,
        what="the resolve",
    )
    events = watchdog.events(key)
    assert [e.event for e in events] == ["trigger", "resolve"]
    assert events[1].body["alert"]["id"] == alert["id"]
    resolved = _wall(events[1].at)
    [(completed,)] = _query(
        dsn,
        "SELECT min(completed_at) FROM task_completions WHERE tenant_id = %s AND job_id = %s"
        " AND completed_at >= %s",
        cluster.tenant.tenant.id,
        "watched",
        restarted_at,
    )
    assert completed is not None
    MEASURED["watchdog_resolve_after_completion_s"] = (resolved - completed).total_seconds()
    MEASURED["watchdog_resolve_after_worker_start_s"] = (resolved - restarted_at).total_seconds()
    # At the first check after an occurrence completed.
    bound = completed + timedelta(seconds=CHECK_S + CHECK_WORK_S)
    assert completed <= resolved <= bound, (completed, resolved)
    # And it stays resolved while the schedule runs.
    checks = watchdog.metric("chronoshard_watchdog_checks_total")
    await eventually(
        lambda: watchdog.metric("chronoshard_watchdog_checks_total") >= checks + 2,
        timeout_s=10,
        what="two more checks",
    )
    assert [e.event for e in watchdog.events(key)] == ["trigger", "resolve"]
    print("schedule e2e measurements:", {k: round(v, 3) for k, v in MEASURED.items()})

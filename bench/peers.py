"""``python -m bench peers``: Chronoshard against Celery and Procrastinate (issue 14).

Each system runs on this machine, one after the other in the same sitting, with the same
producer, the same shape of worker pool and the same handler:

* **Chronoshard**: one scheduler node (``bench._cluster.node``: fresh database, fresh
  cluster name), 2 worker processes with 10 slots each running
  ``bench._peers.chronoshard_app``; tasks are strict (``strict_timing``).
* **Celery** (the ``bench`` extra): one ``celery worker`` with the prefork pool,
  concurrency 2 (2 worker processes) and prefetch multiplier 4, on Redis (``--redis``,
  a queue of its own per run, no result backend); a task at an instant is an ``eta``.
* **Procrastinate** (the ``bench`` extra): 2 ``procrastinate worker`` processes with
  concurrency 4 on a fresh database of the same PostgreSQL server; a task at an instant
  is ``schedule_at``, found by a worker's poll (``--procrastinate-poll-s``, 0.1 s here;
  Procrastinate's default is 5 s) once due.

The handler is ``bench._peers.stamps.record``: it writes ``KEY START_US`` to its
process's file and returns. All times are this machine's wall clock.

Workloads (one producer, this process):

* ``stampede``: ``--tasks`` (10,000) tasks all due at one absolute instant T, submitted
  beforehand in batches of 1,000 while the workers run. Lateness is handler start − T
  (p50/p99); *last start* is T → the last handler start; *last completion* is T → the
  last completion the system records (Chronoshard's ``tasks.finished_at``,
  Procrastinate's ``succeeded`` event; Celery acknowledges a message before its handler
  and keeps no result here, so for Celery it is the last handler start); the completion
  rate is tasks ÷ that.
* ``submit``: ``--tasks`` (2,000) tasks, one call per task, each awaited before the
  next; no workers (tasks due two hours out). Tasks/s and the ack (call → answer) p50.
* ``submit-batch``: ``--tasks`` (20,000) tasks in calls of 1,000, one call at a time; no
  workers. Tasks/s and the call p50. Celery has no batch publish: a ``group`` of 1,000
  signatures is its one call, published message by message.
* ``steady``: ``--rate`` (200) tasks/s due evenly over ``--duration-s`` (30), submitted
  beforehand; lateness = handler start − the task's own instant (p50/p99/max).

CPU seconds per 1,000 tasks (completed, or acknowledged for the submit workloads) are
read from ``/proc`` per kind of process: the producer (this process), the node
(Chronoshard's scheduler), PostgreSQL (the whole server: other users of it count too),
the workers (every process of the pool) and the broker (Redis for Celery, etcd for
Chronoshard when the suite started it). A kind a system does not use is "—". Two
counts of the PostgreSQL server per 1,000 tasks follow: the transactions that wrote
(:func:`write_transactions`) and the WAL flushes (:func:`wal_flushes`): how many tasks
a system's rounds and its durable commits carry.

``--runs K`` repeats each system's run K times and reports every run and the median of
each column; ``--lock PATH`` takes an exclusive ``flock`` on PATH around each run alone,
so that other heavy jobs on a shared machine can run between them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import importlib.util
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import psycopg
import uvloop
from harness.processes import ManagedProcess

from bench import timing
from bench._cluster import (
    REPO,
    Infrastructure,
    cpu_by_pid,
    cpu_used,
    node,
    postgres_pids,
    wait_until,
)
from bench._peers import stamps
from bench._report import Report, ms, percentile

SYSTEMS = ("chronoshard", "celery", "procrastinate")
WORKLOADS = ("stampede", "submit", "submit-batch", "steady")
DEFAULT_TASKS = {"stampede": 10_000, "submit": 2_000, "submit-batch": 20_000}
KINDS = ("producer", "node", "postgres", "workers", "broker")
WAL_FLUSHES = "WAL flushes per 1,000 tasks"
WRITE_TRANSACTIONS = "write transactions per 1,000 tasks"

WORKER_PROCESSES = 2
CHRONOSHARD_SLOTS = 10
CELERY_CONCURRENCY = 2
CELERY_PREFETCH_MULTIPLIER = 4
PROCRASTINATE_CONCURRENCY = 4
PROCRASTINATE_POLL_S = 0.1
BATCH = 1000
FAR_OUT = timedelta(hours=2)
# The instant is set this far ahead of the submission's start: a fixed margin plus a
# pessimistic batched submit rate (Celery publishes ~1,000 messages/s here). A run whose
# tasks were not all submitted and loaded by then says so in its notes.
LEAD_FIXED_S = 3.0
LEAD_RATE = 700.0
WARMUP_TASKS = 4
READY_TIMEOUT_S = 60.0
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


class System(Protocol):
    """One system under test, set up for one run."""

    name: str

    async def submit_one(self, key: int, at: datetime) -> None: ...

    async def submit_batch(self, items: Sequence[tuple[int, datetime]]) -> None: ...

    async def start_workers(self) -> None:
        """Start the worker processes and return once they took a few tasks."""

    def pids(self) -> dict[str, list[int]]:
        """The processes of each kind (of :data:`KINDS`) this system uses."""

    def ready_by(self, total: int, instant: datetime) -> bool:
        """Wait until all ``total`` tasks are where the system fires them from (or the
        instant passed); whether they all were in time."""

    def completion(self, instant: datetime) -> tuple[int, float]:
        """(tasks the system records as completed, seconds from ``instant`` to the last
        such record); NaN seconds where it records none."""


@dataclass
class Options:
    workload: str
    tasks: int
    rate: float
    duration_s: float
    redis: str
    procrastinate_poll_s: float
    timeout_s: float
    chronoshard_prefetch: int = 0
    chronoshard_nodes: int = 1
    chronoshard_stream: bool = False


@dataclass
class RunResult:
    values: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    tasks: int = 0
    """What the per-task columns divide by (the tasks started, or submitted)."""


# --- Chronoshard ----------------------------------------------------------------------


class _Chronoshard:
    name = "chronoshard"

    def __init__(
        self,
        infra: Infrastructure,
        n: Any,
        client: Any,
        stamps_dir: Path,
        prefetch: int,
        stream: Any = None,
    ) -> None:
        self._infra, self._node, self._client, self._stamps_dir = infra, n, client, stamps_dir
        self._prefetch = prefetch
        # With --chronoshard-stream, single submits go on this SubmitStream.
        self._stream = stream

    async def submit_one(self, key: int, at: datetime) -> None:
        if self._stream is None:
            await self._client.submit("bench.stamp", {"i": key}, at=at, strict_timing=True)
            return
        from chronoshard import TaskSpec

        await self._stream.submit(
            TaskSpec(type="bench.stamp", payload={"i": key}, at=at, strict_timing=True)
        )

    async def submit_batch(self, items: Sequence[tuple[int, datetime]]) -> None:
        from chronoshard import SubmitResult, TaskSpec

        results = await self._client.submit_batch(
            [
                TaskSpec(type="bench.stamp", payload={"i": key}, at=at, strict_timing=True)
                for key, at in items
            ]
        )
        refused = [r for r in results if not isinstance(r, SubmitResult)]
        if refused:
            raise RuntimeError(f"{len(refused)} submits refused: {refused[0]}")

    async def start_workers(self) -> None:
        self._node.start_workers(
            WORKER_PROCESSES,
            CHRONOSHARD_SLOTS,
            prefetch=self._prefetch,
            spec="bench._peers.chronoshard_app:worker",
            pythonpath=REPO,
            BENCH_STAMPS_DIR=str(self._stamps_dir),
        )
        await _warm_up(self, self._stamps_dir, self._node.group.logs)

    def pids(self) -> dict[str, list[int]]:
        etcd = self._infra.etcd_pid
        return {
            "node": [s.process.pid for s in self._node.schedulers],
            "postgres": postgres_pids(self._node.dsn),
            "workers": self._node.worker_pids(),
            "broker": [] if etcd is None else [etcd],
        }

    def ready_by(self, total: int, instant: datetime) -> bool:
        # The node fires a strict task from its wheel: every task must be preloaded. The
        # count is of tasks due from ``instant`` on, which leaves the warm-up's out
        # (counting them in, as this did, flagged every run as not loaded in time).
        return timing._wait_preloaded(self._node.dsn, total, instant, instant + timedelta(days=1))

    def completion(self, instant: datetime) -> tuple[int, float]:
        with psycopg.connect(self._node.dsn) as conn:
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM max(finished_at) - %s) FROM tasks"
                " WHERE status = 'COMPLETED' AND (payload->>'i')::int >= 0",
                (instant,),
            ).fetchone()
        assert row is not None
        return int(row[0]), math.nan if row[1] is None else float(row[1])


@contextlib.asynccontextmanager
async def _chronoshard(
    infra: Infrastructure, stamps_dir: Path, options: Options
) -> AsyncIterator[System]:
    from chronoshard import Client

    with node(infra, "peers", env=timing._env(None), nodes=options.chronoshard_nodes) as n:
        async with Client(n.address, api_key=n.api_key) as client:
            prefetch = options.chronoshard_prefetch
            if not options.chronoshard_stream:
                yield _Chronoshard(infra, n, client, stamps_dir, prefetch)
                return
            async with client.submit_stream() as stream:
                yield _Chronoshard(infra, n, client, stamps_dir, prefetch, stream)


# --- Celery ---------------------------------------------------------------------------


class _Celery:
    name = "celery"

    def __init__(self, stamps_dir: Path, logs: Path, broker: str) -> None:
        from bench._peers import celery_app

        self._app = celery_app.app
        self._app.conf.broker_url = broker
        self._task = celery_app.stamp
        self._broker = broker
        self._queue = f"bench-peers-{uuid.uuid4().hex[:8]}"
        self._stamps_dir, self._logs = stamps_dir, logs
        self._worker: ManagedProcess | None = None
        import redis

        self._redis = redis.Redis.from_url(broker)

    async def submit_one(self, key: int, at: datetime) -> None:
        self._task.apply_async(args=(key,), eta=at, queue=self._queue)

    async def submit_batch(self, items: Sequence[tuple[int, datetime]]) -> None:
        from celery import group

        group(self._task.si(key).set(eta=at, queue=self._queue) for key, at in items).apply_async()

    async def start_workers(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench._peers.celery_app",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(CELERY_CONCURRENCY),
            "--prefetch-multiplier",
            str(CELERY_PREFETCH_MULTIPLIER),
            "--queues",
            self._queue,
            "--hostname",
            f"{self._queue}@%h",
            "--loglevel",
            "WARNING",
            # No cluster chatter between workers: there is one, and none of it is work.
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
        self._worker = ManagedProcess(
            name="celery-worker",
            argv=argv,
            env={**os.environ, **_peer_env(self._stamps_dir), "BENCH_CELERY_BROKER": self._broker},
            log_path=self._logs / "celery-worker.log",
        )
        self._worker.start()
        await _warm_up(self, self._stamps_dir, self._worker.log)

    def pids(self) -> dict[str, list[int]]:
        workers: list[int] = []
        if self._worker is not None:
            workers = [self._worker.pid, *_children(self._worker.pid)]
        redis_pid = int(self._redis.info("server")["process_id"])
        return {"workers": workers, "broker": [redis_pid] if _local(redis_pid) else []}

    def ready_by(self, total: int, instant: datetime) -> bool:
        # The worker holds an eta task in memory until it is due: every message must have
        # left the queue for the worker.
        while True:
            waiting = int(self._redis.llen(self._queue))
            if waiting == 0 or datetime.now(UTC) >= instant:
                return waiting == 0
            time.sleep(0.1)

    def completion(self, instant: datetime) -> tuple[int, float]:
        return 0, math.nan

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop()
        # What a run leaves in Redis: its queue (the submit workloads run no worker).
        self._redis.delete(self._queue)
        self._redis.close()


@contextlib.asynccontextmanager
async def _celery(
    infra: Infrastructure, stamps_dir: Path, options: Options
) -> AsyncIterator[System]:
    with tempfile.TemporaryDirectory() as logs:
        system = _Celery(stamps_dir, Path(logs), options.redis)
        try:
            yield system
        finally:
            system.close()


# --- Procrastinate --------------------------------------------------------------------


class _Procrastinate:
    name = "procrastinate"

    def __init__(self, app: Any, dsn: str, stamps_dir: Path, logs: Path, poll_s: float) -> None:
        self._app, self._dsn = app, dsn
        self._stamps_dir, self._logs, self._poll_s = stamps_dir, logs, poll_s
        self._workers: list[ManagedProcess] = []

    async def submit_one(self, key: int, at: datetime) -> None:
        await self._app.configure_task("bench.stamp", schedule_at=at).defer_async(i=key)

    async def submit_batch(self, items: Sequence[tuple[int, datetime]]) -> None:
        instants = {at for _, at in items}
        if len(instants) == 1:
            deferrer = self._app.configure_task("bench.stamp", schedule_at=instants.pop())
            await deferrer.batch_defer_async(*({"i": key} for key, _ in items))
            return
        # A batch of different instants: batch_defer takes one schedule_at, so the jobs
        # are built one by one and deferred together through the job manager.
        deferrer = self._app.configure_task("bench.stamp")
        jobs = [deferrer.make_new_job(i=key).evolve(scheduled_at=at) for key, at in items]
        await self._app.job_manager.batch_defer_jobs_async(jobs=jobs)

    async def start_workers(self) -> None:
        for i in range(WORKER_PROCESSES):
            argv = [
                sys.executable,
                "-m",
                "procrastinate",
                "--app",
                "bench._peers.procrastinate_app.app",
                "--log-level",
                "warning",
                "worker",
                "--name",
                f"worker-{i + 1}",
                "--concurrency",
                str(PROCRASTINATE_CONCURRENCY),
                "--fetch-job-polling-interval",
                str(self._poll_s),
            ]
            process = ManagedProcess(
                name=f"procrastinate-{i + 1}",
                argv=argv,
                env={**os.environ, **_peer_env(self._stamps_dir), "BENCH_DSN": self._dsn},
                log_path=self._logs / f"procrastinate-{i + 1}.log",
            )
            process.start()
            self._workers.append(process)
        wait_until(
            lambda: (
                _count(self._dsn, "SELECT count(*) FROM procrastinate_workers") >= WORKER_PROCESSES
            ),
            what="procrastinate workers",
            timeout_s=READY_TIMEOUT_S,
        )
        await _warm_up(self, self._stamps_dir, self._logs_text)

    def _logs_text(self) -> str:
        return "\n".join(w.log() for w in self._workers)

    def pids(self) -> dict[str, list[int]]:
        return {"postgres": postgres_pids(self._dsn), "workers": [w.pid for w in self._workers]}

    def ready_by(self, total: int, instant: datetime) -> bool:
        return True  # a deferred job is a committed row: the workers' fetch finds it

    def completion(self, instant: datetime) -> tuple[int, float]:
        with psycopg.connect(self._dsn) as conn:
            row = conn.execute(
                "SELECT count(*), extract(epoch FROM max(e.at) - %s)"
                " FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id"
                " WHERE e.type = 'succeeded' AND (j.args->>'i')::int >= 0",
                (instant,),
            ).fetchone()
        assert row is not None
        return int(row[0]), math.nan if row[1] is None else float(row[1])

    def close(self) -> None:
        for process in self._workers:
            process.stop()


@contextlib.asynccontextmanager
async def _procrastinate(
    infra: Infrastructure, stamps_dir: Path, options: Options
) -> AsyncIterator[System]:
    import procrastinate

    name = f"bench_peers_{uuid.uuid4().hex[:8]}"
    infra.server.create_database(name)
    try:
        dsn = infra.server.dsn_for(name)
        # The producer's own app, without the tasks: it defers by name, as a producer in
        # another code base would (the workers import bench._peers.procrastinate_app).
        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
        with tempfile.TemporaryDirectory() as logs:
            async with app.open_async():
                await app.schema_manager.apply_schema_async()
                system = _Procrastinate(
                    app, dsn, stamps_dir, Path(logs), options.procrastinate_poll_s
                )
                try:
                    yield system
                finally:
                    system.close()
    finally:
        infra.server.drop_database(name)


OPENERS: dict[
    str, Callable[[Infrastructure, Path, Options], contextlib.AbstractAsyncContextManager[System]]
] = {
    "chronoshard": _chronoshard,
    "celery": _celery,
    "procrastinate": _procrastinate,
}


def available(system: str) -> str | None:
    """Why ``system`` cannot run here (its package is missing), or None."""
    package = {"celery": "celery", "procrastinate": "procrastinate"}.get(system)
    if package is not None and importlib.util.find_spec(package) is None:
        return f"{system} is not installed (pip install -e '.[bench]')"
    return None


# --- shared helpers -------------------------------------------------------------------


def _peer_env(stamps_dir: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in [str(REPO), os.environ.get("PYTHONPATH", "")] if p)
    return {"PYTHONPATH": path, stamps.STAMPS_DIR_ENV: str(stamps_dir)}


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/status") as status:
                for line in status:
                    if line.startswith("PPid:"):
                        if int(line.split()[1]) == pid:
                            found.append(int(entry))
                        break
    return found


def _local(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}/stat")


def _count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql).fetchone()
    return 0 if row is None else int(row[0])


async def _warm_up(system: System, stamps_dir: Path, logs: Callable[[], str]) -> None:
    """Run a few tasks due now (keys below zero, never counted) and wait for them: the
    workers are up and every connection on the path is open before anything is timed."""
    now = datetime.now(UTC)
    await system.submit_batch([(-1 - i, now) for i in range(WARMUP_TASKS)])
    deadline = time.monotonic() + READY_TIMEOUT_S
    while sum(1 for k, _ in stamps.read(stamps_dir) if k < 0) < WARMUP_TASKS:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{system.name}: warm-up tasks did not run\n{logs()[-4000:]}")
        await asyncio.sleep(0.05)


# --- the workloads --------------------------------------------------------------------


class Cpu:
    """CPU seconds used by each kind of process between :meth:`start` and :meth:`stop`."""

    def __init__(self, system: System) -> None:
        self._system = system
        self._before: dict[str, dict[int, float]] = {}
        self.used: dict[str, float | None] = {}

    def _snapshot(self) -> dict[str, dict[int, float]]:
        found = {kind: cpu_by_pid(pids) for kind, pids in self._system.pids().items() if pids}
        found["producer"] = cpu_by_pid([os.getpid()])
        return found

    def start(self) -> None:
        self._before = self._snapshot()

    def stop(self) -> None:
        after = self._snapshot()
        self.used = {
            kind: cpu_used(self._before[kind], after[kind])
            if kind in self._before and kind in after
            else None
            for kind in KINDS
        }


def _cpu_values(cpu: Cpu, tasks: int) -> dict[str, Any]:
    return {
        f"CPU s/1,000 {kind}": math.nan if used is None else used / max(tasks, 1) * 1000
        for kind, used in cpu.used.items()
    }


class ServerCount:
    """A counter of the whole PostgreSQL server (``query`` answers one integer) read at
    :meth:`start` and :meth:`stop`; what it moved by, per 1,000 tasks. NaN where the
    server cannot answer it."""

    def __init__(self, admin_dsn: str, query: str) -> None:
        self._admin_dsn = admin_dsn
        self._query = query
        self._before: int | None = None
        self.used: int | None = None

    def _read(self) -> int | None:
        try:
            with psycopg.connect(self._admin_dsn, autocommit=True) as conn:
                row = conn.execute(self._query).fetchone()
        except psycopg.Error:
            return None
        return None if row is None else int(row[0])

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> None:
        after = self._read()
        self.used = None if self._before is None or after is None else after - self._before

    def per_1000(self, tasks: int) -> float:
        return math.nan if self.used is None else self.used / max(tasks, 1) * 1000


def wal_flushes(admin_dsn: str) -> ServerCount:
    """PostgreSQL's WAL flushes (``pg_stat_wal.wal_sync``; PostgreSQL 14 and later). With
    synchronous_commit on, a durable commit waits for one (commits that overlap share
    it), so per task they show how many tasks a system's commits carry: what its costs
    per commit are divided by.

    Stopped once the system's database is dropped, not when the timed span ends: a
    backend reports its counts to the view at most once a second, and one that then goes
    idle holds the rest for up to ten (PostgreSQL's cumulative statistics), so a read at
    the span's end missed ~14 % of a 10,000-task stampede's flushes here. A backend that
    exits reports everything; dropping the database ends them all. What the system does
    between the span's end and its stop (a few commits) is counted too."""
    return ServerCount(admin_dsn, "SELECT wal_sync FROM pg_stat_wal")


def write_transactions(admin_dsn: str) -> ServerCount:
    """Transactions that wrote: the transaction ids assigned (the next id to assign,
    ``pg_snapshot_xmax`` of a snapshot, which takes none itself; PostgreSQL 13 and
    later). A read-only transaction takes no id. Ids are assigned as transactions write,
    not reported later, so this is stopped when the timed span ends. Per task it shows
    how many tasks a write transaction (a round) carries."""
    return ServerCount(admin_dsn, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")


class _ServerCounts:
    """The server counters of one run: started together when the timed span starts,
    each stopped where its docstring says (:meth:`span_ended`, :meth:`system_gone`)."""

    def __init__(self, admin_dsn: str) -> None:
        self._wal = wal_flushes(admin_dsn)
        self._xids = write_transactions(admin_dsn)

    def start(self) -> None:
        self._wal.start()
        self._xids.start()

    def span_ended(self) -> None:
        self._xids.stop()

    def system_gone(self, result: RunResult) -> None:
        """The system's database is dropped (its backends reported everything): the
        WAL count is read, and both columns go into ``result``."""
        self._wal.stop()
        result.values[WAL_FLUSHES] = self._wal.per_1000(result.tasks)
        result.values[WRITE_TRANSACTIONS] = self._xids.per_1000(result.tasks)


def _chunks(items: Sequence[tuple[int, datetime]]) -> list[Sequence[tuple[int, datetime]]]:
    return [items[i : i + BATCH] for i in range(0, len(items), BATCH)]


async def _wait_started(stamps_dir: Path, total: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if sum(1 for k, _ in stamps.read(stamps_dir) if k >= 0) >= total:
            return
        await asyncio.sleep(0.1)


async def _timed(
    system: System, stamps_dir: Path, dues: list[datetime], o: Options, server: _ServerCounts
) -> RunResult:
    """Submit tasks due at ``dues`` (batches of 1,000) while the workers run, let them
    fall due, and measure each handler's start against its own instant."""
    await system.start_workers()
    notes = []
    submitted_at = time.monotonic()
    for chunk in _chunks(list(enumerate(dues))):
        await system.submit_batch(chunk)
    submit_s = time.monotonic() - submitted_at
    first = min(dues)
    if not system.ready_by(len(dues), first):
        notes.append(
            f"{system.name}: NOT every task was loaded before the first fell due "
            f"(submitted in {submit_s:.1f} s): its lateness includes that"
        )
    await asyncio.sleep(max(0.0, (first - datetime.now(UTC)).total_seconds()))
    cpu = Cpu(system)
    cpu.start()
    server.start()
    deadline = time.monotonic() + (max(dues) - first).total_seconds() + o.timeout_s
    await _wait_started(stamps_dir, len(dues), deadline)
    completed, last_completion_s = system.completion(first)
    while completed < len(dues) and not math.isnan(last_completion_s):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
        completed, last_completion_s = system.completion(first)
    cpu.stop()
    server.span_ended()
    found = [(k, us) for k, us in stamps.read(stamps_dir) if k >= 0]
    counts = Counter(k for k, _ in found)
    first_us = {k: us for k, us in sorted(found, key=lambda f: -f[1])}  # earliest wins
    due_us = [_micros(d) for d in dues]
    lateness = [(us - due_us[k]) / 1e6 for k, us in first_us.items()]
    last_start_s = (max(first_us.values()) - _micros(first)) / 1e6 if first_us else math.nan
    if math.isnan(last_completion_s):
        completed, last_completion_s = len(first_us), last_start_s
    lost = len(dues) - len(first_us)
    doubled = sum(1 for c in counts.values() if c > 1)
    if lost:
        notes.append(f"{system.name}: {lost:,} tasks never started within the timeout")
    return RunResult(
        {
            "started": len(first_us),
            "lateness p50": percentile(lateness, 50),
            "lateness p99": percentile(lateness, 99),
            "lateness max": max(lateness, default=math.nan),
            "early": sum(1 for x in lateness if x < 0),
            "last start s": last_start_s,
            "last completion s": last_completion_s,
            "completion rate/s": completed / last_completion_s
            if last_completion_s > 0
            else math.nan,
            "lost": lost,
            "doubled": doubled,
            "submit s": submit_s,
            **_cpu_values(cpu, len(first_us)),
        },
        notes,
        tasks=len(first_us),
    )


def _micros(at: datetime) -> int:
    return round(at.timestamp() * 1e6)


async def _submits(system: System, o: Options, batched: bool, server: _ServerCounts) -> RunResult:
    """Submit ``o.tasks`` tasks due two hours out, one call at a time; no workers."""
    at = datetime.now(UTC) + FAR_OUT
    await system.submit_one(-1, at)  # connections open before the clock starts
    items = [(i, at) for i in range(o.tasks)]
    calls = _chunks(items) if batched else [[item] for item in items]
    latencies = []
    cpu = Cpu(system)
    cpu.start()
    server.start()
    started = time.perf_counter()
    for call in calls:
        t0 = time.perf_counter()
        if batched:
            await system.submit_batch(call)
        else:
            await system.submit_one(*call[0])
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    cpu.stop()
    server.span_ended()
    return RunResult(
        {
            "tasks/s": o.tasks / elapsed,
            "call p50": percentile(latencies, 50),
            "call p99": percentile(latencies, 99),
            **_cpu_values(cpu, o.tasks),
        },
        tasks=o.tasks,
    )


async def run_once(system_name: str, infra: Infrastructure, o: Options) -> RunResult:
    """One run of ``o.workload`` against one system, on fresh state."""
    stamps_dir = Path(tempfile.mkdtemp(prefix="bench-peers-stamps-"))
    server = _ServerCounts(infra.server.admin_dsn)
    try:
        async with OPENERS[system_name](infra, stamps_dir, o) as system:
            result = await _workload(system, stamps_dir, o, server)
    finally:
        shutil.rmtree(stamps_dir, ignore_errors=True)
    server.system_gone(result)
    return result


async def _workload(
    system: System, stamps_dir: Path, o: Options, server: _ServerCounts
) -> RunResult:
    if o.workload in ("submit", "submit-batch"):
        return await _submits(system, o, o.workload == "submit-batch", server)
    if o.workload == "stampede":
        tasks = o.tasks
        instant = datetime.now(UTC) + timedelta(seconds=LEAD_FIXED_S + tasks / LEAD_RATE)
        return await _timed(system, stamps_dir, [instant] * tasks, o, server)
    tasks = int(o.rate * o.duration_s)
    start = datetime.now(UTC) + timedelta(seconds=LEAD_FIXED_S + tasks / LEAD_RATE)
    dues = [start + timedelta(seconds=i / o.rate) for i in range(tasks)]
    return await _timed(system, stamps_dir, dues, o, server)


@contextlib.contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    with path.open("a") as lock:
        # The same lock flock(1) takes: heavy jobs of other sessions wait for this run.
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# --- the report -----------------------------------------------------------------------

_COLUMNS = {
    "stampede": [
        "started",
        "lateness p50",
        "lateness p99",
        "last start s",
        "last completion s",
        "completion rate/s",
        "lost",
        "doubled",
    ],
    "steady": [
        "started",
        "lateness p50",
        "lateness p99",
        "lateness max",
        "early",
        "lost",
        "doubled",
    ],
    "submit": ["tasks/s", "call p50", "call p99"],
    "submit-batch": ["tasks/s", "call p50", "call p99"],
}
_LABELS = {"call p50": "ack p50", "call p99": "ack p99"}


def _median(values: list[Any]) -> Any:
    numbers = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
    if not numbers:
        return math.nan
    middle = statistics.median(numbers)
    return round(middle) if all(isinstance(v, int) for v in numbers) else float(middle)


def _cells(workload: str, values: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for column in _COLUMNS[workload]:
        label = _LABELS.get(column, column) if workload == "submit" else column
        if workload == "submit-batch":
            label = {"call p50": "call p50 (1,000)", "call p99": "call p99 (1,000)"}.get(
                column, column
            )
        value = values.get(column, math.nan)
        if column.startswith(("lateness", "call")) and isinstance(value, float):
            # A stampede's lateness runs to tens of seconds: milliseconds only below one.
            value = ms(value) if math.isnan(value) or abs(value) < 1 else f"{value:.2f} s"
        elif column.endswith(" s") and isinstance(value, float):
            value = "—" if math.isnan(value) else f"{value:.2f} s"
        row[label] = value
    row["CPU s per 1,000 tasks: " + " / ".join(KINDS)] = " / ".join(
        "—" if math.isnan(values[f"CPU s/1,000 {k}"]) else f"{values[f'CPU s/1,000 {k}']:.2f}"
        for k in KINDS
    )
    for column in (WRITE_TRANSACTIONS, WAL_FLUSHES):
        count = values.get(column, math.nan)
        row[column] = "—" if math.isnan(count) else f"{count:,.0f}"
    return row


def peers(
    infra: Infrastructure,
    *,
    workload: str,
    systems: Sequence[str],
    runs: int,
    tasks: int | None = None,
    rate: float = 200.0,
    duration_s: float = 30.0,
    redis: str = DEFAULT_REDIS,
    procrastinate_poll_s: float = PROCRASTINATE_POLL_S,
    lock: Path | None = None,
    chronoshard_prefetch: int = 0,
    chronoshard_nodes: int = 1,
    chronoshard_stream: bool = False,
) -> Report:
    count = tasks if tasks is not None else DEFAULT_TASKS.get(workload, int(rate * duration_s))
    o = Options(
        workload=workload,
        tasks=count,
        rate=rate,
        duration_s=duration_s,
        redis=redis,
        procrastinate_poll_s=procrastinate_poll_s,
        # After the last instant, how long the slowest system is waited for.
        timeout_s=max(60.0, count / 100),
        chronoshard_prefetch=chronoshard_prefetch,
        chronoshard_nodes=chronoshard_nodes,
        chronoshard_stream=chronoshard_stream,
    )
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for system in systems:
        why_not = available(system)
        if why_not is not None:
            notes.append(f"skipped {why_not}")
            print(f"peers: skipped {why_not}", file=sys.stderr)
            continue
        results = []
        for run in range(runs):
            with _locked(lock):
                result = uvloop.run(run_once(system, infra, o))
            results.append(result)
            notes += [f"run {run + 1}: {n}" for n in result.notes]
            rows.append({"system": system, "run": str(run + 1), **_cells(workload, result.values)})
            print(f"peers: {system} run {run + 1}: {rows[-1]}", file=sys.stderr)
        if runs > 1:
            medians = {k: _median([r.values[k] for r in results]) for k in results[0].values}
            rows.append({"system": system, "run": f"median of {runs}", **_cells(workload, medians)})
    parameters: dict[str, Any] = {"systems": ",".join(systems), "runs": runs}
    if workload in ("stampede", "submit", "submit-batch"):
        parameters["tasks"] = o.tasks
    if workload == "submit":
        parameters["chronoshard submits"] = (
            "on one SubmitStream" if chronoshard_stream else "a SubmitTask call each"
        )
    if workload == "steady":
        parameters.update(rate_per_s=rate, duration_s=duration_s, tasks=int(rate * duration_s))
    if workload in ("stampede", "steady"):
        parameters.update(
            {
                "chronoshard": f"{chronoshard_nodes} node(s),"
                f" {WORKER_PROCESSES} workers × {CHRONOSHARD_SLOTS} slots"
                f" (prefetch {chronoshard_prefetch}), strict",
                "celery": f"prefork concurrency {CELERY_CONCURRENCY},"
                f" prefetch ×{CELERY_PREFETCH_MULTIPLIER}, eta",
                "procrastinate": f"{WORKER_PROCESSES} workers ×"
                f" concurrency {PROCRASTINATE_CONCURRENCY}, poll {procrastinate_poll_s:g} s,"
                " schedule_at",
                "submitted in batches of": BATCH,
            }
        )
    else:
        parameters["calls"] = "one at a time" + (
            f", {BATCH:,} tasks each" if workload == "submit-batch" else ""
        )
    parameters.update(celery=_version("celery"), procrastinate=_version("procrastinate"))
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    return Report(
        workload=f"peers {workload}",
        command="",
        parameters=parameters,
        columns=columns,
        rows=rows,
        notes=notes,
    )


def _version(package: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``python -m bench peers``: registered by ``bench/__main__.py``."""
    p = sub.add_parser("peers", parents=[common], help="Chronoshard vs Celery and Procrastinate")
    p.add_argument("--workload", choices=WORKLOADS, required=True)
    p.add_argument(
        "--system",
        choices=[*SYSTEMS, "all"],
        default="all",
        help="one system, or all three one after the other",
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--tasks", type=int, help="stampede 10,000; submit 2,000; submit-batch 20,000")
    p.add_argument("--rate", type=float, default=200.0, help="steady: tasks per second")
    p.add_argument("--duration-s", type=float, default=30.0, help="steady: seconds")
    p.add_argument("--redis", default=DEFAULT_REDIS, help="Celery's broker")
    p.add_argument("--procrastinate-poll-s", type=float, default=PROCRASTINATE_POLL_S)
    p.add_argument("--lock", type=Path, help="flock this file around each run")
    p.add_argument(
        "--chronoshard-prefetch",
        type=int,
        default=0,
        help="assignments each Chronoshard worker holds beyond its 10 slots",
    )
    p.add_argument(
        "--chronoshard-nodes",
        type=int,
        default=1,
        help="Chronoshard scheduler processes (the shards spread over them; each worker "
        "connects to all; the producer calls the first)",
    )
    p.add_argument(
        "--chronoshard-stream",
        action="store_true",
        help="Chronoshard's single submits on one SubmitStream (Client.submit_stream) "
        "instead of a SubmitTask call each",
    )
    p.set_defaults(
        run=lambda a, i: peers(
            i,
            workload=a.workload,
            systems=SYSTEMS if a.system == "all" else [a.system],
            runs=a.runs,
            tasks=a.tasks,
            rate=a.rate,
            duration_s=a.duration_s,
            redis=a.redis,
            procrastinate_poll_s=a.procrastinate_poll_s,
            lock=a.lock.expanduser() if a.lock else None,
            chronoshard_prefetch=a.chronoshard_prefetch,
            chronoshard_nodes=a.chronoshard_nodes,
            chronoshard_stream=a.chronoshard_stream,
        )
    )

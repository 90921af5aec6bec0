"""Benchmark: what heartbeats of many running tasks cost one scheduler node.

docs/architecture.md#d7: every worker heartbeats all its running (task, token) pairs every 5 s; the
node extends their leases in one group-committed statement per batch. This measures the
cost of that at 10,000 running tasks with the default intervals (heartbeat 5 s, lease
30 s): the scheduler process's CPU (``utime + stime`` from ``/proc/<pid>/stat`` over a
measured window, as a share of one core) and the database statements it issues per
second.

Set-up: PostgreSQL (embedded unless ``--dsn``) and etcd (a child process unless
``--etcd``), a migrated database, one tenant, and one real scheduler process
(``python -m chronoshard.scheduler``). The workers are **simulated** in this process:
each opens a real ``WorkerService.Connect`` stream and speaks the raw protocol (Hello,
CreditGrant, Ack every assignment, Heartbeat every interval the node's Welcome asks for,
first beat at a random offset as independently started workers would), but runs no
handler and never settles, so 10,000 tasks stay RUNNING without 10,000 sleeping SDK
handlers competing for the same two cores. Tasks are submitted through the public
client, dispatched by the node as usual, and acknowledged.

After a warm-up (start-up work, and PostgreSQL's lazy statistics), two windows are
measured: **idle** (workers connected, nothing running: the node's own loops) and
**running** (every task RUNNING and heartbeated). Statements come from two sources: the
gateway's counters (``heartbeat_statements``: exact, one ``extend_leases`` per group
commit) and ``pg_stat_database.xact_commit`` of the node's database (every transaction,
all causes; PostgreSQL flushes these counters lazily, up to ~10 s late per backend, so
over a window of a minute they are approximate).

Run ``python bench/heartbeats.py [--tasks 10000] [--workers 20] [--window-s 60]
[--json PATH]``; it prints a markdown table with the machine and the command.
:func:`run_benchmark` is the importable entry point (the smoke test runs it tiny).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg

from chronoshard import Client, TaskSpec
from chronoshard._dev.processes import free_ports
from chronoshard.v1 import worker_service_pb2, worker_service_pb2_grpc

DEFAULT_TASKS = 10_000
DEFAULT_WORKERS = 20
DEFAULT_HEARTBEAT_S = 5.0  # docs/architecture.md#d7
DEFAULT_LEASE_S = 30.0  # the default lease
DEFAULT_WINDOW_S = 60.0
DEFAULT_IDLE_WINDOW_S = 30.0
# Before the idle window: a node that just started claims its shards and loads them, and
# PostgreSQL reports an idle backend's counters up to 10 s late. Neither is idle cost.
DEFAULT_WARMUP_S = 15.0
TASK_TYPE = "bench.hold"
SHARDS = 64
READY_TIMEOUT_S = 60.0
RUNNING_TIMEOUT_S = 300.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
GATEWAY_COUNTERS = ("heartbeats", "heartbeat_statements", "leases_extended")


# ---- measurements ------------------------------------------------------------------------


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the command name, which is parenthesised and may contain spaces:
    # state is the first, utime and stime the 12th and 13th.
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def scrape_counters(metrics_address: str) -> dict[str, float]:
    """The gateway's heartbeat counters from the node's /metrics."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name in GATEWAY_COUNTERS:
            for exposed in (f"chronoshard_gateway_{name}_total", f"chronoshard_gateway_{name}"):
                if line.startswith(exposed + "{") or line.startswith(exposed + " "):
                    found[name] = float(line.rsplit(" ", 1)[1])
    return found


def database_transactions(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Snapshot:
    at: float
    cpu_s: float
    transactions: int
    counters: dict[str, float]

    @classmethod
    def take(cls, pid: int, dsn: str, metrics_address: str) -> Snapshot:
        return cls(
            at=time.monotonic(),
            cpu_s=process_cpu_s(pid),
            transactions=database_transactions(dsn),
            counters=scrape_counters(metrics_address),
        )


@dataclass(frozen=True)
class Window:
    """One measured window."""

    phase: str  # "idle" or "running"
    running_tasks: int
    seconds: float
    cpu_percent: float  # of one core
    heartbeats_per_s: float
    heartbeat_statements_per_s: float
    leases_extended_per_s: float
    transactions_per_s: float
    revoked: int  # tasks the node answered as revoked during the window (expect 0)

    @classmethod
    def between(
        cls, phase: str, running: int, first: Snapshot, last: Snapshot, revoked: int
    ) -> Window:
        seconds = last.at - first.at

        def rate(name: str) -> float:
            return (last.counters.get(name, 0.0) - first.counters.get(name, 0.0)) / seconds

        return cls(
            phase=phase,
            running_tasks=running,
            seconds=seconds,
            cpu_percent=100.0 * (last.cpu_s - first.cpu_s) / seconds,
            heartbeats_per_s=rate("heartbeats"),
            heartbeat_statements_per_s=rate("heartbeat_statements"),
            leases_extended_per_s=rate("leases_extended"),
            transactions_per_s=(last.transactions - first.transactions) / seconds,
            revoked=revoked,
        )


@dataclass
class Result:
    tasks: int
    workers: int
    heartbeat_s: float
    lease_s: float
    windows: list[Window] = field(default_factory=list)


# ---- simulated workers -------------------------------------------------------------------


class SimulatedWorker:
    """A worker that acknowledges what it is sent and heartbeats it, and nothing else."""

    def __init__(self, name: str, address: str, api_key: str, slots: int, seed: int) -> None:
        self.name = name
        self._address = address
        self._metadata = (("authorization", f"Bearer {api_key}"),)
        self._slots = slots
        self._rng = random.Random(seed)
        self._outgoing: asyncio.Queue[worker_service_pb2.WorkerMessage] = asyncio.Queue()
        self.running: dict[str, worker_service_pb2.RunningTask] = {}
        self.welcomed = asyncio.Event()
        self.heartbeats_sent = 0
        self.replies = 0
        self.revoked = 0

    async def _requests(self) -> AsyncIterator[worker_service_pb2.WorkerMessage]:
        while True:
            yield await self._outgoing.get()

    def _send(self, **message: Any) -> None:
        self._outgoing.put_nowait(worker_service_pb2.WorkerMessage(**message))

    async def run(self) -> None:
        self._send(
            hello=worker_service_pb2.Hello(
                worker_id=self.name, task_types=[TASK_TYPE], slots=self._slots
            )
        )
        self._send(credit_grant=worker_service_pb2.CreditGrant(credits=self._slots))
        async with grpc.aio.insecure_channel(self._address) as channel:
            stream = worker_service_pb2_grpc.WorkerServiceStub(channel).Connect(
                self._requests(), metadata=self._metadata
            )
            beating: asyncio.Task[None] | None = None
            try:
                async for message in stream:
                    kind = message.WhichOneof("message")
                    if kind == "welcome":
                        interval = message.welcome.heartbeat_interval.ToTimedelta()
                        beating = asyncio.create_task(self._beat(interval.total_seconds()))
                        self.welcomed.set()
                    elif kind == "assignment":
                        a = message.assignment
                        self.running[a.task.id] = worker_service_pb2.RunningTask(
                            task=a.task, fencing_token=a.fencing_token
                        )
                        self._send(
                            ack=worker_service_pb2.Ack(task=a.task, fencing_token=a.fencing_token)
                        )
                    elif kind == "heartbeat_reply":
                        self.replies += 1
                        for revoked in message.heartbeat_reply.revoked:
                            self.revoked += 1
                            self.running.pop(revoked.task.id, None)
                    elif kind == "reject":
                        raise RuntimeError(f"{self.name} rejected: {message.reject.error}")
            finally:
                if beating is not None:
                    beating.cancel()
                stream.cancel()

    async def _beat(self, interval_s: float) -> None:
        # Independently started workers are out of phase: spread the first beat.
        await asyncio.sleep(self._rng.uniform(0, interval_s))
        while True:
            self._send(heartbeat=worker_service_pb2.Heartbeat(running=list(self.running.values())))
            self.heartbeats_sent += 1
            await asyncio.sleep(interval_s)


# ---- the cluster -------------------------------------------------------------------------


@dataclass
class Scheduler:
    proc: subprocess.Popen[bytes]
    address: str
    metrics_address: str
    log_path: Path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def start_scheduler(
    dsn: str, etcd_endpoint: str, heartbeat_s: float, lease_s: float, log_dir: Path
) -> Scheduler:
    grpc_port, metrics_port = free_ports(2)
    address = f"127.0.0.1:{grpc_port}"
    log_path = log_dir / "scheduler.log"
    env = {
        **os.environ,
        "CHRONOSHARD_NODE_ID": "bench-node",
        "CHRONOSHARD_GRPC__LISTEN": address,
        "CHRONOSHARD_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
        "CHRONOSHARD_DATABASE__DSN": dsn,
        "CHRONOSHARD_ETCD__ENDPOINTS": etcd_endpoint,
        "CHRONOSHARD_ETCD__CLUSTER": f"bench-{uuid.uuid4().hex[:8]}",
        "CHRONOSHARD_SCHEDULING__SHARD_COUNT": str(SHARDS),
        "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": str(heartbeat_s),
        "CHRONOSHARD_WORKERS__TASK_LEASE_S": str(lease_s),
        # Valid for any lease the bench is given: ack timeout between the heartbeat and
        # the lease, heartbeat + margin inside the lease (scheduler/config.py).
        "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": str(min(10.0, (heartbeat_s + lease_s) / 2)),
        "CHRONOSHARD_WORKERS__LEASE_MARGIN_S": str(min(2.0, (lease_s - heartbeat_s) / 2)),
        "CHRONOSHARD_LOG_LEVEL": "WARNING",
        "CHRONOSHARD_LOG_FORMAT": "text",
    }
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "chronoshard.scheduler"],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Scheduler(proc, address, f"127.0.0.1:{metrics_port}", log_path)


async def wait_serving(scheduler: Scheduler) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + READY_TIMEOUT_S
    async with grpc.aio.insecure_channel(scheduler.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if scheduler.proc.poll() is not None:
                raise RuntimeError(f"scheduler exited:\n{scheduler.log_tail()}")
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"scheduler not serving:\n{scheduler.log_tail()}")
            await asyncio.sleep(0.1)


def stop_scheduler(scheduler: Scheduler) -> None:
    if scheduler.proc.poll() is None:
        os.killpg(scheduler.proc.pid, signal.SIGTERM)
        try:
            scheduler.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(scheduler.proc.pid, signal.SIGKILL)
            scheduler.proc.wait(10)


async def _running_count(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT count(*) FROM tasks WHERE status = 'RUNNING'")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _wait_running(dsn: str, tasks: int, scheduler: Scheduler) -> None:
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    while await _running_count(dsn) < tasks:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all {tasks} tasks RUNNING:\n{scheduler.log_tail()}")
        await asyncio.sleep(0.5)


async def _measure(
    phase: str,
    running: int,
    window_s: float,
    scheduler: Scheduler,
    dsn: str,
    workers: Sequence[SimulatedWorker],
) -> Window:
    pid, metrics = scheduler.proc.pid, scheduler.metrics_address
    revoked_before = sum(w.revoked for w in workers)
    first = await asyncio.to_thread(Snapshot.take, pid, dsn, metrics)
    await asyncio.sleep(window_s)
    last = await asyncio.to_thread(Snapshot.take, pid, dsn, metrics)
    revoked = sum(w.revoked for w in workers) - revoked_before
    return Window.between(phase, running, first, last, revoked)


async def run_cluster_benchmark(
    *,
    dsn: str,
    etcd_endpoint: str,
    tasks: int,
    workers: int,
    heartbeat_s: float,
    lease_s: float,
    window_s: float,
    idle_window_s: float,
    log_dir: Path,
    warmup_s: float = DEFAULT_WARMUP_S,
) -> Result:
    """Measure against a migrated database at ``dsn`` and an etcd at ``etcd_endpoint``."""
    api_key = _bench_tenant(dsn, tasks)
    scheduler = start_scheduler(dsn, etcd_endpoint, heartbeat_s, lease_s, log_dir)
    result = Result(tasks, workers, heartbeat_s, lease_s)
    streams: list[asyncio.Task[None]] = []
    try:
        await wait_serving(scheduler)
        per_worker = -(-tasks // workers)
        sims = [
            SimulatedWorker(f"sim-{i}", scheduler.address, api_key, per_worker, seed=i)
            for i in range(workers)
        ]
        streams += [asyncio.create_task(w.run(), name=w.name) for w in sims]
        await _wait_welcomed(sims, streams, scheduler)
        await asyncio.sleep(warmup_s)
        result.windows.append(await _measure("idle", 0, idle_window_s, scheduler, dsn, sims))
        await _submit_due_now(scheduler.address, api_key, tasks)
        await _wait_running(dsn, tasks, scheduler)
        # Let every worker's heartbeat phase settle before measuring.
        await asyncio.sleep(heartbeat_s)
        result.windows.append(await _measure("running", tasks, window_s, scheduler, dsn, sims))
        for stream in streams:
            if stream.done():
                stream.result()
    finally:
        for stream in streams:
            stream.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        await asyncio.to_thread(stop_scheduler, scheduler)
    return result


def _bench_tenant(dsn: str, tasks: int) -> str:
    """A tenant whose limits are not what is measured; its API key."""
    from chronoshard.scheduler.store.tenants import create_tenant

    return create_tenant(
        dsn,
        f"bench-{uuid.uuid4().hex[:8]}",
        max_concurrent_workers=max(tasks, 1),
        rate_limit_rps=max(10_000.0, float(tasks)),
    ).api_key


async def _wait_welcomed(
    sims: Sequence[SimulatedWorker], streams: Sequence[asyncio.Task[None]], scheduler: Scheduler
) -> None:
    """Until each worker's stream was welcomed; what ended a stream before, if one did."""
    for sim, stream in zip(sims, streams, strict=True):
        welcomed = asyncio.create_task(sim.welcomed.wait())
        done, _ = await asyncio.wait(
            {welcomed, stream}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
        welcomed.cancel()
        if stream in done:
            stream.result()  # raises what ended it
        if not sim.welcomed.is_set():
            raise TimeoutError(f"{sim.name} not welcomed:\n{scheduler.log_tail()}")


async def _submit_due_now(address: str, api_key: str, tasks: int) -> None:
    async with Client(address, api_key=api_key) as client:
        # Due now (no time given), no jitter: every task is dispatched at once.
        specs = [
            TaskSpec(type=TASK_TYPE, payload={"i": i}, strict_timing=True) for i in range(tasks)
        ]
        outcomes = await client.submit_batch(specs)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        if failed:
            raise RuntimeError(f"{len(failed)} submits failed, first: {failed[0]}")


def run_benchmark(
    *,
    tasks: int = DEFAULT_TASKS,
    workers: int = DEFAULT_WORKERS,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    lease_s: float = DEFAULT_LEASE_S,
    window_s: float = DEFAULT_WINDOW_S,
    idle_window_s: float = DEFAULT_IDLE_WINDOW_S,
    warmup_s: float = DEFAULT_WARMUP_S,
    dsn: str | None = None,
    etcd_endpoint: str | None = None,
) -> Result:
    """Run the whole benchmark; starts PostgreSQL and etcd unless given."""
    from chronoshard.scheduler.store.migrate import apply_migrations
    from chronoshard.services import EtcdProcess, PostgresServer

    with contextlib.ExitStack() as stack:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-hb-")))
        if dsn is None:
            server = stack.enter_context(PostgresServer(fsync=False))
            database = f"bench_heartbeats_{uuid.uuid4().hex[:8]}"
            server.create_database(database)
            stack.callback(server.drop_database, database)
            dsn = server.dsn_for(database)
        apply_migrations(dsn)
        if etcd_endpoint is None:
            etcd_endpoint = stack.enter_context(EtcdProcess(fsync=False)).endpoint
        return asyncio.run(
            run_cluster_benchmark(
                dsn=dsn,
                etcd_endpoint=etcd_endpoint,
                tasks=tasks,
                workers=workers,
                heartbeat_s=heartbeat_s,
                lease_s=lease_s,
                window_s=window_s,
                idle_window_s=idle_window_s,
                log_dir=log_dir,
                warmup_s=warmup_s,
            )
        )


# ---- report ------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }


def render_markdown(result: Result, machine: dict[str, str], command: str) -> str:
    lines = [
        f"Command: `{command}`",
        "",
        f"Machine: {machine['platform']}; CPU {machine['cpu']}, {machine['cores']} cores; "
        f"{machine['python']}. {result.workers} simulated workers, heartbeat "
        f"{result.heartbeat_s:g} s, lease {result.lease_s:g} s.",
        "",
        "| phase | running tasks | window s | scheduler CPU (% of one core) | heartbeats/s "
        "| extend_leases statements/s | leases extended/s | DB transactions/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in result.windows:
        lines.append(
            f"| {w.phase} | {w.running_tasks:,} | {w.seconds:.1f} | {w.cpu_percent:.2f} "
            f"| {w.heartbeats_per_s:.2f} | {w.heartbeat_statements_per_s:.2f} "
            f"| {w.leases_extended_per_s:,.0f} | {w.transactions_per_s:.2f} |"
        )
    revoked = sum(w.revoked for w in result.windows)
    lines += ["", f"Leases revoked during the windows: {revoked} (expected 0)."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=DEFAULT_TASKS)
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--heartbeat-s", type=float, default=DEFAULT_HEARTBEAT_S)
    parser.add_argument("--lease-s", type=float, default=DEFAULT_LEASE_S)
    parser.add_argument("--window-s", type=float, default=DEFAULT_WINDOW_S)
    parser.add_argument("--idle-window-s", type=float, default=DEFAULT_IDLE_WINDOW_S)
    parser.add_argument("--warmup-s", type=float, default=DEFAULT_WARMUP_S)
    parser.add_argument("--dsn", default=None, help="a migrated-or-empty database to use")
    parser.add_argument("--etcd", default=None, help="an etcd endpoint to use")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args(argv)
    result = run_benchmark(
        tasks=args.tasks,
        workers=args.workers,
        heartbeat_s=args.heartbeat_s,
        lease_s=args.lease_s,
        window_s=args.window_s,
        idle_window_s=args.idle_window_s,
        warmup_s=args.warmup_s,
        dsn=args.dsn,
        etcd_endpoint=args.etcd,
    )
    command = shlex.join(["python", "bench/heartbeats.py", *(argv or sys.argv[1:])])
    info = machine()
    print(render_markdown(result, info, command))
    if args.json is not None:
        document = {
            "benchmark": "heartbeats",
            "command": command,
            "machine": info,
            "result": asdict(result),
        }
        args.json.write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

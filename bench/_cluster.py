"""The real processes a workload runs against, and how to watch them.

:func:`infrastructure` gives PostgreSQL (the server named by ``--dsn`` or
``CHRONOSHARD_TEST_DSN``, else an embedded one with fsync on: the suite measures durable
commits) and etcd (``--etcd`` or a fresh member). :func:`node` starts, on a fresh migrated
database, one scheduler process (``python -m chronoshard.scheduler``, through the test
harness's :class:`ProcessGroup`) and optionally worker processes running
``bench/bench_workers.py``, and waits until the node owns every shard and the workers'
streams are open. Everything started is stopped when the block ends.

The scheduler's CPU is read from ``/proc/<pid>/stat`` (``utime + stime``, all threads),
so a measurement costs the measured process nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psycopg
from harness.history import EFFECTS_DDL
from harness.processes import ProcessGroup, SchedulerHandle

from chronoshard.scheduler.store.migrate import apply_migrations
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess, PostgresServer

REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / "bench"

DSN_ENV = "CHRONOSHARD_TEST_DSN"
LOG_DIR_ENV = "BENCH_LOG_DIR"
SHARDS = 64
# The benchmark tenant must not be the limit being measured.
TENANT_RATE_LIMIT_RPS = 1_000_000.0
TENANT_MAX_CONCURRENT = 1_000_000
READY_TIMEOUT_S = 60.0


@dataclass
class Infrastructure:
    server: PostgresServer
    etcd_endpoint: str
    etcd_pid: int | None = None  # None when etcd is someone else's (``--etcd``)

    @contextlib.contextmanager
    def database(self, label: str) -> Iterator[str]:
        """A fresh migrated database with the effects ledger; dropped afterwards."""
        name = f"bench_{label.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        self.server.create_database(name)
        try:
            dsn = self.server.dsn_for(name)
            apply_migrations(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(EFFECTS_DDL)
            yield dsn
        finally:
            self.server.drop_database(name)


@contextlib.contextmanager
def infrastructure(
    dsn: str | None = None, etcd_endpoint: str | None = None
) -> Iterator[Infrastructure]:
    admin_dsn = dsn or os.environ.get(DSN_ENV) or None
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(PostgresServer(dsn=admin_dsn, fsync=True))
        etcd_pid = None
        if etcd_endpoint is None:
            etcd = stack.enter_context(EtcdProcess(fsync=True))
            etcd_endpoint, etcd_pid = etcd.endpoint, etcd.pid
        yield Infrastructure(server, etcd_endpoint, etcd_pid)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name may hold spaces: fields are counted after its closing paren.
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / os.sysconf("SC_CLK_TCK")


def _parent_pid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("PPid:"):
                return int(line.split()[1])
    return 0


def postgres_pids(dsn: str) -> list[int]:
    """The local PostgreSQL server's processes (postmaster and every child), found
    from the backend serving a connection; empty when the server is not on this host."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        # While the connection is open: its backend exits with it, and a closed one
        # made this return nothing now and then (a run's CPU table lost PostgreSQL).
        try:
            postmaster = _parent_pid(int(row[0]))
        except OSError:
            return []
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if _parent_pid(int(entry)) == postmaster:
                    pids.append(int(entry))
    return pids


def cpu_by_pid(pids: list[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            found[pid] = process_cpu_s(pid)
    return found


def cpu_used(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU seconds between two :func:`cpu_by_pid` readings; a process that exited in
    between is not counted, one that started is counted whole."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def process_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Node:
    """The scheduler processes of one cluster on its own database (one, unless ``nodes``
    was asked for), and its workers. ``scheduler`` is the first: the producer's node."""

    group: ProcessGroup
    schedulers: list[SchedulerHandle]
    dsn: str
    api_key: str

    @property
    def scheduler(self) -> SchedulerHandle:
        return self.schedulers[0]

    @property
    def address(self) -> str:
        return self.scheduler.address

    @property
    def addresses(self) -> list[str]:
        return [s.address for s in self.schedulers]

    @property
    def pid(self) -> int:
        return self.scheduler.process.pid

    def cpu_s(self) -> float:
        return sum(process_cpu_s(s.process.pid) for s in self.schedulers)

    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.group.workers]

    def cpu_snapshot(self) -> dict[str, dict[int, float]]:
        """CPU seconds used so far, per process, by the scheduler processes, the workers
        and PostgreSQL (every process of the server, whoever else uses it); subtract two
        with :func:`cpu_used`."""
        return {
            "scheduler": cpu_by_pid([s.process.pid for s in self.schedulers]),
            "workers": cpu_by_pid(self.worker_pids()),
            "postgres": cpu_by_pid(postgres_pids(self.dsn)),
        }

    def start_workers(
        self,
        count: int,
        slots: int,
        *,
        prefetch: int = 0,
        spec: str = "bench_workers:worker",
        pythonpath: Path = BENCH_DIR,
        **env: str,
    ) -> None:
        """``count`` worker processes running ``spec`` (by default the suite's
        ``bench/bench_workers.py``), each with ``slots`` slots (and ``prefetch`` held
        beyond them) and ``env`` added."""
        for i in range(count):
            self.group.start_worker(
                f"worker-{i + 1}",
                spec,
                self.addresses,
                pythonpath=pythonpath,
                BENCH_DSN=self.dsn,
                BENCH_WORKER_SLOTS=str(slots),
                BENCH_WORKER_PREFETCH=str(prefetch),
                CHRONOSHARD_API_KEY=self.api_key,
                **env,
            )
        for scheduler in self.schedulers:
            wait_until(
                functools.partial(_has_sessions, scheduler, count),
                what=f"{count} worker streams on {scheduler.address}",
                node=self,
            )


def _has_sessions(scheduler: SchedulerHandle, count: int) -> bool:
    return (scheduler.metric("chronoshard_worker_sessions") or 0) >= count


def wait_until(
    condition: object, *, what: str, node: Node | None = None, timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Poll ``condition()`` every 0.1 s until true; TimeoutError naming ``what``."""
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            logs = node.group.logs() if node is not None else ""
            raise TimeoutError(f"timed out waiting for {what}\n{logs[-4000:]}")
        time.sleep(0.1)


@contextlib.contextmanager
def node(
    infra: Infrastructure,
    label: str,
    *,
    env: Mapping[str, str] | None = None,
    workers: int = 0,
    slots: int = 200,
    prefetch: int = 0,
    nodes: int = 1,
) -> Iterator[Node]:
    """``nodes`` scheduler processes owning all shards between them (and ``workers``
    worker processes, each connected to every node).

    Their logs go to a temporary directory, or are kept under ``$BENCH_LOG_DIR``."""
    kept = os.environ.get(LOG_DIR_ENV)
    with infra.database(label) as dsn, contextlib.ExitStack() as stack:
        if kept:
            logs = tempfile.mkdtemp(prefix=f"{label}-", dir=kept)
        else:
            logs = stack.enter_context(tempfile.TemporaryDirectory())
        api_key = create_tenant(
            dsn,
            f"bench-{uuid.uuid4().hex[:8]}",
            rate_limit_rps=TENANT_RATE_LIMIT_RPS,
            max_concurrent_workers=TENANT_MAX_CONCURRENT,
        ).api_key
        group = ProcessGroup(
            log_dir=Path(logs),
            dsn=dsn,
            etcd_endpoint=infra.etcd_endpoint,
            cluster=f"bench-{uuid.uuid4().hex[:8]}",
            shard_count=SHARDS,
            scheduler_env={"CHRONOSHARD_LOG_LEVEL": "WARNING", **(env or {})},
        )
        try:
            handles = [group.start_scheduler(f"node-{i + 1}") for i in range(nodes)]
            result = Node(group, handles, dsn, api_key)
            wait_until(lambda: _owned_shards(dsn) == SHARDS, what="shard claims", node=result)
            if nodes > 1:
                # Each node must own its share (rendezvous): until the handoffs are done,
                # the first node holds what the later ones will take.
                wait_until(
                    lambda: _owners(dsn) == nodes, what=f"shards spread over {nodes}", node=result
                )
            if workers:
                result.start_workers(workers, slots, prefetch=prefetch)
            yield result
        finally:
            group.close()


def _owned_shards(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM shard_owners").fetchone()
    return 0 if row is None else int(row[0])


def _owners(dsn: str) -> int:
    """How many nodes own shards now."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(DISTINCT node_id) FROM shard_owners").fetchone()
    return 0 if row is None else int(row[0])

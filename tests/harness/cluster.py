"""A cluster of real scheduler and worker processes over one PostgreSQL and one etcd, for
the tests that drive Chronoshard from outside, and what they ask of it.

One :class:`Cluster` serves every such test: the e2e fault tests (several nodes, the e2e
workers from ``tests/e2e/e2e_workers.py`` recording their effects for the history
checker, :mod:`harness.history`), the watchdog's (one node, its own workers) and the
CLI's (one node, no worker process). Processes are :mod:`harness.processes`; the helpers
read ownership from ``shard_owners`` and wait with a deadline
(``fixtures.waiting.eventually``), never a bare sleep.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
from fixtures.waiting import eventually

from chronoshard import Client, SubmitResult, TaskSpec
from chronoshard.scheduler.store.tenants import NewTenant, create_tenant
from harness.history import EFFECTS_DDL, History
from harness.processes import DEFAULT_SHARD_COUNT, ManagedProcess, ProcessGroup, SchedulerHandle

E2E_DIR = Path(__file__).resolve().parent.parent / "e2e"
E2E_WORKER = "e2e_workers:worker"


@dataclass
class Cluster:
    """Nodes named ``node-1``.. and workers of ``group``; ``tenant`` is the tenant whose
    API key (``api_key``) the workers and the tests' clients use."""

    group: ProcessGroup
    dsn: str
    tenant: NewTenant
    nodes: dict[str, SchedulerHandle]
    shard_count: int

    @property
    def api_key(self) -> str:
        return self.tenant.api_key

    def targets(self) -> list[str]:
        return [n.address for n in self.nodes.values()]

    def live(self) -> set[str]:
        return {name for name, handle in self.nodes.items() if handle.process.alive()}

    def start_node(self, name: str) -> SchedulerHandle:
        handle = self.group.start_scheduler(name)
        self.nodes[name] = handle
        return handle

    def start_worker(
        self, name: str, spec: str = E2E_WORKER, *, pythonpath: Path = E2E_DIR, **env: str
    ) -> ManagedProcess:
        """A worker process serving ``spec`` for the cluster's tenant, connected to every
        node started so far."""
        return self.group.start_worker(
            name,
            spec,
            self.targets(),
            pythonpath=pythonpath,
            CHRONOSHARD_API_KEY=self.api_key,
            **env,
        )

    def new_tenant(self, name: str, *, operator: bool = False) -> NewTenant:
        """Another tenant, made the way operators make them (``chronoshard tenants create``)."""
        return create_tenant(self.dsn, name, operator=operator)

    def logs(self) -> str:
        return self.group.logs()


@contextlib.contextmanager
def running_cluster(
    dsn: str,
    etcd_endpoint: str,
    log_dir: Path,
    *,
    nodes: int,
    workers: int = 2,
    shard_count: int = DEFAULT_SHARD_COUNT,
    scheduler_env: Mapping[str, str],
) -> Iterator[Cluster]:
    """``nodes`` schedulers named ``node-1``.. and ``workers`` e2e workers connected to
    them (which record their effects in the ``effects`` table made here)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
    tenant = create_tenant(dsn, f"c-{uuid.uuid4().hex[:8]}")
    group = ProcessGroup(
        log_dir=log_dir,
        dsn=dsn,
        etcd_endpoint=etcd_endpoint,
        cluster=f"c-{uuid.uuid4().hex[:8]}",
        shard_count=shard_count,
        scheduler_env=scheduler_env,
    )
    try:
        cluster = Cluster(group, dsn, tenant, {}, shard_count)
        for i in range(nodes):
            cluster.start_node(f"node-{i + 1}")
        for i in range(workers):
            cluster.start_worker(f"worker-{i + 1}", E2E_DSN=dsn)
        yield cluster
    finally:
        group.close()


def epochs(dsn: str) -> dict[int, int]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT shard, epoch FROM shard_owners").fetchall())


def owners(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT shard, node_id FROM shard_owners").fetchall())


async def spread(cluster: Cluster, timeout_s: float = 30) -> dict[str, set[int]]:
    """Wait until every shard is owned and the live nodes share them (load-bounded)."""

    def balanced() -> dict[str, set[int]] | None:
        by_node: dict[str, set[int]] = {}
        for shard, node in owners(cluster.dsn).items():
            by_node.setdefault(node, set()).add(shard)
        owned = sum(len(s) for s in by_node.values())
        live = cluster.live()
        if owned != cluster.shard_count or set(by_node) != live:
            return None
        # Converged, not just covered: rendezvous with a load bound of ceil(S/N).
        if max(len(s) for s in by_node.values()) > -(-cluster.shard_count // len(live)):
            return None
        return by_node

    return await eventually(balanced, timeout_s=timeout_s, what="shards spread over live nodes")


async def submit(
    client: Client,
    history: History,
    count: int,
    start: datetime,
    spread_s: float,
    *,
    task_type: str = "e2e.record",
    payload: Mapping[str, object] | None = None,
) -> list[uuid.UUID]:
    """``count`` strict, idempotent ``task_type`` tasks (``e2e.record``: record and
    return; ``e2e.work``: hold the slot ``payload.seconds`` first) due evenly over
    ``spread_s``; each payload is ``payload`` plus its index ``i``."""
    specs = [
        TaskSpec(
            type=task_type,
            payload={**(payload or {}), "i": i},
            at=start + timedelta(seconds=spread_s * i / count),
            strict_timing=True,
            idempotent=True,
            job_id="cluster-job",
        )
        for i in range(count)
    ]
    ids: list[uuid.UUID] = []
    for chunk in range(0, count, 1000):
        op = history.invoke("submit_batch")
        try:
            results = await client.submit_batch(specs[chunk : chunk + 1000])
        except Exception as exc:
            History.finish(op, "unknown", error=str(exc))
            raise
        batch = [uuid.UUID(r.task.id) for r in results if isinstance(r, SubmitResult)]
        History.finish(op, "ok", batch)
        ids += batch
    return ids


async def wait_all_done(cluster: Cluster, ids: list[uuid.UUID], timeout_s: float) -> None:
    def done() -> bool:
        with psycopg.connect(cluster.dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = 'COMPLETED'", (ids,)
            ).fetchone()
        return row is not None and row[0] == len(ids)

    try:
        await eventually(done, timeout_s=timeout_s, what="every task COMPLETED", interval_s=0.25)
    except AssertionError:
        print(cluster.group.logs())
        raise

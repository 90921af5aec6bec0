"""A scheduler node's graceful stop with idle workers connected, as real processes.

The node used to take ~5.8 s from SIGTERM to exit with any worker connected: its gRPC
server's grace waited for the workers' bidirectional streams, which never end on their
own. The node now ends them itself once its settlements are flushed (each worker was
told ``Drain{shutting_down}`` first, so none reconnects), and the grace waits only for
real in-flight unary calls. What is measured is the wait for the process to exit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from fixtures.waiting import eventually
from harness.processes import ProcessGroup

from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess

E2E_DIR = Path(__file__).resolve().parent
WORKERS = 2
# The stop's own work (health, release of the shards, flushes, closing the streams, the
# etcd revoke and the pool) is well under a second here; 2 s leaves room for a loaded
# 2-core machine and stays far below the 5 s gRPC grace a stream would still cost.
STOP_BOUND_S = 2.0


async def test_a_node_with_idle_workers_exits_promptly_on_sigterm(
    db_dsn: str, etcd: EtcdProcess, tmp_path: Path
) -> None:
    api_key = create_tenant(db_dsn, f"stop-{uuid.uuid4().hex[:8]}").api_key
    group = ProcessGroup(
        log_dir=tmp_path,
        dsn=db_dsn,
        etcd_endpoint=etcd.endpoint,
        cluster=f"stop-{uuid.uuid4().hex[:8]}",
        shard_count=8,
    )
    try:
        node = group.start_scheduler("node-1")
        workers = [
            group.start_worker(
                f"worker-{i + 1}",
                "e2e_workers:worker",
                [node.address],
                pythonpath=E2E_DIR,
                E2E_DSN=db_dsn,
                CHRONOSHARD_API_KEY=api_key,
            )
            for i in range(WORKERS)
        ]
        await eventually(
            lambda: node.metric("chronoshard_worker_sessions") == WORKERS,
            timeout_s=30,
            what=f"{WORKERS} worker sessions on the node",
        )
        started = time.monotonic()
        code = await asyncio.to_thread(node.process.stop, 30.0)
        took_s = time.monotonic() - started
        print(f"node SIGTERM to exit: {took_s:.2f} s with {WORKERS} idle workers")
        assert code == 0, group.logs()
        assert took_s < STOP_BOUND_S, f"SIGTERM to exit took {took_s:.2f} s\n{group.logs()}"
        # Each worker heard the node was going and let its stream end without reconnecting.
        for worker in workers:
            await eventually(
                lambda w=worker: w.logged("event=node_drain") and w.logged("event=stream_ended"),
                timeout_s=10,
                what=f"{worker.name} told of the drain and its stream ended",
            )
            assert worker.alive(), worker.log()
    finally:
        group.close()

"""Leases, fencing, drain, crash and cooperative stops, end to end with real processes.

One scheduler process serves the module, configured with short leases and keepalives so
faults play out in seconds; each test starts its own worker processes (SDK workers from
``lease_workers.py``, or the shipped ``examples/fenced_side_effect.py``) on a queue of its
own and ends them. What handlers did is read back from their ledgers in the test's
database; what the scheduler did, from ``tasks`` and ``task_attempts``.

Timing bounds are named constants derived from the configuration below; waits are on
states (``eventually``), never on sleeps.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fixtures.waiting import eventually
from harness.processes import ManagedProcess, ProcessGroup, SchedulerHandle

from chronoshard import Client, RetryPolicy, Task
from chronoshard.scheduler.tenant_admin import create_tenant
from chronoshard.services import EtcdProcess

E2E_DIR = Path(__file__).resolve().parent
EXAMPLES_DIR = E2E_DIR.parents[1] / "examples"

LEASE_S = 4.0
HEARTBEAT_S = 1.0
KEEPALIVE_TIME_S = 1.0
KEEPALIVE_TIMEOUT_S = 1.0
# A worker process is up and has a session within this (imports, topology, Hello).
WORKER_READY_S = 30.0
# The scheduler settles a cooperative stop (cancel, timeout) within this of the handler's
# reaction: a group commit plus a receipt, with margin for a 2-core machine under load.
SETTLE_BOUND_S = 3.0

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS lease_effects (
    task_id uuid NOT NULL,
    attempt integer NOT NULL,
    token bigint NOT NULL,
    worker_id text NOT NULL,
    event text NOT NULL,
    detail jsonb,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


@dataclass
class LeaseCluster:
    group: ProcessGroup
    node: SchedulerHandle
    dsn: str
    api_key: str

    def lease_worker(self, name: str, queue: str, **env: str) -> ManagedProcess:
        return self.group.start_worker(
            name,
            "lease_workers:worker",
            [self.node.address],
            pythonpath=E2E_DIR,
            LEASE_DSN=self.dsn,
            LEASE_QUEUE=queue,
            CHRONOSHARD_WORKER_ID=name,
            CHRONOSHARD_API_KEY=self.api_key,
            **env,
        )

    async def sessions(self) -> int:
        value = await asyncio.to_thread(self.node.metric, "chronoshard_worker_sessions")
        return int(value or 0)


async def wait_connected(*processes: ManagedProcess) -> None:
    """Until every worker process logged an open session with the node."""
    for process in processes:
        await eventually(
            lambda p=process: "event=session_open" in p.log(tail_chars=1_000_000),
            timeout_s=WORKER_READY_S,
            what=f"{process.name} connected",
            interval_s=0.1,
        )


@pytest.fixture(scope="module")
def cluster(
    db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LeaseCluster]:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)
    api_key = create_tenant(db_dsn, f"leases-{uuid.uuid4().hex[:8]}").api_key
    group = ProcessGroup(
        log_dir=tmp_path_factory.mktemp("lease-logs"),
        dsn=db_dsn,
        etcd_endpoint=etcd.endpoint,
        cluster=f"leases-{uuid.uuid4().hex[:8]}",
        scheduler_env={
            "CHRONOSHARD_GRPC__KEEPALIVE_TIME_S": str(KEEPALIVE_TIME_S),
            "CHRONOSHARD_GRPC__KEEPALIVE_TIMEOUT_S": str(KEEPALIVE_TIMEOUT_S),
            "CHRONOSHARD_WORKERS__TASK_LEASE_S": str(LEASE_S),
            "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
        },
    )
    try:
        node = group.start_scheduler("lease-node")
        yield LeaseCluster(group, node, db_dsn, api_key)
    finally:
        group.close()


@pytest.fixture
async def client(cluster: LeaseCluster) -> AsyncIterator[Client]:
    async with Client(cluster.node.address, api_key=cluster.api_key) as opened:
        yield opened


async def _ledger(dsn: str, task_ids: list[str]) -> list[dict[str, Any]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT task_id::text, attempt, token, worker_id, event, detail FROM lease_effects"
            " WHERE task_id = ANY(%s::uuid[]) ORDER BY at",
            (task_ids,),
        )
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in await cur.fetchall()]


def _events(rows: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["event"] == event]


async def _finished(client: Client, task_id: str) -> Task | None:
    task = await client.get(task_id, attempts=True)
    return task if task.status.is_terminal else None


def _fast_retry() -> RetryPolicy:
    return RetryPolicy(initial_backoff_s=0.05, max_backoff_s=0.2, multiplier=2.0)


async def _stop(process: ManagedProcess, timeout_s: float) -> tuple[int, float]:
    """SIGTERM ``process``; its exit code and how long it took to exit."""
    started = time.monotonic()
    code = await asyncio.to_thread(process.stop, timeout_s)
    return code, time.monotonic() - started


# ---- drain -------------------------------------------------------------------------------

DRAIN_ROWS = 200
DRAIN_ROW_S = 0.1  # the task runs DRAIN_ROWS * DRAIN_ROW_S = 20 s on one worker
DRAIN_GRACE_S = 4.0
# After the grace the handler notices the stop within one row and raises; the release is
# one group commit; then the worker closes its streams. This bounds all of that.
DRAIN_EXIT_BOUND_S = DRAIN_GRACE_S + 3.0


async def test_sigterm_releases_a_long_task_with_its_checkpoint_and_another_worker_resumes(
    cluster: LeaseCluster, client: Client
) -> None:
    """The issue's drain test, scaled down: a 20 s task (not 120 s) checkpointing a row
    counter, SIGTERM at ~1/10 of the way (2 s, not 10 s), a 4 s grace (not 30 s). The
    structure is the issue's: the task outlives the grace, is released with its
    checkpoint, resumes on the other worker from there, and the release used no retry."""
    queue = "drain"
    workers = {
        name: cluster.lease_worker(name, queue, LEASE_SLOTS="1", LEASE_DRAIN_GRACE_S="4")
        for name in ("drain-a", "drain-b")
    }
    try:
        await wait_connected(*workers.values())
        submitted = await client.submit(
            "lease.rows",
            {"rows": DRAIN_ROWS, "row_s": DRAIN_ROW_S},
            queue=queue,
            strict_timing=True,
            max_retries=0,
        )
        task_id = submitted.task.id

        async def checkpoint_at_tenth() -> int | None:
            task = await client.get(task_id)
            done = json.loads(task.checkpoint)["next"] if task.checkpoint else 0
            return done if done >= DRAIN_ROWS // 10 else None

        await eventually(
            checkpoint_at_tenth, timeout_s=WORKER_READY_S, what="a tenth of the rows checkpointed"
        )
        first = (await client.get(task_id)).worker_id
        assert first in workers, first
        second = next(name for name in workers if name != first)

        code, took_s = await _stop(workers[first], timeout_s=DRAIN_EXIT_BOUND_S + 30)
        assert code == 0, "the drain was not clean"
        assert took_s <= DRAIN_EXIT_BOUND_S, f"SIGTERM to exit took {took_s:.1f} s"

        done = await eventually(
            lambda: _finished(client, task_id),
            timeout_s=DRAIN_ROWS * DRAIN_ROW_S + 30,
            what="the drained task finished on the other worker",
        )
    except BaseException:
        print(cluster.group.logs())
        raise
    finally:
        for process in workers.values():
            process.kill()

    assert done.status.value == "COMPLETED"
    assert done.retry_count == 0, "a drain must not use up a retry"
    history = [(a.attempt, a.state.value, a.worker_id) for a in done.attempts]
    assert history == [(1, "RELEASED", first), (2, "SUCCEEDED", second)]

    rows = await _ledger(cluster.dsn, [task_id])
    stopped = _events(rows, "stopped")
    assert [(r["worker_id"], r["detail"]["reason"]) for r in stopped] == [(first, "draining")]
    resumed = _events(rows, "resumed")
    assert [r["worker_id"] for r in resumed] == [second]
    resumed_from = resumed[0]["detail"]["from"]
    # It resumed where the first worker stopped, not from zero (the checkpoint of the
    # last row the first worker finished travelled with the Release).
    assert resumed_from == stopped[0]["detail"]["next"]
    assert resumed_from >= DRAIN_ROWS // 10
    committed = _events(rows, "committed")
    assert [(r["worker_id"], r["detail"]) for r in committed] == [
        (second, {"from": resumed_from, "rows": DRAIN_ROWS})
    ]
    assert done.result == {"rows": DRAIN_ROWS, "resumed_from": resumed_from}


# ---- cooperative cancel and timeout ------------------------------------------------------

TIMEOUT_S = 1.0


async def test_cancel_reaches_the_running_handler_and_the_task_ends_cancelled(
    cluster: LeaseCluster, client: Client
) -> None:
    queue = "cancel"
    process = cluster.lease_worker("cancel-w", queue)
    try:
        await wait_connected(process)
        submitted = await client.submit(
            "lease.cancellable", {"wait_s": 60}, queue=queue, strict_timing=True
        )
        task_id = submitted.task.id

        async def started() -> bool:
            return bool(_events(await _ledger(cluster.dsn, [task_id]), "started"))

        await eventually(started, timeout_s=WORKER_READY_S, what="cancellable handler started")
        asked_at = time.monotonic()
        answer = await client.cancel(task_id, reason="test says stop")
        # A running task is asked to stop: it stays RUNNING until its worker confirms.
        assert answer.status.value == "RUNNING"
        done = await eventually(
            lambda: _finished(client, task_id), timeout_s=30, what="cancelled task finished"
        )
        took_s = time.monotonic() - asked_at
    except BaseException:
        print(cluster.group.logs())
        raise
    finally:
        process.kill()

    assert done.status.value == "CANCELLED"
    assert [(a.attempt, a.state.value) for a in done.attempts] == [(1, "CANCELLED")]
    rows = await _ledger(cluster.dsn, [task_id])
    assert [r["detail"] for r in _events(rows, "stop_seen")] == [{"reason": "cancelled"}]
    assert took_s <= SETTLE_BOUND_S, f"cancel to CANCELLED took {took_s:.1f} s"


async def test_a_handler_past_its_timeout_fails_timed_out_and_is_retried(
    cluster: LeaseCluster, client: Client
) -> None:
    queue = "timeout"
    process = cluster.lease_worker("timeout-w", queue)
    try:
        await wait_connected(process)
        submitted = await client.submit(
            "lease.slow_first",
            {"first_s": 60},
            queue=queue,
            strict_timing=True,
            timeout_s=TIMEOUT_S,
            max_retries=2,
            retry=_fast_retry(),
        )
        task_id = submitted.task.id
        done = await eventually(
            lambda: _finished(client, task_id), timeout_s=30, what="timed-out task retried"
        )
    except BaseException:
        print(cluster.group.logs())
        raise
    finally:
        process.kill()

    assert done.status.value == "COMPLETED"
    assert done.retry_count == 1
    assert [(a.attempt, a.state.value) for a in done.attempts] == [
        (1, "TIMED_OUT"),
        (2, "SUCCEEDED"),
    ]
    first = done.attempts[0]
    assert first.entered_at is not None and first.finished_at is not None
    ran_s = (first.finished_at - first.entered_at).total_seconds()
    assert TIMEOUT_S <= ran_s <= TIMEOUT_S + SETTLE_BOUND_S, f"attempt 1 ran {ran_s:.2f} s"
    rows = await _ledger(cluster.dsn, [task_id])
    interrupted = _events(rows, "interrupted")
    assert [(r["attempt"], r["detail"]) for r in interrupted] == [(1, {"reason": "timed_out"})]
    assert [r["attempt"] for r in _events(rows, "committed")] == [2]

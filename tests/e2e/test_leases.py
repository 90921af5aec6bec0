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
import importlib.util
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
import psycopg
import pytest
from fixtures.waiting import eventually
from harness.history import lease_expired_at
from harness.processes import ManagedProcess, ProcessGroup, SchedulerHandle
from harness.raw_worker import Metadata, RawWorker, bearer, hello

from chronoshard import (
    Client,
    FailedPreconditionError,
    Resolution,
    RetryPolicy,
    SubmitResult,
    Task,
    TaskSpec,
)
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess
from chronoshard.v1 import common_pb2, worker_service_pb2, worker_service_pb2_grpc
from chronoshard.wire import error_info_from_metadata

E2E_DIR = Path(__file__).resolve().parent
EXAMPLES_DIR = E2E_DIR.parents[1] / "examples"

LEASE_S = 4.0
HEARTBEAT_S = 1.0
# Worker self-fencing: a worker stops an attempt LEASE_MARGIN_S before its lease runs out
# without a renewal; the node acts on the lease LEASE_MARGIN_S after it ran out.
LEASE_MARGIN_S = 1.0
# Shorter than the lease, as the configuration requires.
ACK_TIMEOUT_S = 3.0
KEEPALIVE_TIME_S = 1.0
KEEPALIVE_TIMEOUT_S = 1.0
# The reconciler's regular pass is left at its default (5 s, longer than the lease): an
# expired lease is acted on at its expiry plus the margin because the reconciler wakes
# then, not because it happens to pass often.
# A worker process is up and has a session within this (imports, topology, Hello).
WORKER_READY_S = 30.0
# The scheduler settles a cooperative stop (cancel, timeout) within this of the handler's
# reaction: a group commit plus a receipt, with margin for a 2-core machine under load.
SETTLE_BOUND_S = 3.0
# The reconciler acts on an expired lease at lease_expires_at + margin, within its pass
# latency (a scan and a repair: milliseconds; measured up to 0.12 s on this 2-core
# machine under the suite's load): this bounds that latency.
REPAIR_LATENCY_BOUND_S = 0.5
# The last heartbeat before a fault was at most an interval (plus a commit) before it.
EXPIRY_BOUND_S = LEASE_S + LEASE_MARGIN_S + REPAIR_LATENCY_BOUND_S

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

    def example_worker(self, name: str) -> ManagedProcess:
        """A worker running the shipped examples/fenced_side_effect.py (queue "default")."""
        return self.group.start_worker(
            name,
            "fenced_side_effect:worker",
            [self.node.address],
            pythonpath=EXAMPLES_DIR,
            FENCED_EXAMPLE_DSN=self.dsn,
            CHRONOSHARD_WORKER_ID=name,
            CHRONOSHARD_API_KEY=self.api_key,
        )

    async def metric(self, name: str) -> float:
        return await asyncio.to_thread(self.node.metric, name) or 0.0

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


def fenced_example() -> ModuleType:
    """examples/fenced_side_effect.py, loaded by path (examples/ is not a package)."""
    name = "fenced_side_effect_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES_DIR / "fenced_side_effect.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def cluster(
    db_dsn: str, etcd: EtcdProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LeaseCluster]:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)
        fenced_example().create_tables(conn)
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
            "CHRONOSHARD_WORKERS__LEASE_MARGIN_S": str(LEASE_MARGIN_S),
            "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": str(ACK_TIMEOUT_S),
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
# A released task is back on the wheel at once: its next intent follows within this
# (far below the lease, which a lost task would wait for).
REDISPATCH_BOUND_S = 1.0


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
    # Dispatched again as soon as it was released, not when a lease ran out.
    released_at, redispatched_at = done.attempts[0].finished_at, done.attempts[1].entered_at
    assert released_at is not None and redispatched_at is not None
    gap_s = (redispatched_at - released_at).total_seconds()
    assert gap_s <= REDISPATCH_BOUND_S, f"released to redispatched: {gap_s:.2f} s"

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

        async def running() -> bool:
            # The handler has started, and the worker's ack (sent once a run has gone
            # on for ACK_DELAY_S) has moved the task to RUNNING.
            started = _events(await _ledger(cluster.dsn, [task_id]), "started")
            return bool(started) and (await client.get(task_id)).status.value == "RUNNING"

        await eventually(running, timeout_s=WORKER_READY_S, what="cancellable handler running")
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


# ---- fencing on every message -------------------------------------------------------------


async def test_every_message_with_a_stale_token_is_refused_and_changes_nothing(
    cluster: LeaseCluster, client: Client
) -> None:
    """Ack, heartbeat (with a checkpoint), complete, fail and release, each with a token
    that is not the running attempt's, on the stream and through the unary RPCs: all are
    refused with STALE_FENCING_TOKEN (FAILED_PRECONDITION for the unary calls) and the
    task row does not change; the real worker then ends its attempt normally."""
    queue = "fencing"
    process = cluster.lease_worker("fencing-w", queue)
    try:
        await wait_connected(process)
        submitted = await client.submit(
            "lease.cancellable", {"wait_s": 60}, queue=queue, strict_timing=True
        )
        task_id = submitted.task.id

        async def running() -> Task | None:
            task = await client.get(task_id)
            return task if task.status.value == "RUNNING" else None

        before = await eventually(running, timeout_s=WORKER_READY_S, what="task RUNNING")
        assert before.fencing_token == 1
        ref = common_pb2.TaskRef(id=task_id)
        assert before.scheduled_at is not None
        ref.scheduled_at.FromDatetime(before.scheduled_at)
        metadata = bearer(cluster.api_key)
        async with grpc.aio.insecure_channel(cluster.node.address) as channel:
            stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
            for stale in (0, 2):
                unary = [
                    stub.Complete(
                        worker_service_pb2.CompleteRequest(
                            worker_id="intruder",
                            complete=worker_service_pb2.Complete(
                                task=ref, fencing_token=stale, result_json=b'"stolen"'
                            ),
                        ),
                        metadata=metadata,
                        timeout=5,
                    ),
                    stub.Fail(
                        worker_service_pb2.FailRequest(
                            worker_id="intruder",
                            fail=worker_service_pb2.Fail(
                                task=ref, fencing_token=stale, error_message="no"
                            ),
                        ),
                        metadata=metadata,
                        timeout=5,
                    ),
                    stub.Release(
                        worker_service_pb2.ReleaseRequest(
                            worker_id="intruder",
                            release=worker_service_pb2.Release(
                                task=ref,
                                fencing_token=stale,
                                reason=worker_service_pb2.RELEASE_REASON_DRAINING,
                                checkpoint=b'{"next": 999}',
                            ),
                        ),
                        metadata=metadata,
                        timeout=5,
                    ),
                ]
                for call in unary:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await call
                    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                    error = error_info_from_metadata(info.value.trailing_metadata())
                    assert error is not None and error.reason == "STALE_FENCING_TOKEN"
            receipts, reply = await _stale_on_the_stream(channel, metadata, ref, stale_token=2)
        assert {r.kind: r.error.reason for r in receipts} == {
            worker_service_pb2.SETTLEMENT_KIND_ACK: "STALE_FENCING_TOKEN",
            worker_service_pb2.SETTLEMENT_KIND_COMPLETE: "STALE_FENCING_TOKEN",
            worker_service_pb2.SETTLEMENT_KIND_FAIL: "STALE_FENCING_TOKEN",
            worker_service_pb2.SETTLEMENT_KIND_RELEASE: "STALE_FENCING_TOKEN",
        }
        assert [(r.task.id, r.fencing_token) for r in reply.revoked] == [(task_id, 2)]

        after = await client.get(task_id, attempts=True)
        assert (after.status.value, after.fencing_token, after.worker_id) == (
            "RUNNING",
            1,
            "fencing-w",
        )
        assert after.checkpoint == before.checkpoint and after.result is None
        assert [(a.attempt, a.state.value) for a in after.attempts] == [(1, "RUNNING")]
        # The real attempt is untouched: it still ends the normal way.
        await client.cancel(task_id)
        done = await eventually(
            lambda: _finished(client, task_id), timeout_s=30, what="task cancelled"
        )
    except BaseException:
        print(cluster.group.logs())
        raise
    finally:
        process.kill()
    assert done.status.value == "CANCELLED"
    assert [(a.attempt, a.state.value) for a in done.attempts] == [(1, "CANCELLED")]


async def _stale_on_the_stream(
    channel: grpc.aio.Channel,
    metadata: Metadata,
    ref: common_pb2.TaskRef,
    stale_token: int,
) -> tuple[list[worker_service_pb2.Receipt], worker_service_pb2.HeartbeatReply]:
    """A raw worker session sends every message about ``ref`` with ``stale_token``; the
    receipts and the heartbeat reply it gets back."""
    w = worker_service_pb2
    messages = [
        hello("intruder", ["none"], slots=1),
        w.WorkerMessage(ack=w.Ack(task=ref, fencing_token=stale_token)),
        w.WorkerMessage(
            heartbeat=w.Heartbeat(
                running=[w.RunningTask(task=ref, fencing_token=stale_token, checkpoint=b'{"x": 1}')]
            )
        ),
        w.WorkerMessage(complete=w.Complete(task=ref, fencing_token=stale_token)),
        w.WorkerMessage(fail=w.Fail(task=ref, fencing_token=stale_token, error_message="x")),
        w.WorkerMessage(
            release=w.Release(task=ref, fencing_token=stale_token, reason=w.RELEASE_REASON_DRAINING)
        ),
    ]
    receipts: list[worker_service_pb2.Receipt] = []
    reply: worker_service_pb2.HeartbeatReply | None = None
    async with RawWorker.connect(channel, metadata, *messages) as worker, asyncio.timeout(15):
        async for message in worker:
            kind = message.WhichOneof("message")
            if kind == "receipt":
                receipts.append(message.receipt)
            elif kind == "heartbeat_reply":
                reply = message.heartbeat_reply
            if len(receipts) == 4 and reply is not None:
                break
    assert reply is not None
    return receipts, reply


# ---- the zombie worker -------------------------------------------------------------------

ZOMBIE_WORK_S = 1.0


async def _side_effect(dsn: str, task_id: str) -> tuple[int, str] | None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT fencing_token, worker_id FROM example_side_effects WHERE task_id = %s",
            (uuid.UUID(task_id),),
        )
        row = await cur.fetchone()
    return None if row is None else (row[0], row[1])


def _logged(process: ManagedProcess, *needles: str) -> bool:
    return process.logged(*needles)


async def _wait_logged(process: ManagedProcess, what: str, *needles: str) -> None:
    await eventually(
        lambda: _logged(process, *needles), timeout_s=WORKER_READY_S, what=what, interval_s=0.1
    )


async def _history(client: Client, task_id: str) -> list[tuple[int, str, str | None]]:
    task = await client.get(task_id, attempts=True)
    return [(a.attempt, a.state.value, a.worker_id) for a in task.attempts]


def _expired_lease(attempt: Any) -> datetime:
    return lease_expired_at(attempt.error)


def _after(lease: datetime, at: datetime | None) -> float:
    """Seconds from a lease's expiry to ``at`` (the database's clock, like the lease)."""
    assert at is not None
    return (at - lease).total_seconds()


async def test_a_paused_worker_fences_itself_and_an_idempotent_task_runs_once_elsewhere(
    cluster: LeaseCluster, client: Client
) -> None:
    """Worker A is stopped (SIGSTOP) inside a blocking handler, past its lease; the task,
    being idempotent, goes to worker B with the next token only lease + margin after A's
    lease ran out, and its effect commits there. When A resumes, it has fenced itself: the
    handler's write is refused by the commit helper (``LeaseLost``), A settles nothing and
    heartbeats nothing for it; the effect stays B's, once."""
    a = cluster.example_worker("zombie-a")
    b: ManagedProcess | None = None
    try:
        await wait_connected(a)
        submitted = await client.submit(
            "example.fenced_write",
            {"work_s": ZOMBIE_WORK_S, "amount": 7, "blocking": True},
            strict_timing=True,
            idempotent=True,
            max_retries=0,
        )
        task_id = submitted.task.id
        await _wait_logged(a, "A started the handler", f"task_id={task_id}", "work_started")
        a.pause()
        stopped_at = time.monotonic()
        b = cluster.example_worker("zombie-b")
        await wait_connected(b)
        done = await eventually(
            lambda: _finished(client, task_id),
            timeout_s=EXPIRY_BOUND_S + WORKER_READY_S,
            what="the task completed by B",
        )
        assert time.monotonic() - stopped_at > LEASE_S, "A was not stopped past its lease"
        a.resume()
        await _wait_logged(a, "A fenced itself", f"task_id={task_id}", "event=lease_lost")
        await _wait_logged(
            a, "A's write refused by the helper", f"task_id={task_id}", "side_effect_refused"
        )
    except BaseException:
        print(cluster.group.logs())
        raise
    finally:
        if a.alive():
            a.resume()
        a.kill()
        if b is not None:
            b.kill()

    assert (done.status.value, done.fencing_token) == ("COMPLETED", 2)
    assert done.result == {"written": True, "token": 2}
    attempts = done.attempts
    assert [(x.attempt, x.state.value, x.worker_id) for x in attempts] == [
        (1, "ABANDONED", "zombie-a"),
        (2, "SUCCEEDED", "zombie-b"),
    ], "A settled nothing after it fenced itself (no refused completion: FENCED)"
    # Re-dispatched no earlier than lease + margin, and at once then.
    after_s = _after(_expired_lease(attempts[0]), attempts[1].entered_at)
    assert LEASE_MARGIN_S <= after_s <= LEASE_MARGIN_S + REPAIR_LATENCY_BOUND_S, after_s
    # The side-effect table holds B's write only, and the effect row says B did it.
    assert await _side_effect(cluster.dsn, task_id) == (2, "zombie-b")
    assert not _logged(a, "COMPLETE", f"task_id={task_id}", "event=zombie")


async def test_a_paused_worker_s_non_idempotent_task_is_held_outcome_unknown_until_resolved(
    cluster: LeaseCluster, client: Client
) -> None:
    """Same stop past the lease, but the task is not idempotent: running it again could
    do its effect twice, calling it failed could lose it. lease + margin after A's lease
    ran out it becomes OUTCOME_UNKNOWN (not given to B), counted by the gauge and the
    counter. A, resumed, fences itself and writes nothing; the task stays held. An
    operator's ResolveTask RETRY runs it on B under a new token: the effect commits once."""
    a = cluster.example_worker("unknown-a")
    b: ManagedProcess | None = None
    unknown_before = await cluster.metric("chronoshard_reconciler_outcome_unknown_total")
    try:
        await wait_connected(a)
        submitted = await client.submit(
            "example.fenced_write",
            {"work_s": ZOMBIE_WORK_S, "amount": 9, "blocking": True},
            strict_timing=True,
            idempotent=False,
            max_retries=0,
        )
        task_id = submitted.task.id
        await _wait_logged(a, "A started the handler", f"task_id={task_id}", "work_started")
        a.pause()
        b = cluster.example_worker("unknown-b")
        await wait_connected(b)

        async def outcome_unknown() -> Task | None:
            task = await client.get(task_id, attempts=True)
            return task if task.status.value == "OUTCOME_UNKNOWN" else None

        held = await eventually(
            outcome_unknown, timeout_s=EXPIRY_BOUND_S + WORKER_READY_S, what="outcome unknown"
        )
        assert await cluster.metric("chronoshard_outcome_unknown_tasks") >= 1
        assert (
            await cluster.metric("chronoshard_reconciler_outcome_unknown_total")
            >= unknown_before + 1
        )
        a.resume()
        await _wait_logged(a, "A fenced itself", f"task_id={task_id}", "event=lease_lost")
        await _wait_logged(
            a, "A's write refused by the helper", f"task_id={task_id}", "side_effect_refused"
        )
        # A settled nothing: still held, nothing written anywhere.
        still = await client.get(task_id, attempts=True)
        assert still.status.value == "OUTCOME_UNKNOWN"
        assert await _side_effect(cluster.dsn, task_id) is None
        assert b is not None and not _logged(b, f"task_id={task_id}")

        resolved = await client.resolve(task_id, Resolution.RETRY, reason="no payment row")
        assert resolved.status.value == "SCHEDULED"
        # A repeat (its answer lost) is answered with the task as it is, not applied twice
        # (the history below has exactly one more attempt).
        again = await client.resolve(task_id, "RETRY")
        assert again.status.value != "OUTCOME_UNKNOWN"
        done = await eventually(
            lambda: _finished(client, task_id), timeout_s=30, what="the retried task completed"
        )

        async def gauge_cleared() -> bool:
            return await cluster.metric("chronoshard_outcome_unknown_tasks") == 0

        await eventually(gauge_cleared, timeout_s=10, what="the gauge back to 0")
        with pytest.raises(FailedPreconditionError) as refused:
            await client.resolve(task_id, Resolution.MARK_FAILED)
        assert refused.value.reason == "NOTHING_TO_RESOLVE"
    except BaseException:
        print(cluster.group.logs())
        raise
    finally:
        if a.alive():
            a.resume()
        a.kill()
        if b is not None:
            b.kill()

    [unknown_attempt] = held.attempts
    assert (unknown_attempt.state.value, unknown_attempt.worker_id) == (
        "OUTCOME_UNKNOWN",
        "unknown-a",
    )
    after_s = _after(_expired_lease(unknown_attempt), unknown_attempt.finished_at)
    assert LEASE_MARGIN_S <= after_s <= LEASE_MARGIN_S + REPAIR_LATENCY_BOUND_S, after_s
    assert (done.status.value, done.fencing_token) == ("COMPLETED", 2)
    history = [(x.attempt, x.state.value, x.worker_id, x.resolution) for x in done.attempts]
    assert history == [
        (1, "OUTCOME_UNKNOWN", "unknown-a", Resolution.RETRY),
        (2, "SUCCEEDED", "unknown-b", None),
    ]
    assert "no payment row" in (done.attempts[0].error or "")
    assert await _side_effect(cluster.dsn, task_id) == (2, "unknown-b")


# ---- a worker crash ----------------------------------------------------------------------

CRASH_TASKS = 50


async def test_sigkill_with_fifty_running_tasks_each_runs_again_once_after_lease_expiry(
    cluster: LeaseCluster, client: Client
) -> None:
    queue = "crash"
    a = cluster.lease_worker("crash-a", queue, LEASE_SLOTS=str(CRASH_TASKS), LEASE_HOLD_S="600")
    b: ManagedProcess | None = None
    try:
        await wait_connected(a)
        results = await client.submit_batch(
            [
                TaskSpec(
                    type="lease.hold",
                    payload={"i": i},
                    queue=queue,
                    strict_timing=True,
                    idempotent=True,
                    max_retries=0,
                )
                for i in range(CRASH_TASKS)
            ]
        )
        task_ids = [r.task.id for r in results if isinstance(r, SubmitResult)]
        assert len(task_ids) == CRASH_TASKS

        async def all_started() -> bool:
            rows = await _ledger(cluster.dsn, task_ids)
            return len({r["task_id"] for r in _events(rows, "started")}) == CRASH_TASKS

        await eventually(all_started, timeout_s=WORKER_READY_S, what="50 handlers running on A")
        # B is up before the kill (A holds every task), so the re-dispatch time is the
        # reconciler's, not B's start-up.
        b = cluster.lease_worker("crash-b", queue, LEASE_SLOTS=str(CRASH_TASKS))
        await wait_connected(b)
        a.kill()
        killed_at = datetime.now(UTC)

        async def all_finished() -> list[Task] | None:
            tasks = [await client.get(t, attempts=True) for t in task_ids]
            return tasks if all(t.status.is_terminal for t in tasks) else None

        tasks = await eventually(
            all_finished, timeout_s=EXPIRY_BOUND_S + WORKER_READY_S, what="all 50 finished"
        )
    except BaseException:
        print(cluster.group.logs())
        raise
    finally:
        a.kill()
        if b is not None:
            b.kill()

    after_kill: list[float] = []
    after_expiry: list[float] = []
    for task in tasks:
        assert task.status.value == "COMPLETED", task
        assert task.retry_count == 0
        history = [(x.attempt, x.state.value, x.worker_id) for x in task.attempts]
        assert history == [(1, "ABANDONED", "crash-a"), (2, "SUCCEEDED", "crash-b")], history
        after_kill.append(_after(killed_at, task.attempts[1].entered_at))
        after_expiry.append(_after(_expired_lease(task.attempts[0]), task.attempts[1].entered_at))
    # The bound (docs/failure-model.md): re-dispatched lease + margin after the lease ran
    # out, within the reconciler's latency, and the lease runs from the last heartbeat,
    # at most one interval before the kill: lease - interval + margin .. lease + margin
    # after the kill.
    print(
        f"SIGKILL re-dispatch of {len(tasks)} tasks: after the kill "
        f"{min(after_kill):.2f}/{statistics.median(after_kill):.2f}/{max(after_kill):.2f} s, "
        f"after the lease expired {min(after_expiry):.3f}/{statistics.median(after_expiry):.3f}"
        f"/{max(after_expiry):.3f} s (min/p50/max)"
    )
    assert min(after_expiry) >= LEASE_MARGIN_S, after_expiry
    assert max(after_expiry) <= LEASE_MARGIN_S + REPAIR_LATENCY_BOUND_S, after_expiry
    lower_s = LEASE_S - HEARTBEAT_S + LEASE_MARGIN_S - 0.5
    assert lower_s <= min(after_kill) and max(after_kill) <= EXPIRY_BOUND_S, after_kill

    rows = await _ledger(cluster.dsn, task_ids)
    committed = _events(rows, "committed")
    # Exactly once: one committed effect per task, all by the second attempt on B; the
    # killed attempts started and never committed.
    assert sorted(r["task_id"] for r in committed) == sorted(task_ids)
    assert {(r["attempt"], r["worker_id"]) for r in committed} == {(2, "crash-b")}
    started_on_a = [r for r in _events(rows, "started") if r["worker_id"] == "crash-a"]
    assert len(started_on_a) == CRASH_TASKS
    assert not [r for r in committed if r["worker_id"] == "crash-a"]

"""Crash points between intent and acknowledgement (docs/architecture.md#d6): a real scheduler
process dies at each named point (``CHRONOSHARD_CRASH_AT``, test builds only), the scheduler is
restarted (same node id, same address) or another node takes its shards over, and every task still
ends COMPLETED exactly once.

"Exactly once", read off the database and the handlers' effects ledger:

* every task is COMPLETED with one SUCCEEDED attempt, and the winning token produced
  exactly one effect (harness.history I1/I2);
* an attempt given up as ABANDONED has no effect at all: a dispatch that never reached a
  worker never ran;
* an effect under any other token exists only for an idempotent task whose attempt was
  FENCED (it ran, and its completion was refused); a non-idempotent task ran once.

Timing: leases, ack timeout and etcd TTL are scaled down so a run takes seconds. The ack
timeout stays above the worker SDK's longest settlement resend interval (5 s), the
margin the reconciler's "the worker's session never got it" rule relies on. The task
lease must outlast what that rule needs after a restart: the node back up, the worker's
session back (its reconnect backoff reaches 5 s during the outage) and live for the ack
timeout. Before that the restarted node cannot know an unsent intent was unsent, and a
lease that ran out first leaves a non-idempotent task OUTCOME_UNKNOWN, as it must (with
an 8 s lease, a worker back 5 s after the crash did that to 12 of 24 tasks in CI).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from fixtures.waiting import eventually
from harness.history import EFFECTS_DDL, check
from harness.processes import (
    READY_TIMEOUT_S,
    ManagedProcess,
    ProcessGroup,
    SchedulerHandle,
    wait_serving,
)

from chronoshard import Client, SubmitResult, TaskSpec
from chronoshard.scheduler.dispatch.faults import CRASH_EXIT_CODE
from chronoshard.scheduler.store.tenants import create_tenant
from chronoshard.services import EtcdProcess

E2E_DIR = Path(__file__).resolve().parent
SHARDS = 8
TASKS = 24
SCHEDULER_ENV = {
    "CHRONOSHARD_TESTING": "1",
    "CHRONOSHARD_ETCD__LEASE_TTL_S": "3",
    "CHRONOSHARD_ETCD__SELF_FENCE_MARGIN_S": "1",
    "CHRONOSHARD_GRPC__KEEPALIVE_TIME_S": "1",
    "CHRONOSHARD_GRPC__KEEPALIVE_TIMEOUT_S": "1",
    "CHRONOSHARD_WORKERS__HEARTBEAT_INTERVAL_S": "1",
    # Ack timeout (6) + worst session reconnect (5) + restart and margin: see the docstring.
    "CHRONOSHARD_WORKERS__TASK_LEASE_S": "14",
    "CHRONOSHARD_WORKERS__ACK_TIMEOUT_S": "6",
    "CHRONOSHARD_WORKERS__LEASE_MARGIN_S": "1",
    "CHRONOSHARD_RECONCILE__INTERVAL_S": "0.5",
}


@dataclass
class Setup:
    group: ProcessGroup
    dsn: str
    api_key: str


@pytest.fixture
def setup(fresh_db_dsn: str, etcd: EtcdProcess, tmp_path: Path) -> Iterator[Setup]:
    with psycopg.connect(fresh_db_dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
    api_key = create_tenant(fresh_db_dsn, f"crash-{uuid.uuid4().hex[:8]}").api_key
    group = ProcessGroup(
        log_dir=tmp_path,
        dsn=fresh_db_dsn,
        etcd_endpoint=etcd.endpoint,
        cluster=f"crash-{uuid.uuid4().hex[:8]}",
        shard_count=SHARDS,
        scheduler_env=SCHEDULER_ENV,
    )
    try:
        yield Setup(group, fresh_db_dsn, api_key)
    finally:
        group.close()


def _restart(group: ProcessGroup, dead: SchedulerHandle) -> SchedulerHandle:
    """The same node (id, address, metrics port) started again, crash point disarmed."""
    env = {k: v for k, v in dead.process.env.items() if k != "CHRONOSHARD_CRASH_AT"}
    process = ManagedProcess(
        name=f"{dead.process.name}-again",
        argv=dead.process.argv,
        env=env,
        log_path=group.log_dir / f"{dead.process.name}-again.log",
    )
    process.start()
    handle = SchedulerHandle(process, dead.address, dead.metrics_address)
    group.schedulers.append(handle)
    wait_serving(dead.address, READY_TIMEOUT_S, process)
    return handle


def _owned_by(dsn: str) -> dict[int, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT shard, node_id FROM shard_owners").fetchall())


def _completed(dsn: str, ids: list[uuid.UUID]) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM tasks WHERE id = ANY(%s) AND status = 'COMPLETED'", (ids,)
        ).fetchone()
    return row is not None and row[0] == len(ids)


def _unfinished(dsn: str, ids: list[uuid.UUID]) -> str:
    """The tasks not COMPLETED with their attempts, one line each (a failure's last words)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT t.id, t.status, t.fencing_token, t.shard, t.updated_at,"
            " (SELECT string_agg(a.fencing_token || ':' || a.state, ' ' ORDER BY a.fencing_token)"
            "  FROM task_attempts a WHERE a.task_id = t.id)"
            " FROM tasks t WHERE t.id = ANY(%s) AND t.status <> 'COMPLETED'",
            (ids,),
        ).fetchall()
    lines = [f"{len(rows)} of {len(ids)} not COMPLETED (id status token shard updated attempts):"]
    lines += [" ".join(str(v) for v in row) for row in rows]
    return "\n".join(lines)


def _assert_exactly_once(dsn: str, ids: list[uuid.UUID]) -> dict[str, int]:
    """The module docstring's three rules; returns the attempt states seen."""
    violations = check(dsn, ids, job_ledger=False)
    assert not violations, violations.summary()
    with psycopg.connect(dsn) as conn:
        idempotent = dict(
            conn.execute("SELECT id, idempotent FROM tasks WHERE id = ANY(%s)", (ids,)).fetchall()
        )
        attempts = {
            (task_id, token): state
            for task_id, token, state in conn.execute(
                "SELECT task_id, fencing_token, state FROM task_attempts WHERE task_id = ANY(%s)",
                (ids,),
            ).fetchall()
        }
        effects = conn.execute(
            "SELECT e.task_id, e.token FROM effects e JOIN tasks t ON t.id = e.task_id"
            " WHERE e.task_id = ANY(%s) AND e.token <> t.fencing_token",
            (ids,),
        ).fetchall()
    for task_id, token in effects:
        state = attempts.get((task_id, token))
        assert state != "ABANDONED", f"{task_id}: an abandoned attempt ({token}) ran"
        assert idempotent[task_id] and state == "FENCED", (
            f"{task_id} (idempotent={idempotent[task_id]}) ran under superseded token "
            f"{token} (attempt {state})"
        )
    seen: dict[str, int] = {}
    for state in attempts.values():
        seen[state] = seen.get(state, 0) + 1
    return seen


async def _run(setup: Setup, crash_at: str, *, takeover: bool) -> dict[str, int]:
    group = setup.group
    doomed = group.start_scheduler("node-1", CHRONOSHARD_CRASH_AT=crash_at)
    survivor = group.start_scheduler("node-2") if takeover else None
    targets = [doomed.address] + ([survivor.address] if survivor else [])
    group.start_worker(
        "worker-1",
        "e2e_workers:worker",
        targets,
        pythonpath=E2E_DIR,
        E2E_DSN=setup.dsn,
        CHRONOSHARD_API_KEY=setup.api_key,
    )
    nodes = {"node-1", "node-2"} if takeover else {"node-1"}
    await eventually(
        lambda: len(_owned_by(setup.dsn)) == SHARDS and set(_owned_by(setup.dsn).values()) == nodes,
        timeout_s=30,
        what="the shards owned",
    )
    await eventually(
        lambda: (doomed.metric("chronoshard_worker_sessions") or 0) >= 1,
        timeout_s=30,
        what="the worker connected",
    )
    # All due at one instant: the doomed node's first dispatch round is one batch.
    at = datetime.now(UTC) + timedelta(seconds=2)
    specs = [
        TaskSpec(
            type="e2e.record", payload={"i": i}, at=at, strict_timing=True, idempotent=i % 2 == 0
        )
        for i in range(TASKS)
    ]
    async with Client(targets, api_key=setup.api_key) as client:
        results = await client.submit_batch(specs)
    ids = [uuid.UUID(r.task.id) for r in results if isinstance(r, SubmitResult)]
    assert len(ids) == TASKS

    await eventually(lambda: not doomed.process.alive(), timeout_s=30, what=f"crash at {crash_at}")
    assert doomed.process.proc is not None
    assert doomed.process.proc.returncode == CRASH_EXIT_CODE, doomed.process.log()
    assert f"crash_point={crash_at}" in doomed.process.log() or "crashing" in doomed.process.log()
    if not takeover:
        _restart(group, doomed)
    try:
        await eventually(lambda: _completed(setup.dsn, ids), timeout_s=60, what="all COMPLETED")
    except AssertionError:
        print(group.logs())
        print(_unfinished(setup.dsn, ids))
        raise
    states = _assert_exactly_once(setup.dsn, ids)
    print(f"{crash_at} (takeover={takeover}): attempt states {states}")
    return states


async def test_crash_after_intent_commit_before_send_then_restart(setup: Setup) -> None:
    states = await _run(setup, "after_intent", takeover=False)
    # The crashed round's intents were never sent: given up, then dispatched again.
    assert states.get("ABANDONED", 0) >= 1, states


async def test_crash_inside_a_batch_half_sent_then_restart(setup: Setup) -> None:
    states = await _run(setup, "inside_batch", takeover=False)
    assert states.get("ABANDONED", 0) >= 1, states


async def test_crash_after_send_before_ack_then_another_node_takes_over(setup: Setup) -> None:
    states = await _run(setup, "after_send", takeover=True)
    assert states.get("SUCCEEDED") == TASKS, states
